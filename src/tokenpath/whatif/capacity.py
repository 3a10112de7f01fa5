"""Capacity at an SLO: the highest request rate whose full simulation meets every target (latency
percentiles, e.g. ttft_p99 <= 2 s; continuity, e.g. qoe_p10 >= 0.9), found by bracketing and then
narrowing the bracket, as vLLM bench's goodput and Vidur's capacity search do; and which target binds
there, and which layer's time grows as the rate passes it.

Only the arrival rate and the number of requests move: the workload's lengths, the seed (so the same
arrival gaps, scaled) and a concurrency cap, if any, stay as the scenario has them. A point is accepted
only when it meets the SLO and the overload test (diagnose/overload.py) does not flag it, and the search
is repeated with more requests until its answer is stable (`search`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenpath.config.errors import UserError, quoted
from tokenpath.config.units import parse_duration_s
from tokenpath.sim.summary import LAYERS, PERCENTILES
from tokenpath.whatif.objective import metric_value
from tokenpath.whatif.run import Base, Outcome, simulate_many
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, MAX_RATE_PER_S

SCHEMA = "tokenpath.capacity/1"
METRICS = ("ttft", "ttfv", "tpot", "itl", "e2e")
STATS = ("mean", *PERCENTILES)
# The search stops when the bracket is narrower than this share of its lower end.
DEFAULT_TOLERANCE = 0.01
# Bracketing doubles or halves the rate at most this many times: 2^20 is a millionfold.
MAX_BRACKET_STEPS = 20
# The lowest rate searched sends a run's requests over at most half the longest span simulated: a Poisson
# run's last arrival lands past requests / rate by a few standard deviations at most.
ARRIVAL_SPAN_MARGIN = 2.0
# The first rate tried when the scenario sends everything at once.
_START_RATE_PER_S = 10.0
# A capacity is searched again with twice the requests until it moves by at most this share of the rate,
# at most MAX_DOUBLINGS times (16x the scenario's requests). On the default scenario at ttft_p99 = 1 s,
# tpot_p99 = 50 ms the answers at 2,000, 4,000 and 8,000 requests come within 4% of each other, and the
# 2,000-request answer alone is the highest.
DEFAULT_STABILITY = 0.02
MAX_DOUBLINGS = 4
# Searching again from the shorter run's answer, the bracket first steps by this factor (the answers of
# successive lengths differ by a few percent, so a doubling step would waste simulations).
REFINE_FACTOR = 1.05


# Continuity targets (continuity.py's summary block): QoE statistics are lower bounds (at least), from
# 0 to 1; stalls per request and the share of requests with a stall are upper bounds (at most).
QOE_STATS = ("mean", "p1", "p10", "p50")
STALL_TARGETS = {"stalls_per_request": "continuity.stalls_per_request",
                 "requests_with_stalls": "continuity.requests_with_stalls"}
_NAMES_TEXT = (f"METRIC_STAT=DURATION (at most) with METRIC one of {', '.join(METRICS)} and STAT one of "
               f"{', '.join(STATS)} (e.g. ttft_p99=2s); {', '.join(f'qoe_{stat}' for stat in QOE_STATS)}=NUMBER "
               "(at least, 0 to 1, e.g. qoe_p10=0.9); stalls_per_request=NUMBER or requests_with_stalls=SHARE "
               "(at most, e.g. requests_with_stalls=0.05)")


class NoCapacity(UserError):
    """A capacity search that found no rate to answer with, and the simulations it ran to find that."""

    def __init__(self, message: str, simulations: int) -> None:
        super().__init__(message)
        self.simulations = simulations


@dataclass(frozen=True)
class Target:
    """One SLO target: the summary metric it reads, its limit, and which side of the limit passes."""

    name: str            # as written in --slo, e.g. ttft_p99, qoe_p10
    path: str            # the summary's dotted path, e.g. latency_s.ttft.p99
    limit: float
    at_least: bool       # True: the run must reach the limit (QoE); False: stay at or under it
    unit: str | None     # "s" for durations, None for plain numbers

    def missed_by(self, value: float | None) -> float | None:
        """How far a run's value is from passing, as a ratio > 1 (inf when unknown or the limit is 0);
        None when it passes."""
        if value is None:
            return math.inf
        if self.at_least:
            return None if value >= self.limit else (self.limit / value if value > 0 else math.inf)
        return None if value <= self.limit else (value / self.limit if self.limit > 0 else math.inf)

    def document(self) -> dict[str, Any]:
        return {"target": self.limit, "unit": self.unit, "bound": "min" if self.at_least else "max"}


def valid_names() -> list[str]:
    return ([f"{metric}_{stat}" for metric in METRICS for stat in STATS] + [f"qoe_{stat}" for stat in QOE_STATS]
            + list(STALL_TARGETS))


def _number(value: str, name: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not low <= number <= high:
        raise UserError(f"--slo {name}: the target must be a number from {low:g} to {high:g}, got {quoted(value)}")
    return number


def parse_target(name: str, value: str) -> Target:
    """One `NAME=VALUE` of --slo as a Target."""
    if name not in valid_names():
        raise UserError(f"--slo: unknown metric {quoted(name)}; use {_NAMES_TEXT}")
    if name.startswith("qoe_"):
        stat = name.removeprefix("qoe_")
        limit = _number(value, name, 0.0, 1.0)
        if not limit > 0:
            raise UserError(f"--slo {name}: a QoE target of 0 is always met; give a number above 0, up to 1")
        return Target(name, f"continuity.qoe.{stat}", limit, True, None)
    if name in STALL_TARGETS:
        limit = _number(value, name, 0.0, 1.0 if name == "requests_with_stalls" else 1e9)
        return Target(name, STALL_TARGETS[name], limit, False, None)
    limit_s = parse_duration_s(value, f"--slo {name}")
    if not limit_s > 0:
        raise UserError(f"--slo {name}: the target must be a duration > 0, got {quoted(value)}")
    metric, _, stat = name.partition("_")
    return Target(name, f"latency_s.{metric}.{stat}", limit_s, False, "s")


def parse_slo(text: str) -> dict[str, Target]:
    """'ttft_p99=2s,qoe_p10=0.9' -> {'ttft_p99': Target(..., 2.0), 'qoe_p10': Target(..., 0.9)}; the
    CLIs join repeated --slo options with commas before it reads them."""
    slo: dict[str, Target] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, equals, value = item.partition("=")
        name = name.strip().lower()
        if not equals:
            raise UserError(f"--slo: {quoted(item)} needs NAME=VALUE, "
                            "e.g. --slo ttft_p99=2s,tpot_p99=100ms,qoe_p10=0.9")
        if name in slo:
            raise UserError(f"--slo: {name} is given twice; give each target once")
        slo[name] = parse_target(name, value.strip())
    if not slo:
        raise UserError("--slo: give at least one target, e.g. --slo ttft_p99=2s,tpot_p99=100ms")
    return slo


def scenario_slo(slo: Any) -> dict[str, Target]:
    """A scenario's [slo] (per-request targets) as p99 targets: e.g. ttft = 2 s -> ttft_p99 <= 2 s."""
    return {f"{key}_p99": Target(f"{key}_p99", f"latency_s.{key}.p99", getattr(slo, key), False, "s")
            for key in ("ttft", "ttfv", "tpot", "e2e") if getattr(slo, key) is not None}


