"""One self-contained HTML report, and its figures as PNG files.

The page carries everything it needs: Vega, Vega-Lite and vega-embed inlined from vl-convert's
bundle (no script or style from the network), each chart's spec and data, and the run's summary as
JSON. Numbers shown in its tables carry `data-key` (the summary's dotted key) and `data-value`, so
a test can check that what is shown is what the JSON says.
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.config.units import format_duration, format_number
from tokenpath.report.charts import APPLICATION, LATENCIES, LAYERS, Figure, figures
from tokenpath.report.views import Inputs
from tokenpath.sim.summary import PERCENTILES

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.2rem .7rem;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}table.lines td{text-align:left}.note{color:#666;font-size:.9rem}
.verdict{background:#f4f6fa;border-left:4px solid #4c78a8;padding:.6rem 1rem}.chart{margin:1rem 0}
td.band{background:#eef3f9}table.bands td.basis{text-align:left;color:#666;font-size:.85rem}
"""


@lru_cache(maxsize=1)
def _vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script (vl-convert ships them; no network)."""
    import vl_convert

    return vl_convert.javascript_bundle()


def _cell(text: str, key: str | None = None, value: float | None = None) -> str:
    attrs = "" if key is None else f' data-key="{html.escape(key)}" data-value="{"" if value is None else repr(value)}"'
    return f"<td{attrs}>{html.escape(text)}</td>"


def _numbers(inputs: Inputs) -> str:
    """Throughput, latency and attribution of each run, side by side."""
    runs = inputs.runs
    head = "<tr><th>metric</th>" + "".join(f"<th>{html.escape(run.label)}</th>" for run in runs) + "</tr>"
    body = []

    def row(name: str, key: str, show: Any, path: tuple[str, ...] | None = None) -> None:
        """`key`'s dotted parts are the summary's path to the value, unless `path` gives them (a name
        with a dot in it: an application's stage)."""
        cells = []
        for k, run in enumerate(runs):
            value: Any = run.summary
            for part in path or key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            number = float(value) if isinstance(value, (int, float)) else None
            cells.append(_cell("-" if number is None else show(number), f"{k}:{key}", number))
        body.append(f"<tr><td>{html.escape(name)}</td>{''.join(cells)}</tr>")

    row("output tokens/s", "throughput.output_tokens_per_s", format_number)
    row("requests/s", "throughput.requests_per_s", format_number)
    row("goodput (meets SLOs), requests/s", "throughput.goodput_requests_per_s", format_number)
    row("requests completed", "requests.completed", format_number)
    row("requests failed", "requests.failed", format_number)
    row("window", "window_s", format_duration)
    for key, name in LATENCIES.items():
        for stat in ("mean", *PERCENTILES):
            row(f"{name} {stat.replace('p999', 'p99.9')}", f"latency_s.{key}.{stat}", format_duration)
    if any(run.summary.get("attribution_s") for run in runs):
        for layer in LAYERS:
            row(f"{layer} (mean)", f"attribution_s.{layer}", format_duration)
        stages = sorted({stage for run in runs for stage in (run.summary["attribution_s"] or {}).get(
            "application_detail", {})})
        if stages:
            row(f"{APPLICATION} (mean)", f"attribution_s.{APPLICATION}", format_duration)
            for stage in stages:
                row(f"  {stage} (mean)", f"attribution_s.application_detail.{stage}", format_duration,
                    ("attribution_s", "application_detail", stage))
    if any(run.summary.get("prefix_cache") for run in runs):
        row("prefix-cache hit rate (prompt tokens)", "prefix_cache.hit_rate", _share)
    if any(run.summary.get("routing") for run in runs):
        row("load imbalance across replicas (most / mean)", "routing.imbalance", format_number)
    if any(run.summary.get("continuity") for run in runs):
        row("stalls per request", "continuity.stalls_per_request", format_number)
        row("stalled time per request", "continuity.stall_s_per_request", format_duration)
        row("requests with a stall", "continuity.requests_with_stalls", _share)
        row("longest stall", "continuity.stall_s_max", format_duration)
        for stat in ("mean", "p10", "p1"):
            row(f"QoE {stat}", f"continuity.qoe.{stat}", format_number)
        row("requests with QoE below 0.9", "continuity.qoe.below_0_9", _share)
    return f"<table id='numbers'>{head}{''.join(body)}</table>"


def _bands(inputs: Inputs) -> str:
    """Each run's headline figures with the range a measurement would fall in, and what the ranges rest on
    (sim/bands.py); a run outside the validated envelope says so."""
    parts = []
    for run in inputs.runs:
        summary = run.summary
        rows = []
        for key, name in LATENCIES.items():
            stats = (summary.get("latency_s") or {}).get(key) or {}
            band = stats.get("band")
            for stat in ("p50", "p90", "p99") if band else ():
                low, high = band[stat]["low"], band[stat]["high"]
                if low is not None:
                    rows.append((f"{name} {stat}", format_duration(stats[stat]),
                                 f"{format_duration(low)} - {format_duration(high)}", band["basis"]))
        throughput = summary.get("throughput") or {}
        band = throughput.get("band")
        if band and band["output_tokens_per_s"]["low"] is not None:
            rows.append(("output tokens/s", format_number(throughput["output_tokens_per_s"]),
                         f"{format_number(band['output_tokens_per_s']['low'])} - "
                         f"{format_number(band['output_tokens_per_s']['high'])}", band["basis"]))
        line = (summary.get("envelope") or {}).get("line")
        if not rows and not line:
            continue
        body = "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td><td class='band'>{html.escape(c)}"
                       f"</td><td class='basis'>{html.escape(d)}</td></tr>" for a, b, c, d in rows)
        head = "<tr><th>figure</th><th>predicted</th><th>would measure</th><th>from the rows of</th></tr>"
        parts.append(f"<h3>{html.escape(run.label)}</h3>"
                     + (f"<p class='verdict'><b>{html.escape(line)}</b></p>" if line else "")
                     + (f"<table class='bands'>{head}{body}</table>" if rows else ""))
    if not parts:
        return ""
    return ("<h2>How far to trust them</h2><p class='note'>The range a measurement would fall in, given the errors "
            "of the validated rows nearest each run: measured = predicted / (1 + error) (docs/validation.md).</p>"
            + "".join(parts))


