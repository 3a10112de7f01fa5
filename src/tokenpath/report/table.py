"""Rich tables for people: a scenario, a summary, the catalog."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tokenpath.config.units import format_duration, format_number
from tokenpath.diagnose.overload import verdict_line
from tokenpath.sim.summary import APPLICATION, PERCENTILES

_LATENCY_NAMES = {"ttft": "TTFT", "ttfv": "TTFV", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
_PART_NAMES = {"queue": "queue (distribution)", "compute": "compute", "traffic": "traffic", "delivery": "delivery"}
# The parts of delivery (summary.DELIVERY_DETAIL), shown under it.
_DELIVERY_DETAIL_NAMES = {"network": "network", "frontend_queue": "front end: waiting",
                          "frontend_work": "front end: work", "engine_host": "engine's host"}


def scenario_table(lines: list[tuple[str, str]], title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in lines:
        table.add_row(key, value)
    return table


# The statistic whose cell shows its band (the others' are in the JSON).
_BANDED_STAT = "p50"
_DURATION_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def with_band(text: str, band: dict[str, Any] | None) -> str:
    """A figure as shown, and its band in brackets in the same unit: '75.3 ms (63-90)', '5,203 (4,800-5,600)'."""
    if not band or band.get("low") is None or band.get("high") is None:
        return text
    scale = _DURATION_UNIT_S.get(text.rsplit(" ", 1)[-1], 1.0) if " " in text else 1.0
    return f"{text} ({format_number(band['low'] / scale, 2)}-{format_number(band['high'] / scale, 2)})"


def latency_table(summary: dict[str, Any]) -> Table:
    table = Table(title="Latency", title_justify="left")
    table.add_column("metric", style="bold")
    for column in ("mean", *PERCENTILES):
        name = column.replace("p999", "p99.9")
        table.add_column(f"{name} (range)" if column == _BANDED_STAT and _has_bands(summary) else name,
                         justify="right")
    for key, name in _LATENCY_NAMES.items():
        stats = summary["latency_s"][key]
        band = stats.get("band") or {}
        table.add_row(name, *(with_band(format_duration(stats[c]), band.get(c)) if c == _BANDED_STAT
                              else format_duration(stats[c]) for c in ("mean", *PERCENTILES)))
    return table


def _has_bands(summary: dict[str, Any]) -> bool:
    return any("band" in stats for stats in summary["latency_s"].values())


def bands_table(summary: dict[str, Any]) -> Table | None:
    """What the ranges in brackets are, and the rows each comes from (sim/bands.py); None without
    bands (a measured run)."""
    ttft, decode, e2e = (summary["latency_s"][key].get("band") for key in ("ttft", "tpot", "e2e"))
    bases = {"TTFT": ttft, "TPOT/ITL": decode}
    if ttft and decode and ttft["basis"] == decode["basis"]:
        bases = {"latency": ttft}
    if e2e and all(e2e["basis"] != band["basis"] for band in bases.values() if band):  # (from TTFT's and decode's)
        bases["E2E"] = e2e
    bases["throughput"] = summary["throughput"].get("band")
    if not any(bases.values()):
        return None
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for name, band in bases.items():
        if band:
            table.add_row(f"{name}:", band["basis"])
    return table


def print_bands(console: Console, summary: dict[str, Any]) -> None:
    """The ranges' basis, and, outside the validated envelope, the line that says so (sim/envelope.py)."""
    table = bands_table(summary)
    if table is not None:
        console.print("Ranges (x-y): what would be measured, given the errors of the validated rows nearest this "
                      "run (docs/validation.md)", highlight=False)
        console.print(table)
    line = (summary.get("envelope") or {}).get("line")
    if line:
        console.print(line, highlight=False)


