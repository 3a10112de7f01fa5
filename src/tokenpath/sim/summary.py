"""The metrics of a run, in the one schema shared by simulate and bench (docs/design.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config.errors import UserError, check_version, quoted
from tokenpath.sim import continuity
from tokenpath.sim.run import Run

SCHEMA = "tokenpath.summary/1"
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}
LAYERS = ("queue", "compute", "traffic", "delivery")
# The fifth layer, only in runs of a scenario with an [application] table (sim/application.py).
APPLICATION = "application"
# The parts of delivery in a simulated run (sim/served.delivery_detail): the client's network both ways,
# waiting for the front end's processes, their work, and the engine's host time.
DELIVERY_DETAIL = ("frontend_queue", "frontend_work", "network", "engine_host")


def stats_s(values_ns: np.ndarray) -> dict[str, float | None]:
    """Mean and percentiles of nanosecond samples, in seconds; None (unknown) for an empty sample,
    e.g. the latencies of a run where every request failed."""
    if len(values_ns) == 0:
        return {"mean": None, **{key: None for key in PERCENTILES}}
    seconds = np.asarray(values_ns, dtype=np.float64) / 1e9
    points = np.percentile(seconds, list(PERCENTILES.values()))
    return {"mean": float(seconds.mean()), **{key: float(v) for key, v in zip(PERCENTILES, points)}}


class LogHistogram:
    """Positive nanosecond samples counted in log-spaced bins 0.1% wide, for runs too large to keep
    every sample: the mean is exact, percentiles are within 0.1%."""

    RATIO = 1.001
    BINS = 30_000  # 1 ns to beyond 10^13 ns

    def __init__(self) -> None:
        self.counts = np.zeros(self.BINS, np.int64)
        self.total_ns = 0

    def add(self, values_ns: np.ndarray) -> None:
        values = np.asarray(values_ns)
        values = values[values > 0]
        bins = np.minimum(np.log(values) / np.log(self.RATIO), self.BINS - 1).astype(np.int64)
        self.counts += np.bincount(bins, minlength=self.BINS)
        self.total_ns += int(values.sum())

    @classmethod
    def merged(cls, histograms: Iterable[LogHistogram]) -> LogHistogram:
        """One histogram holding the samples of all of `histograms`."""
        merged = cls()
        for histogram in histograms:
            merged.counts += histogram.counts
            merged.total_ns += histogram.total_ns
        return merged

    def stats_s(self) -> dict[str, float | None]:
        count = int(self.counts.sum())
        if count == 0:
            return stats_s(np.empty(0))
        cumulative = np.cumsum(self.counts)
        middle_s = self.RATIO ** (np.arange(self.BINS) + 0.5) / 1e9
        sample = lambda rank: float(middle_s[np.searchsorted(cumulative, rank, side="right")])  # noqa: E731
        points = []
        for q in PERCENTILES.values():
            # Between the samples at the ranks around q*(count-1), as numpy's default percentile does.
            rank = q / 100 * (count - 1)
            low, high = int(np.floor(rank)), int(np.ceil(rank))
            points.append(sample(low) + (rank - low) * (sample(high) - sample(low)))
        return {"mean": self.total_ns / count / 1e9, **dict(zip(PERCENTILES, points))}


def tpot_ns(run: Run) -> np.ndarray:
    """TPOT (Run.tpot_ns) of the completed requests with more than one token."""
    return run.tpot_ns()[run.completed & (run.output_tokens > 1)]


def misses_slo(run: Run, slo: dict[str, float | None]) -> dict[str, np.ndarray]:
    """Per SLO that is set (seconds), per request: whether it missed that target."""
    per_token = np.nan_to_num(run.tpot_ns())  # a one-token request misses no TPOT target
    observed = {"ttft": run.ttft_ns, "ttfv": run.ttfv_ns, "tpot": per_token, "e2e": run.e2e_ns}
    return {metric: observed[metric] > limit_s * 1e9 for metric, limit_s in slo.items() if limit_s is not None}


def meets_slo(run: Run, slo: dict[str, float | None]) -> np.ndarray:
    """Per request: completed and within every SLO that is set (seconds)."""
    ok = run.completed.copy()
    for missed in misses_slo(run, slo).values():
        ok &= ~missed
    return ok


def window_ns(run: Run) -> int:
    """First send to last byte received."""
    done = run.completed
    if not done.any():
        return 0
    return int((run.sent_ns[done] + run.e2e_ns[done]).max() - run.sent_ns.min())


def per_second(count: int, window_s: float) -> float:
    """`count` a second of a window of `window_s` (0 for an empty window), as the summary's throughputs read."""
    return count / window_s if window_s > 0 else 0.0


