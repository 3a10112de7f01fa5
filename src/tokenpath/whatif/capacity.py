"""Capacity at an SLO: the highest request rate whose full simulation meets every target (latency
percentiles, e.g. ttft_p99 <= 2 s), found by bracketing and then narrowing the bracket, as vLLM
bench's goodput and Vidur's capacity search do; and which target binds there, and which layer's time
grows as the rate passes it.

Only the arrival rate moves: the workload's lengths, the seed (so the same arrival gaps, scaled) and
a concurrency cap, if any, stay as the scenario has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from tokenpath.errors import UserError, quoted
from tokenpath.summary import LAYERS, PERCENTILES
from tokenpath.units import parse_duration_s
from tokenpath.whatif.run import Base, Outcome, simulate_many

SCHEMA = "tokenpath.capacity/1"
METRICS = ("ttft", "ttfv", "tpot", "itl", "e2e")
STATS = ("mean", *PERCENTILES)
# The search stops when the bracket is narrower than this share of its lower end.
DEFAULT_TOLERANCE = 0.01
# Bracketing doubles or halves the rate at most this many times: 2^20 is a millionfold.
MAX_BRACKET_STEPS = 20
# The first rate tried when the scenario sends everything at once.
_START_RATE_PER_S = 10.0


def valid_names() -> list[str]:
    return [f"{metric}_{stat}" for metric in METRICS for stat in STATS]


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p99=2s,tpot_p99=100ms' -> {'ttft_p99': 2.0, 'tpot_p99': 0.1}."""
    slo: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, equals, value = item.partition("=")
        name = name.strip().lower()
        if not equals:
            raise UserError(f"--slo: {quoted(item)} needs NAME=DURATION, e.g. --slo ttft_p99=2s,tpot_p99=100ms")
        if name not in valid_names():
            raise UserError(f"--slo: unknown metric {quoted(name)}; use METRIC_STAT with METRIC one of "
                            f"{', '.join(METRICS)} and STAT one of {', '.join(STATS)} (e.g. ttft_p99, e2e_mean)")
        limit_s = parse_duration_s(value.strip(), f"--slo {name}")
        if not limit_s > 0:
            raise UserError(f"--slo {name}: the target must be a duration > 0, got {quoted(value.strip())}")
        slo[name] = limit_s
    if not slo:
        raise UserError("--slo: give at least one target, e.g. --slo ttft_p99=2s,tpot_p99=100ms")
    return slo


def scenario_slo(slo: Any) -> dict[str, float]:
    """A scenario's [slo] (per-request targets) as p99 targets: e.g. ttft = 2 s -> ttft_p99 <= 2 s."""
    return {f"{key}_p99": getattr(slo, key) for key in ("ttft", "ttfv", "tpot", "e2e") if getattr(slo, key) is not None}


def observed_s(summary: dict[str, Any], name: str) -> float | None:
    metric, _, stat = name.partition("_")
    return summary["latency_s"][metric][stat]


def misses(summary: dict[str, Any], slo: dict[str, float]) -> dict[str, float]:
    """The targets a run misses, each with observed / target; a run with failed requests misses all."""
    if summary["requests"]["failed"]:
        return {name: math.inf for name in slo}
    missed = {}
    for name, limit_s in slo.items():
        value = observed_s(summary, name)
        if value is None or value > limit_s:
            missed[name] = math.inf if value is None else value / limit_s
    return missed


@dataclass(frozen=True)
class Point:
    rate_per_s: float
    outcome: Outcome

    @property
    def summary(self) -> dict[str, Any]:
        return self.outcome.summary


def search(base: Base, slo: dict[str, float], tolerance: float = DEFAULT_TOLERANCE, workers: int | None = None,
           progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The capacity document: the highest rate found to meet `slo` and the lowest found to miss it
    (within `tolerance`), the binding target and the layer whose time grew most between them."""
    scenario = base.scenario()
    if scenario.workload.trace is not None:
        raise UserError("capacity: the scenario replays a trace (workload.trace), whose arrival times are fixed; "
                        "search a scenario with a generated workload, or vary workload.trace.time_scale in a sweep")
    workers = max(1, workers or 2)
    runs = 0

    def run(rates: list[float]) -> list[Point]:
        nonlocal runs
        outcomes = simulate_many(base, [{"workload.arrival.rate": rate} for rate in rates], workers, progress)
        runs += len(rates)
        for outcome in outcomes:
            if outcome.summary is None:
                raise UserError(f"capacity: {outcome.error}")
        return [Point(rate, outcome) for rate, outcome in zip(rates, outcomes)]

    def ok(point: Point) -> bool:
        return not misses(point.summary, slo)

    start = scenario.workload.arrival.rate
    start = _START_RATE_PER_S if math.isinf(start) else start
    (first,) = run([start])
    low: Point | None = first if ok(first) else None
    high: Point | None = None if ok(first) else first
    for _ in range(MAX_BRACKET_STEPS):
        if low is not None and high is not None:
            break
        # Up by 2x, 4x, ... from the highest rate that met it, or down by halves from the lowest that
        # missed it, `workers` rates a round; the first that crosses closes the bracket.
        if high is None:
            for point in run([low.rate_per_s * 2.0 ** k for k in range(1, workers + 1)]):
                if not ok(point):
                    high = point
                    break
                low = point
        else:
            for point in run([high.rate_per_s * 0.5 ** k for k in range(1, workers + 1)]):
                if ok(point):
                    low = point
                    break
                high = point
    if low is None:
        raise UserError(f"capacity: the SLO is missed even at {high.rate_per_s:.3g} req/s "
                        f"({_missed_text(misses(high.summary, slo))}); loosen it or change the scenario")
    if high is None:
        raise UserError(f"capacity: the SLO is met at every rate up to {low.rate_per_s:.3g} req/s: within "
                        f"{scenario.workload.num_requests:,} requests it never binds; tighten it or raise "
                        "--num-requests")
    while high.rate_per_s - low.rate_per_s > tolerance * low.rate_per_s:
        step = (high.rate_per_s - low.rate_per_s) / (workers + 1)
        points = run([low.rate_per_s + step * k for k in range(1, workers + 1)])
        for point in points:
            if ok(point):
                low = point
            else:
                high = point
                break
    missed = misses(high.summary, slo)
    binding = max(missed, key=missed.get)
    grew = {part: high.summary["attribution_s"][part] - low.summary["attribution_s"][part] for part in LAYERS} \
        if low.summary["attribution_s"] and high.summary["attribution_s"] else {}
    return {
        "schema": SCHEMA,
        "slo": {name: {"target_s": limit_s, "observed_s": observed_s(low.summary, name)} for name, limit_s in slo.items()},
        "request_rate": low.rate_per_s,
        "binding": {"metric": binding, "target_s": slo[binding], "observed_above_s": observed_s(high.summary, binding)},
        "layer": max(grew, key=grew.get) if grew else None,
        "attribution_growth_s": grew,
        "tolerance": tolerance,
        "simulations": runs,
        "summary": low.summary,
        "above": {"request_rate": high.rate_per_s, "summary": high.summary},
    }


def _missed_text(missed: dict[str, float]) -> str:
    return ", ".join(f"{name} {ratio:.3g}x its target" if math.isfinite(ratio) else f"{name} unknown (requests failed)"
                     for name, ratio in missed.items())