def throughput_table(summary: dict[str, Any]) -> Table:
    table = Table(title="Throughput", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    t, r = summary["throughput"], summary["requests"]
    table.add_row("output tokens/s", with_band(format_number(t["output_tokens_per_s"]),
                                               (t.get("band") or {}).get("output_tokens_per_s")))
    table.add_row("requests/s", format_number(t['requests_per_s']))
    table.add_row("goodput (meets SLOs), requests/s", format_number(t['goodput_requests_per_s']))
    if "model_calls_per_s" in t:  # an agent loop: the engine served every call of each request
        table.add_row("model calls/s (all calls' output tokens/s)",
                      f"{format_number(t['model_calls_per_s'])} ({format_number(t['model_call_output_tokens_per_s'])})")
    table.add_row("requests completed / failed", f"{r['completed']:,} / {r['failed']:,}")
    table.add_row("window", format_duration(summary["window_s"]))
    for name, value in cache_and_routing_rows(summary):
        table.add_row(name, value)
    return table


# Up to this many replicas each one's count is listed; beyond it, the range.
_LISTED_REPLICAS = 8


def cache_and_routing_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The prefix cache's hit rate and the requests each replica served, where the summary has them."""
    rows = []
    cache = summary.get("prefix_cache")
    if cache is not None:
        rows.append(("prefix cache hit rate", f"{cache['hit_rate']:.1%} "
                                              f"({format_number(cache['hit_tokens_mean'])} tokens/request)"))
    routing = summary.get("routing")
    if routing is not None and len(routing["requests_per_replica"]) > 1:
        served = routing["requests_per_replica"]
        counts = (" / ".join(f"{count:,}" for count in served) if len(served) <= _LISTED_REPLICAS
                  else f"{min(served):,} to {max(served):,} over {len(served)} replicas")
        rows.append(("requests per replica", f"{counts} (imbalance {routing['imbalance']:.2f})"))
    return rows


def attribution_table(summary: dict[str, Any]) -> Table:
    parts = summary["attribution_s"]
    names = {**_PART_NAMES, APPLICATION: "application"} if APPLICATION in parts else _PART_NAMES
    total = sum(parts[key] for key in names) or 1.0
    table = Table(title="Where a request's time goes (mean per request)", title_justify="left")
    table.add_column("layer", style="bold")
    table.add_column("time", justify="right")
    table.add_column("share of E2E", justify="right")
    for key, name in names.items():
        table.add_row(name, format_duration(parts[key]), f"{parts[key] / total:.1%}")
        details = {"delivery": _DELIVERY_DETAIL_NAMES, APPLICATION: {stage: stage for stage in
                                                                     parts.get("application_detail", {})}}
        for detail, detail_name in details.get(key, {}).items():
            seconds = parts.get(f"{key}_detail", {}).get(detail)
            if seconds:
                table.add_row(f"  {detail_name}", format_duration(seconds), f"{seconds / total:.1%}", style="dim")
    table.add_row("E2E", format_duration(total), "100.0%", style="dim")
    return table


def print_summary(console: Console, summary: dict[str, Any], scenario_lines: list[tuple[str, str]],
                  reason: str | None) -> None:
    console.print(scenario_table(scenario_lines, f"Scenario: {summary['scenario']['name']}"))
    console.print(throughput_table(summary))
    console.print(latency_table(summary))
    print_bands(console, summary)
    if summary["attribution_s"] is not None:
        console.print(attribution_table(summary))
    line = continuity_line(summary.get("continuity"))
    if line:
        console.print(line)
    if summary["bottleneck"] and reason and reason.startswith("overloaded"):  # the overload first
        console.print(f"[bold]Bottleneck: {reason.partition(';')[0]}[/bold];{reason.partition(';')[2]}")
    elif summary["bottleneck"]:
        console.print(f"[bold]Bottleneck: {summary['bottleneck']}[/bold] - {reason}")
    elif summary.get("load") and (verdict := verdict_line(summary["load"])):  # a measured run: its load alone
        console.print(f"load: {verdict}", highlight=False)


def continuity_line(flow: dict[str, Any] | None) -> str | None:
    """One line on continuity: Andes' QoE against a reader, and the stalls after the first visible text."""
    if not flow or flow["qoe"]["mean"] is None:
        return None
    qoe = flow["qoe"]
    return (f"Continuity: QoE {qoe['mean']:.3f} mean, {qoe['p10']:.3f} p10 (reader at "
            f"{flow['reading_tokens_per_s']:.2f} tokens/s from {flow['expected_ttft_s']:g} s); "
            f"{flow['stalls_per_request']:.2f} stalls over {flow['stall_threshold_s'] * 1000:g} ms per request, "
            f"{flow['requests_with_stalls']:.1%} of requests stalled")


def catalog_table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        first = i == 0
        table.add_column(column, justify="left" if first else "right", style="bold" if first else None,
                         no_wrap=first, min_width=max((len(row[0]) for row in rows), default=0) if first else None)
    for row in rows:
        table.add_row(*row)
    return table
