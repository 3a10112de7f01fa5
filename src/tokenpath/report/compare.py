"""Two summaries side by side (e.g. simulate vs bench), with the relative difference per metric."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from tokenpath.config.units import format_bandwidth, format_duration, format_number
from tokenpath.sim.overrides import flatten
from tokenpath.sim.summary import APPLICATION, LAYERS, PERCENTILES

_LATENCIES = {"ttft": "TTFT", "ttfv": "TTFV", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
_STATS = ("mean", *PERCENTILES)
_CONTINUITY_SETTINGS = (("stall_threshold_s", "stall threshold", "s"),
                        ("reading_tokens_per_s", "reading speed (tokens/s)", ""),
                        ("expected_ttft_s", "expected TTFT", "s"))
# How a setting of the `resolved` block reads, by the unit its key ends with (the longest first).
_SETTING_UNITS = (("_per_s", lambda v: f"{format_number(v, 6)}/s"), ("_Bps", format_bandwidth),
                  ("_s", format_duration))
MAX_NAMED = 4  # differences named in a run's name; the rest are counted


def relative(a: float | None, b: float | None) -> float | None:
    """(b - a) / a; 0 when both are 0; None when it is undefined."""
    if a is None or b is None:
        return None
    if a == 0:
        return 0.0 if b == 0 else None
    return (b - a) / a


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per metric: {"metric", "unit", "a", "b", "relative"} ("relative" is (b - a) / a)."""
    rows: list[dict[str, Any]] = []

    def add(metric: str, unit: str, x: Any, y: Any) -> None:
        x = float(x) if isinstance(x, (int, float)) else None
        y = float(y) if isinstance(y, (int, float)) else None
        rows.append({"metric": metric, "unit": unit, "a": x, "b": y,
                     "relative": None if unit == "yes/no" else relative(x, y)})

    ta, tb = a.get("throughput", {}), b.get("throughput", {})
    add("output tokens/s", "1/s", ta.get("output_tokens_per_s"), tb.get("output_tokens_per_s"))
    add("requests/s", "1/s", ta.get("requests_per_s"), tb.get("requests_per_s"))
    add("goodput requests/s", "1/s", ta.get("goodput_requests_per_s"), tb.get("goodput_requests_per_s"))
    loads = a.get("load"), b.get("load")
    if any(loads):
        la, lb = (load or {} for load in loads)
        add("offered requests/s", "1/s", la.get("offered_requests_per_s"), lb.get("offered_requests_per_s"))
        add("served requests/s", "1/s", la.get("served_requests_per_s"), lb.get("served_requests_per_s"))
        add("overloaded", "yes/no", la.get("overloaded"), lb.get("overloaded"))
        add("settled", "yes/no", la.get("settled"), lb.get("settled"))  # no: its latencies a transient's
    ra, rb = a.get("requests", {}), b.get("requests", {})
    add("requests completed", "", ra.get("completed"), rb.get("completed"))
    add("requests failed", "", ra.get("failed"), rb.get("failed"))
    add("input tokens (mean)", "", ra.get("input_tokens_mean"), rb.get("input_tokens_mean"))
    add("output tokens (mean)", "", ra.get("output_tokens_mean"), rb.get("output_tokens_mean"))
    add("window", "s", a.get("window_s"), b.get("window_s"))
    la, lb = a.get("latency_s", {}), b.get("latency_s", {})
    for key, name in _LATENCIES.items():
        for stat in _STATS:
            label = stat.replace("p999", "p99.9")
            add(f"{name} {label}", "s", la.get(key, {}).get(stat), lb.get(key, {}).get(stat))
    aa, ab = a.get("attribution_s"), b.get("attribution_s")
    if aa or ab:
        for layer in LAYERS:
            add(f"{layer} (mean)", "s", (aa or {}).get(layer), (ab or {}).get(layer))
        sa, sb = ((side or {}).get("application_detail", {}) for side in (aa, ab))
        if sa or sb:  # an application's layer, and each stage either side has
            add("application (mean)", "s", (aa or {}).get("application"), (ab or {}).get("application"))
            for stage in [*sa, *(stage for stage in sb if stage not in sa)]:
                add(f"  {stage} (mean)", "s", sa.get(stage), sb.get(stage))
    ca, cb = a.get("continuity"), b.get("continuity")
    if ca or cb:
        ca, cb = ca or {}, cb or {}
        add("stalls per request", "", ca.get("stalls_per_request"), cb.get("stalls_per_request"))
        add("stall time per request", "s", ca.get("stall_s_per_request"), cb.get("stall_s_per_request"))
        add("requests with stalls", "share", ca.get("requests_with_stalls"), cb.get("requests_with_stalls"))
        add("QoE mean", "", (ca.get("qoe") or {}).get("mean"), (cb.get("qoe") or {}).get("mean"))
        add("QoE p10", "", (ca.get("qoe") or {}).get("p10"), (cb.get("qoe") or {}).get("p10"))
        # Judged by other settings, the two sides' continuity numbers do not compare: show the settings.
        for key, name, unit in _CONTINUITY_SETTINGS:
            if ca and cb and ca.get(key) != cb.get(key):
                add(name, unit, ca.get(key), cb.get(key))
    return rows


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the two runs' `resolved` scenarios differ, as {"key", "a", "b"} (dotted keys, in the blocks'
    order); none when either summary has no such block (a measurement, or a file from before it)."""
    blocks = a.get("resolved"), b.get("resolved")
    if not all(isinstance(block, dict) for block in blocks):
        return []
    fa, fb = (flatten(block) for block in blocks)
    keys = [*fa, *(key for key in fb if key not in fa)]
    return [{"key": key, "a": fa.get(key), "b": fb.get(key)} for key in keys if fa.get(key) != fb.get(key)]


def _setting(key: str) -> str:
    """A `resolved` key for people: `deployment.fabric.kind` -> "fabric kind", `delivery.network_rtt_s` ->
    "network rtt"."""
    parts = key.split(".")[1:] or [key]
    if len(parts) > 1 and parts[0] in parts[-1]:  # "speculative.num_speculative_tokens": said once
        parts = parts[1:]
    name = ".".join(parts)
    unit = next((suffix for suffix, _ in _SETTING_UNITS if name.endswith(suffix)), "")
    return name.removesuffix(unit).replace(".", " ").replace("_", " ")


def _shown(key: str, value: Any) -> str:
    if value is None:
        return "all at once" if key.endswith("rate_per_s") else "none"  # (a rate of inf is written null)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        shown = next((show for suffix, show in _SETTING_UNITS if key.endswith(suffix)), format_number)
        return shown(value)
    return str(value)


def _named(parts: list[str]) -> str:
    more = len(parts) - MAX_NAMED
    return ", ".join(parts[:MAX_NAMED]) + (f" and {more} more" if more > 0 else "")


def _measured_without_application(measured: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether `measured` is a bench run of the scenario of `other`, a run with an [application]: bench sends
    the model call alone (it ignores the table, docs/application.md), so the two ran different things."""
    same = (measured.get("scenario") or {}).get("fingerprint") == (other.get("scenario") or {}).get("fingerprint")
    return same and measured.get("source") == "bench" and other.get("source") != "bench" and \
        APPLICATION in (other.get("attribution_s") or {})