def output_tokens_per_s(run: Run) -> float:
    """The completed requests' output tokens a second of the run's window (the summary's
    throughput.output_tokens_per_s)."""
    return per_second(int(run.output_tokens[run.completed].sum()), window_ns(run) / 1e9)


def attribution_s(run: Run) -> dict[str, Any] | None:
    """Mean seconds per layer over completed requests, and `delivery_detail`, the delivery's parts where the
    run splits it (they sum to `delivery`); with an application, its layer and `application_detail`, its
    stages' parts; None for a run without attribution."""
    if run.queue_ns is None:
        return None
    done = run.completed

    def means_s(parts: dict[str, np.ndarray]) -> dict[str, float]:
        return {name: float(values[done].mean()) / 1e9 if done.any() else 0.0 for name, values in parts.items()}

    layers = means_s({"queue": run.queue_ns, "compute": run.compute_ns, "traffic": run.traffic_ns,
                      "delivery": run.delivery_ns})
    if run.network_ns is not None:
        layers["delivery_detail"] = means_s({part: getattr(run, f"{part}_ns") for part in DELIVERY_DETAIL})
    if run.application_ns is not None:  # a fifth layer only where the scenario has an [application]
        layers[APPLICATION] = means_s({APPLICATION: run.application_ns})[APPLICATION]
        layers["application_detail"] = means_s(run.application_detail_ns)
    return layers


def summarize(run: Run, scenario_name: str, fingerprint: str, slo: dict[str, float | None],
              bottleneck: str | None = None, warmup_requests: int = 0) -> dict[str, Any]:
    """The result schema of docs/design.md for one run, over the requests after the first `warmup_requests`
    (the window then starts at the first measured request's send)."""
    run = run.after(warmup_requests)
    done = run.completed
    window_s = window_ns(run) / 1e9
    per_s = partial(per_second, window_s=window_s)
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "source": run.source,
        "scenario": {"name": scenario_name, "fingerprint": fingerprint},
        "requests": {
            "completed": int(done.sum()),
            "failed": int((~done).sum()),
            "input_tokens_mean": float(run.input_tokens[done].mean()) if done.any() else 0.0,
            "output_tokens_mean": float(run.output_tokens[done].mean()) if done.any() else 0.0,
            "warmup": warmup_requests,
        },
        "window_s": window_s,
        "throughput": {
            "output_tokens_per_s": output_tokens_per_s(run),
            "requests_per_s": per_s(int(done.sum())),
            "goodput_requests_per_s": per_s(int(meets_slo(run, slo).sum())),
        },
        "latency_s": {
            "ttft": stats_s(run.ttft_ns[done]),
            "ttfv": stats_s(run.ttfv_ns[done]),
            "tpot": stats_s(tpot_ns(run)),
            "itl": stats_s(run.itl_ns()) if run.itl_histogram is None else run.itl_histogram.stats_s(),
            "e2e": stats_s(run.e2e_ns[done]),
        },
        "attribution_s": attribution_s(run),
        "bottleneck": bottleneck,
        "continuity": continuity_block(run),
    }
    if run.model_calls is not None:  # an agent loop: what the engine served, every call of every request
        summary["requests"]["model_calls_mean"] = float(run.model_calls[done].mean()) if done.any() else 0.0
        summary["throughput"]["model_calls_per_s"] = per_s(int(run.model_calls[done].sum()))
        summary["throughput"]["model_call_output_tokens_per_s"] = per_s(int(run.model_call_output_tokens[done].sum()))
    if run.prefix_hit_tokens is not None:  # (over the prompts the engine took, a chat template's tokens included)
        prompt = int((run.input_tokens if run.engine_input_tokens is None else run.engine_input_tokens)[done].sum())
        summary["prefix_cache"] = {
            "hit_rate": int(run.prefix_hit_tokens[done].sum()) / prompt if prompt else 0.0,
            "hit_tokens_mean": float(run.prefix_hit_tokens[done].mean()) if done.any() else 0.0,
        }
    return summary


def continuity_per_request(run: Run) -> dict[str, np.ndarray] | None:
    """Each request's stalls, stall_ns and qoe (continuity.py): the run's own values, or computed from
    its token times; None for a run that has neither."""
    if run.qoe is not None:
        return {"stalls": run.stalls, "stall_ns": run.stall_ns, "qoe": run.qoe}
    if run.token_client_ns is not None:
        return continuity.per_request(run.token_client_ns, run.token_offsets, run.sent_ns, run.sent_ns + run.ttfv_ns,
                                      run.continuity)
    return None