def _scenario(run: Any) -> str:
    rows = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in run.scenario_lines)
    return f"<h3>{html.escape(run.label)}</h3><table class='lines'>{rows}</table>"


def _differences(inputs: Inputs) -> str:
    """What differs between two runs' scenarios, in one line."""
    from tokenpath.report.compare import difference_line

    differs = difference_line(inputs.runs[0].summary, inputs.runs[1].summary) if len(inputs.runs) == 2 else None
    return "" if differs is None else f"<p id='differences'><b>The runs differ in:</b> {html.escape(differs)}</p>"


def _verdicts(inputs: Inputs) -> str:
    """Each run's bottleneck line; a measured run, which has none, its load where it was overloaded or
    still filling (diagnose/overload.verdict_line)."""
    from tokenpath.diagnose.overload import verdict_line

    parts = []
    for run in inputs.runs:
        layer = run.summary.get("bottleneck")
        if layer:
            reason = run.summary.get("bottleneck_reason") or ""
            parts.append(f"<p class='verdict'><b>{html.escape(run.label)}: bottleneck {html.escape(str(layer))}</b>"
                         f"{' - ' + html.escape(reason) if reason else ''}</p>")
        elif run.summary.get("load") and (verdict := verdict_line(run.summary["load"])):
            parts.append(f"<p class='verdict'><b>{html.escape(run.label)}: load</b> - {html.escape(verdict)}</p>")
    return "".join(parts) or "<p class='note'>No bottleneck verdict: the input has no attribution (a measured run).</p>"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _continuity_note(inputs: Inputs) -> str:
    """What the continuity rows of the numbers table measured against (continuity.py)."""
    for run in inputs.runs:
        block = run.summary.get("continuity")
        if isinstance(block, dict):
            return (f"<p class='note'>Continuity: gaps over {format_duration(block['stall_threshold_s'])} after the "
                    f"first visible text count as stalls; QoE (Andes) compares the text delivered with a reader at "
                    f"{format_number(block['reading_tokens_per_s'])} tokens/s from "
                    f"{format_duration(block['expected_ttft_s'])}, 1 when never behind.</p>")
    return ""


def _spec(figure: Figure) -> dict[str, Any]:
    spec = figure.chart.to_dict()
    spec.setdefault("config", {}).setdefault("view", {"stroke": None})
    return spec


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value).replace("</", "<\\/")


def render(inputs: Inputs, title: str) -> str:
    """The whole page."""
    figs = figures(inputs)
    specs = {f"chart-{k}": _spec(figure) for k, figure in enumerate(figs)}
    sections = []
    for k, figure in enumerate(figs):
        sections.append(f"<h2>{html.escape(figure.title)}</h2><div class='chart' id='chart-{k}' "
                        f"data-name='{figure.name}'></div><p class='note'>{html.escape(figure.note)}</p>")
    summaries = [run.summary for run in inputs.runs]
    boot = """
window.tokenpathCharts = {};
window.tokenpathRendered = Promise.all(Object.entries(SPECS).map(([id, spec]) =>
  vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false}).then(result => {
    window.tokenpathCharts[id] = result.view;
  }).catch(error => console.error('chart ' + id + ': ' + error))));
"""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<h2>Scenario</h2>{_differences(inputs)}{''.join(_scenario(run) for run in inputs.runs)}
<h2>Bottleneck</h2>{_verdicts(inputs)}
<h2>Numbers</h2>{_numbers(inputs)}
{_continuity_note(inputs)}
{_bands(inputs)}
{''.join(sections)}
<script type="application/json" id="tokenpath-summaries">{_script_json(summaries)}</script>
<script>{_vega_bundle()}</script>
<script>const SPECS = {_script_json(specs)};{boot}</script>
</body></html>
"""


def write_html(inputs: Inputs, path: str, title: str, flag: str = "--html") -> None:
    text = render(inputs, title)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UserError(f"{flag} {files.shown(path)}: cannot write it ({error.strerror}); "
                        "choose another path") from None


def write_pngs(inputs: Inputs, folder: str, flag: str = "--png") -> list[Path]:
    """Each figure as DIR/NN-name.png (rendered by vl-convert, no browser), at twice the pixels."""
    import vl_convert

    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{flag} {files.shown(folder)}: cannot make the folder ({error.strerror})") from None
    written = []
    for k, figure in enumerate(figures(inputs)):
        target = out / f"{k + 1:02d}-{figure.name}.png"
        spec = _spec(figure)
        spec.setdefault("title", figure.title)
        spec.setdefault("background", "white")
        try:
            target.write_bytes(vl_convert.vegalite_to_png(spec, scale=2))
        except OSError as error:
            raise UserError(f"{flag} {files.shown(str(target))}: cannot write it ({error.strerror})") from None
        written.append(target)
    return written