def application_note(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why a bench run and a run with an [application] are not one scenario, whatever their fingerprints
    say; None where that is not the case."""
    for measured, other in ((a, b), (b, a)):
        if _measured_without_application(measured, other):
            return (f"{'A' if measured is a else 'B'} (bench) measured the model call alone (bench ignores the "
                    f"scenario's application table); {'B' if measured is a else 'A'} includes the application's "
                    "stages")
    return None


def _application_names(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str] | None:
    if application_note(a, b) is None:
        return None
    return ("the model call alone" if _measured_without_application(a, b) else "with its application",
            "the model call alone" if _measured_without_application(b, a) else "with its application")


def run_names(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str] | None:
    """Each run named by its own values where the two resolved scenarios differ ("tp 8, replicas 1" and
    "tp 4, replicas 2"); a bench run against a run with an [application] by what each ran; by its
    scenario's fingerprint where nothing else tells them apart; None for two runs of one scenario."""
    names = _application_names(a, b)
    if names is not None:
        return names
    found = differences(a, b)
    if found:
        name_a, name_b = (_named([f"{_setting(d['key'])} {_shown(d['key'], d[side])}" for d in found]) for side in "ab")
        return name_a, name_b
    prints = [str((s.get("scenario") or {}).get("fingerprint")) for s in (a, b)]
    return None if prints[0] == prints[1] else (f"scenario {prints[0][:12]}", f"scenario {prints[1][:12]}")


def difference_line(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between the two runs in one line ("tp 8 vs 4, detokenize inline vs async"); None for
    two runs of one scenario."""
    note = application_note(a, b)
    if note is not None:
        return note
    found = differences(a, b)
    if found:
        return _named([f"{_setting(d['key'])} {_shown(d['key'], d['a'])} vs {_shown(d['key'], d['b'])}"
                       for d in found])
    names = run_names(a, b)
    return None if names is None else f"{names[0]} vs {names[1]}"


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "yes/no":
        return "yes" if value else "no"
    if unit == "s":
        return format_duration(value)
    if unit == "1/s":
        return format_number(value)
    if unit == "share":
        return f"{value:.1%}"
    return format_number(value, 4)


def _delta(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1%}"


def compare_table(a: dict[str, Any], b: dict[str, Any], name_a: str = "A", name_b: str = "B") -> Table:
    names = run_names(a, b)
    sides = []
    for k, (name, side) in enumerate(((name_a, a), (name_b, b))):
        differs = f"; {names[k]}" if names else ""
        sides.append(f"{name} ({side.get('source')}, {side.get('scenario', {}).get('name')}{differs})")
    title = " vs ".join(sides)
    table = Table(title=title, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column(name_a, justify="right")
    table.add_column(name_b, justify="right")
    table.add_column("B vs A", justify="right")
    for row in compare(a, b):
        table.add_row(row["metric"], _cell(row["a"], row["unit"]), _cell(row["b"], row["unit"]),
                      _delta(row["relative"]))
    return table


def compare_document(a: dict[str, Any], b: dict[str, Any], path_a: str, path_b: str) -> dict[str, Any]:
    note = application_note(a, b)
    same = a.get("scenario", {}).get("fingerprint") == b.get("scenario", {}).get("fingerprint") and note is None
    names = run_names(a, b) or (None, None)
    return {
        "schema": "tokenpath.compare/1",
        "a": {"path": path_a, "source": a.get("source"), "scenario": a.get("scenario"), "name": names[0]},
        "b": {"path": path_b, "source": b.get("source"), "scenario": b.get("scenario"), "name": names[1]},
        "same_scenario": same,
        "note": note,  # why two runs of one scenario's fingerprint are not the same run (a bench run's)
        "differences": differences(a, b),
        "rows": compare(a, b),
    }
