"""A measured run's scenario lines for people, from its results file's header."""

from __future__ import annotations

import math
from typing import Any

from tokenpath.config.units import format_number


def describe_bench(header: dict[str, Any], rows: list[dict[str, Any]], results_path: str) -> list[tuple[str, str]]:
    """Scenario lines for a measured run's report."""
    def table(parent: dict[str, Any], key: str) -> dict[str, Any]:  # a damaged header shows less, never fails
        value = parent.get(key)
        return value if isinstance(value, dict) else {}

    workload = table(table(table(header, "scenario"), "table"), "workload")
    arrival = table(workload, "arrival")
    rate, burstiness = arrival.get("rate"), arrival.get("burstiness", 1.0)
    burstiness = format_number(burstiness, 6) if isinstance(burstiness, (int, float)) else str(burstiness)
    # An infinite rate is written as null (JSON has no infinity).
    unbounded = rate is None or rate in ("inf", "Infinity") or (isinstance(rate, float) and math.isinf(rate))
    arrivals = "all at t=0" if unbounded else \
        f"{format_number(rate, 6)} req/s, burstiness {burstiness}" if isinstance(rate, (int, float)) else str(rate)
    if isinstance(workload.get("trace"), dict):  # the trace's times replace the arrival table
        scale = workload["trace"].get("time_scale", 1.0)
        arrivals = f"as recorded in the trace (time_scale {format_number(scale, 6)})" \
            if isinstance(scale, (int, float)) else "as recorded in the trace"
    if workload.get("max_concurrency"):
        arrivals += f", at most {workload['max_concurrency']} outstanding"
    return [
        ("server", f"{header.get('url')} ({header.get('endpoint')})"),
        ("model", str(header.get("model"))),
        ("prompts", f"{header.get('tokenizer')} tokenizer, exact drawn lengths, {_sharing(header)}"),
        ("workload", f"{header.get('planned')} requests planned, {len(rows)} recorded"),
        ("arrivals", arrivals),
        ("client", f"{header.get('workers')} worker process(es), {header.get('timestamps', 'event loop')} timestamps"),
        ("results", results_path),
    ]


def _sharing(header: dict[str, Any]) -> str:
    shared = header.get("shared_prefix_requests") or 0
    tagged = "each tagged" if header.get("unique_prompts", True) else "untagged"
    return f"{tagged}, {shared} with a shared prefix" if shared else tagged