def continuity_block(run: Run) -> dict[str, Any] | None:
    """Stalls and QoE over completed requests; None for a run without per-request continuity."""
    flow = continuity_per_request(run)
    if flow is None:
        return None
    done = run.completed
    return continuity.summary_block(flow["stalls"][done], flow["stall_ns"][done], flow["qoe"][done], run.continuity)


def metric_value(summary: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a summary document (`latency_s.ttft.p99`), or None where it has none."""
    value: Any = summary
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def check_summary_version(document: Any, where: str) -> None:
    """A summary written by another version of tokenpath is a `UserError` naming its schema and this one's."""
    if isinstance(document, dict):
        check_version(document.get("schema"), SCHEMA, where, "a summary",
                      "run the simulate, bench or report that wrote it again with this version")


def load_summary(path: str | Path) -> dict[str, Any]:
    """A summary read back from its file (`--json` of simulate, bench or report), its schema and metrics
    checked; a `UserError` if it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give the --json output of simulate, bench or report") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read it ({error})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        hint = "; for a bench results file run `tokenpath report` on it first" if str(path).endswith(".jsonl") else ""
        raise UserError(f"{path}: not a JSON summary{hint}") from None
    return check_summary(document, str(path))


def check_summary(document: Any, where: str, hint: str = "") -> dict[str, Any]:
    """`document` if it is a summary of this version with sound metrics, else a `UserError` naming
    `where` (then `hint`, how to get one)."""
    check_summary_version(document, where)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        schema = document.get("schema") if isinstance(document, dict) else None
        raise UserError(f"{where}: not a {SCHEMA} summary (schema is {schema!r}){hint}")
    check_metrics(document, where)
    return document


# The parts of a summary that hold its metrics, as report and compare show them.
_METRIC_KEYS = ("requests", "window_s", "throughput", "latency_s", "attribution_s", "continuity", "prefix_cache")


# The objects report and compare read a summary's metrics from: the first three in every summary, the
# others absent or null where a run has none; then the objects inside them, absent or null alike.
_OBJECTS = ("latency_s", "throughput", "requests")
_OPTIONAL_OBJECTS = ("attribution_s", "continuity", "prefix_cache", "load")
_INNER_OBJECTS = ("attribution_s.delivery_detail", "attribution_s.application_detail", "continuity.qoe",
                  *(f"latency_s.{key}" for key in ("ttft", "ttfv", "tpot", "itl", "e2e")))


# The fields every summary has that report reads (report/table.py), each a number or null where unknown,
# and those that may be null but are never left out.
_REQUIRED_METRICS = ("requests.completed", "requests.failed", "window_s", "throughput.output_tokens_per_s",
                     "throughput.requests_per_s", "throughput.goodput_requests_per_s",
                     *(f"latency_s.{key}.{stat}" for key in ("ttft", "ttfv", "tpot", "itl", "e2e")
                       for stat in ("mean", *PERCENTILES)))
_REQUIRED_KEYS = ("attribution_s", "bottleneck")


def check_metrics(summary: dict[str, Any], where: str) -> None:
    """The summary's metric objects are objects, every field report reads is there (and its request
    counts whole numbers), and every metric in them is a finite number, or null where it is unknown (a
    latency of a run where every request failed): a `UserError` naming the first that is not."""
    for key in _OBJECTS:
        if not isinstance(summary.get(key), dict):
            raise UserError(f"{where}: the summary has no '{key}' object ({key} is {quoted(summary.get(key))}); "
                            "the file is damaged")
    for field in (*_OPTIONAL_OBJECTS, *_INNER_OBJECTS):
        outer, _, inner = field.partition(".")
        value = summary.get(outer)
        if inner and isinstance(value, dict):
            value = value.get(inner)
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{where}: {field} is {quoted(value)}, not an object; the file is damaged")
    def check(value: Any, field: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key != "band":  # an error band (sim/bands.py) says in words where it comes from
                    check(inner, f"{field}.{key}")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                    or not math.isfinite(value)):
            raise UserError(f"{where}: {field} is {quoted(value)}, not a number; a summary holds finite numbers "
                            "(times in seconds), or null where a value is unknown")

    for key in _METRIC_KEYS:
        check(summary.get(key), key)
    for field in (*_REQUIRED_METRICS, *_REQUIRED_KEYS):
        *outer, last = field.split(".")
        holder = summary
        for key in outer:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or last not in holder:
            raise UserError(f"{where}: the summary has no {field}; the file is damaged")
    for field in ("completed", "failed"):
        count = summary["requests"].get(field)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UserError(f"{where}: requests.{field} is {quoted(count)}, not a count of requests; the file is "
                            "damaged")
    if not isinstance((summary.get("scenario") or {}).get("name"), str):
        raise UserError(f"{where}: the summary has no scenario.name; the file is damaged")