def resolve_targets(slo_text: str | None, slo: Any, example: str) -> dict[str, Target]:
    """The targets of `--slo` (its text), else the scenario's [slo] as p99 targets; a one-line error
    when neither gives one (`example`: an --slo value to suggest)."""
    targets = parse_slo(slo_text) if slo_text is not None else scenario_slo(slo)
    if not targets:
        raise UserError(f"--slo: the scenario sets no [slo] target; give --slo, e.g. --slo {example}")
    return targets


def observed(summary: dict[str, Any], target: Target) -> float | None:
    value = metric_value(summary, target.path)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# Targets on the time between a request's tokens, which a run whose every request has one output token
# has no value of: none of its requests misses them (as the summary's goodput counts it: summary.misses_slo).
BETWEEN_TOKENS = ("latency_s.tpot.", "latency_s.itl.")


def misses(summary: dict[str, Any], slo: dict[str, Target]) -> dict[str, float]:
    """The targets a run misses, each with how far off (a ratio > 1); a run with failed requests misses all."""
    if summary["requests"]["failed"]:
        return {name: math.inf for name in slo}
    missed = {}
    for name, target in slo.items():
        value = observed(summary, target)
        if value is None and target.path.startswith(BETWEEN_TOKENS) and summary["requests"]["completed"]:
            continue
        ratio = target.missed_by(value)
        if ratio is not None:
            missed[name] = ratio
    return missed


