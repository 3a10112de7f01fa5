"""The summary's metrics by dotted path (summary.py's schema), and which way each is better.

Levers (an objective), capacity (a target) and sweeps (a Pareto axis) all ask the same two questions of
a metric: does it exist, and is more of it better or worse. They ask here.
"""

from __future__ import annotations

from tokenpath.sim.summary import LAYERS, PERCENTILES

LATENCIES = ("ttft", "ttfv", "tpot", "itl", "e2e")
THROUGHPUT = ("output_tokens_per_s", "requests_per_s", "goodput_requests_per_s")
# continuity.py's summary_block: stall counts, times and shares are better low; QoE better high, but
# the share of requests below QoE 0.9 is better low.
CONTINUITY_LOWER = ("stalls_per_request", "stall_s_per_request", "requests_with_stalls", "stall_s_max",
                    "qoe.below_0_9")
CONTINUITY_HIGHER = ("qoe.mean", "qoe.p1", "qoe.p10", "qoe.p50")


def known_metrics() -> list[str]:
    """Every numeric metric of a summary that is a result of the run (not a setting), by dotted path."""
    latencies = [f"latency_s.{metric}.{stat}" for metric in LATENCIES for stat in ("mean", *PERCENTILES)]
    return (latencies + [f"throughput.{key}" for key in THROUGHPUT] + [f"attribution_s.{part}" for part in LAYERS]
            + ["window_s"] + [f"continuity.{key}" for key in CONTINUITY_LOWER + CONTINUITY_HIGHER])


def higher_is_better(metric: str) -> bool | None:
    """True where more is better (throughput, QoE), False where less is (times, stalls), None for a
    metric this module does not know."""
    if metric.startswith(("throughput.", "continuity.qoe.")) and metric != "continuity.qoe.below_0_9":
        return True
    if metric.startswith(("latency_s.", "attribution_s.", "continuity.")) or metric == "window_s":
        return False
    return None


def is_duration(metric: str) -> bool:
    """Whether the metric is a time in seconds (to be shown as one)."""
    return metric.startswith(("latency_s.", "attribution_s.")) or metric in (
        "window_s", "continuity.stall_s_per_request", "continuity.stall_s_max")