@dataclass(frozen=True)
class Point:
    rate_per_s: float
    outcome: Outcome

    @property
    def summary(self) -> dict[str, Any]:
        return self.outcome.summary


def ok(point: Point, slo: dict[str, Target]) -> bool:
    """A point is accepted when it meets every target and the overload test does not flag it: a run that
    piles up work meets a latency target only because it ended before the queue grew."""
    return not misses(point.summary, slo) and not point.summary["load"]["overloaded"]


def search(base: Base, slo: dict[str, Target], tolerance: float = DEFAULT_TOLERANCE, workers: int | None = None,
           progress: Callable[[int], None] | None = None, stability: float = DEFAULT_STABILITY,
           max_doublings: int = MAX_DOUBLINGS) -> dict[str, Any]:
    """The capacity document: the highest rate found to meet `slo` and the lowest found to miss it
    (within `tolerance`), the binding target and the layer whose time grew most between them.

    A capacity is a steady-state answer. A finite run near capacity is still filling when it ends, so
    it meets a target that a longer run at the same rate misses. The search is repeated with twice the
    requests, each time from the last answer, until the answer moves by at most `stability` (a share of
    the rate) and the answer's own run was long enough to watch a steady part (its `load.settled` not
    null: diagnose/overload.py) and, where a target binds, had settled (true), or the requests have
    doubled `max_doublings` times; `convergence` lists each answer. Two short searches can agree while
    both runs are still filling (near capacity a batch settles over minutes), their latencies reading
    low; an answer the overload test bounds is judged by that test, which needs a run that long: sent
    over less than about one E2E (a high rate's runs of a few thousand requests), a run cannot tell a
    batch still filling from one growing without end, and its answers agree at rates the deployment
    cannot serve."""
    scenario = base.scenario()
    if scenario.workload.trace is not None:
        raise UserError("capacity: the scenario replays a trace (workload.trace), whose arrival times are fixed; "
                        "search a scenario with a generated workload, or vary workload.trace.time_scale in a sweep")
    workers = max(1, workers or 2)
    requests = scenario.workload.num_requests
    start = scenario.workload.arrival.rate
    start, factor = (_START_RATE_PER_S if math.isinf(start) else start), 2.0
    runs, history = 0, []
    for _ in range(max_doublings + 1):
        try:
            low, high, simulated = _bracketed(base, slo, requests, start, factor, tolerance, workers, progress)
        except NoCapacity as error:  # (counting the lengths searched before this one too)
            raise NoCapacity(str(error), runs + error.simulations) from None
        runs += simulated
        history.append({"num_requests": requests, "request_rate": low.rate_per_s, "above": high.rate_per_s,
                        "settled": low.summary["load"].get("settled")})
        if _converged(history, stability, bool(misses(high.summary, slo))):
            break
        requests, start, factor = 2 * requests, low.rate_per_s, REFINE_FACTOR
    missed = misses(high.summary, slo)
    if missed:
        name = max(missed, key=missed.get)
        binding = {"metric": name, **slo[name].document(), "observed_above": observed(high.summary, slo[name])}
    else:  # the point above met every target, and was refused as overloaded
        binding = {"metric": "overload", "signs": high.summary["load"]["signs"]}
    grew = {part: high.summary["attribution_s"][part] - low.summary["attribution_s"][part] for part in LAYERS} \
        if low.summary["attribution_s"] and high.summary["attribution_s"] else {}
    return {
        "schema": SCHEMA,
        "slo": {name: {**target.document(), "observed": observed(low.summary, target)} for name, target in slo.items()},
        "request_rate": low.rate_per_s,
        "num_requests": history[-1]["num_requests"],
        "binding": binding,
        "layer": max(grew, key=grew.get) if grew else None,
        "attribution_growth_s": grew,
        "tolerance": tolerance,
        "stability": stability,
        "converged": _converged(history, stability, bool(missed)),
        "convergence": history,
        "simulations": runs,
        "summary": low.summary,
        "above": {"request_rate": high.rate_per_s, "summary": high.summary},
    }


def _converged(history: list[dict[str, Any]], stability: float, target_binds: bool) -> bool:
    """The last answer moved by at most `stability` from the one before, and both their runs were long
    enough to watch (`settled` not None) and, where a target binds (not the overload test), had settled:
    an answer from a run still filling is no steady state to agree with (8B on 4 H100s, disaggregated
    2P:2D: 220.9 req/s at 1,000 requests, still filling, then 222.1 at 2,000 had been taken as stable,
    where 4,000 requests refuse it)."""
    def watched(entry: dict[str, Any]) -> bool:
        return entry["settled"] is not None and (entry["settled"] or not target_binds)
    return (len(history) > 1 and watched(history[-1]) and watched(history[-2])
            and abs(history[-1]["request_rate"] / history[-2]["request_rate"] - 1.0) <= stability)


def _bracketed(base: Base, slo: dict[str, Target], requests: int, start: float, factor: float, tolerance: float,
               workers: int, progress: Callable[[int], None] | None) -> tuple[Point, Point, int]:
    """(highest point accepted, lowest point refused, simulations) at `requests` requests: a bracket found
    by stepping from `start` by powers of `factor`, then narrowed to `tolerance`."""
    runs = 0

    def run(rates: list[float]) -> list[Point]:
        nonlocal runs
        outcomes = simulate_many(base, [{"workload.arrival.rate": rate, "workload.num_requests": requests}
                                        for rate in rates], workers, progress)
        runs += len(rates)
        for outcome in outcomes:
            if outcome.summary is None:
                raise UserError(f"capacity: {outcome.error}")
        return [Point(rate, outcome) for rate, outcome in zip(rates, outcomes)]

    # The rates a run of `requests` may take (workload/spec.py): up to the highest rate, and down to where
    # its arrivals would span more than a year (a Poisson run's last arrival can land past requests / rate).
    lowest, highest = ARRIVAL_SPAN_MARGIN * requests / MAX_ARRIVAL_SPAN_S, MAX_RATE_PER_S
    (first,) = run([start])
    low: Point | None = first if ok(first, slo) else None
    high: Point | None = None if ok(first, slo) else first
    for _ in range(MAX_BRACKET_STEPS):
        if low is not None and high is not None:
            break
        # Up by factor, factor^2, ... from the highest rate accepted, or down from the lowest refused,
        # `workers` rates a round; the first that crosses closes the bracket.
        if high is None:
            rates = [r for r in (low.rate_per_s * factor ** k for k in range(1, workers + 1)) if r <= highest]
        else:
            rates = [r for r in (high.rate_per_s / factor ** k for k in range(1, workers + 1)) if r >= lowest]
        if not rates:  # at the edge of the rates a run may take
            break
        for point in run(rates):
            if ok(point, slo):
                low = point
                if high is not None:
                    break
            else:
                high = point
                if low is not None:
                    break
    if low is None:
        alone = " with requests hours apart, so a request alone misses it" if high.rate_per_s <= 1 / 3600 else ""
        raise NoCapacity(f"capacity: the SLO is missed even at {high.rate_per_s:.3g} req/s "
                         f"({_refused_text(high, slo)}){alone}; loosen it or change the scenario", runs)
    if high is None:
        cap = base.scenario().workload.max_concurrency
        if cap is not None:
            raise NoCapacity(f"capacity: the SLO is met at every rate up to {low.rate_per_s:.3g} req/s: the "
                             f"scenario's workload.max_concurrency holds at most {cap} requests in flight, so a higher "
                             "rate adds no load and no rate binds; drop max_concurrency to search the rate (or vary "
                             "it in a sweep)", runs)
        raise NoCapacity(f"capacity: the SLO is met at every rate up to {low.rate_per_s:.3g} req/s, and no run is "
                         f"overloaded: within {requests:,} requests it never binds; tighten it or raise "
                         "--num-requests", runs)
    while high.rate_per_s - low.rate_per_s > tolerance * low.rate_per_s:
        step = (high.rate_per_s - low.rate_per_s) / (workers + 1)
        for point in run([low.rate_per_s + step * k for k in range(1, workers + 1)]):
            if ok(point, slo):
                low = point
            else:
                high = point
                break
    return low, high, runs


def _refused_text(point: Point, slo: dict[str, Target]) -> str:
    missed = misses(point.summary, slo)
    return _missed_text(missed) if missed else "overloaded: " + "; ".join(point.summary["load"]["signs"])


def _missed_text(missed: dict[str, float]) -> str:
    return ", ".join(f"{name} off its target by {ratio:.3g}x" if math.isfinite(ratio)
                     else f"{name} missed (no value, a stall against a zero target, or failed requests)"
                     for name, ratio in missed.items())
