"""The report's figures as Vega-Lite charts (through altair), one function per figure.

Each returns a `Figure` (a name for its PNG, a title, the chart, a note on what it shows) or None
when the inputs do not have what it needs. Two runs are drawn in one chart, told apart by colour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpath.config.units import format_duration
from tokenpath.report.views import Inputs, RunView
from tokenpath.sim import continuity

CDF_POINTS = 200          # quantiles drawn per latency curve
TIMELINE_REQUESTS = 120   # requests drawn in the timeline (an even sample of the run)
LAYERS = ("queue", "compute", "traffic", "delivery")
LAYER_COLORS = ["#9e9e9e", "#4c78a8", "#f58518", "#54a24b"]
# The fifth layer of runs with an [application] (docs/application.md), and its color.
APPLICATION, APPLICATION_COLOR = "application", "#b279a2"
LATENCIES = {"ttft": "TTFT", "ttfv": "TTFV", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# Axis labels without exponents or SI letters (d3-format: thousands separated, trailing zeros off).
NUMBER = ",~r"
WIDTH = 560
TIMELINE_WIDTH, PHASE_WIDTH = 360, 90  # the timeline over the run, and each phase's lengths beside it


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    chart: Any
    note: str = ""


def _alt() -> Any:
    import altair as alt

    # Every chart's rows are bounded here (quantiles, samples), not by altair's 5,000-row guard.
    alt.data_transformers.disable_max_rows()
    return alt


def _frame(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


def _runs_scale(runs: list[RunView]) -> Any:
    alt = _alt()
    return alt.Scale(domain=[run.label for run in runs], range=["#4c78a8", "#e45756"][:len(runs)])


def attribution(inputs: Inputs) -> Figure | None:
    runs = [run for run in inputs.runs if run.summary.get("attribution_s")]
    if not runs:
        return None
    alt = _alt()
    layers, colors = _layers(any(APPLICATION in run.summary["attribution_s"] for run in runs))
    rows = [{"run": run.label, "layer": layer, "order": k, "ms": run.summary["attribution_s"].get(layer, 0.0) * 1e3}
            for run in runs for k, layer in enumerate(layers)]
    chart = alt.Chart(_frame(rows)).mark_bar().encode(
        x=alt.X("sum(ms):Q", title="mean time per request (ms)", axis=alt.Axis(format=NUMBER)),
        y=alt.Y("run:N", title=None),
        color=alt.Color("layer:N", sort=list(layers), scale=alt.Scale(domain=list(layers), range=colors)),
        order=alt.Order("order:Q"),
        tooltip=["run", "layer", alt.Tooltip("ms:Q", format=",.3~r")],
    ).properties(width=WIDTH, height=40 * len(runs))
    count = "five" if len(layers) == 5 else "four"
    note = f"Each layer's mean over the measured requests; the {count} add up to the mean E2E."
    stages = {stage for run in runs for stage in run.summary["attribution_s"].get("application_detail", {})}
    if stages:
        note += (" The application's layer is its stages' time on each request's critical path "
                 f"({', '.join(sorted(stages))}).")
    return Figure("attribution", f"Where a request's time goes: {' + '.join(layers)} = E2E", chart, note)


def _layers(application: bool) -> tuple[tuple[str, ...], list[str]]:
    """The attribution's layers and their colors: the fifth where a run has an application."""
    if application:
        return (*LAYERS, APPLICATION), [*LAYER_COLORS, APPLICATION_COLOR]
    return LAYERS, LAYER_COLORS


def layer_distributions(inputs: Inputs) -> Figure | None:
    runs = [run for run in inputs.runs if run.requests is not None and run.requests["queue_s"].notna().any()]
    if not runs:
        return None
    alt = _alt()
    layers, _ = _layers(any("application_s" in run.requests and run.requests["application_s"].notna().any()
                            for run in runs))
    rows = []
    for run in runs:  # each box from every request (its five numbers), so the page holds 5 values a box
        kept = _measured(run.requests)
        for layer in layers:
            if f"{layer}_s" not in kept:
                continue
            values = kept[f"{layer}_s"].dropna().to_numpy(np.float64) * 1e3
            if len(values):
                low, q1, median, q3, high = np.percentile(values, [0, 25, 50, 75, 100])
                rows.append({"run": run.label, "layer": layer, "min": low, "q1": q1, "median": median, "q3": q3,
                             "max": high})
    base = alt.Chart(_frame(rows)).encode(
        y=alt.Y("layer:N", sort=list(layers), title=None), yOffset="run:N",
        color=alt.Color("run:N", scale=_runs_scale(runs)),
        tooltip=["run", "layer", *(alt.Tooltip(f"{k}:Q", format=",.3~r", title=f"{k} (ms)")
                                   for k in ("min", "q1", "median", "q3", "max"))])
    whiskers = base.mark_rule().encode(
        x=alt.X("min:Q", title="time per request (ms)", axis=alt.Axis(format=NUMBER)), x2="max:Q")
    boxes = base.mark_bar(height=14).encode(x="q1:Q", x2="q3:Q")
    medians = base.mark_tick(thickness=2, size=14).encode(x="median:Q", color=alt.value("black"))
    chart = (whiskers + boxes + medians).properties(width=WIDTH, height=60 * len(layers))
    return Figure("layers", "Each layer per request: the spread", chart,
                  "Box: the middle half of the requests, black tick: the median, line: min to max.")


def _measured(frame: Any) -> Any:
    return frame[frame["ok"].astype(bool) & ~frame["warmup"].astype(bool)]


def _curve(values_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.sort(values_s[np.isfinite(values_s)])
    if len(values) == 0:
        return values, values
    fractions = np.linspace(0, 1, min(CDF_POINTS, len(values)))
    return np.quantile(values, fractions), fractions


def latency_cdfs(inputs: Inputs) -> Figure:
    """One CDF per latency: from every request where the input has them, else the summary's percentiles."""
    alt = _alt()
    from tokenpath.sim.summary import PERCENTILES

    rows = []
    for run in inputs.runs:
        for key, name in LATENCIES.items():
            values = None
            if key == "itl":
                values = run.itl_s
            elif run.requests is not None:
                values = _measured(run.requests)[f"{key}_s"].to_numpy(np.float64)
            if values is not None and len(values):
                xs, ys = _curve(values)
            else:  # the summary's percentiles: a few points of the same curve
                stats = run.summary["latency_s"].get(key) or {}
                points = [(stats.get(p), q / 100) for p, q in PERCENTILES.items() if stats.get(p) is not None]
                xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
            rows += [{"run": run.label, "metric": name, "ms": float(x) * 1e3, "fraction": float(y)}
                     for x, y in zip(xs, ys)]
    data = _frame(rows)
    charts = []
    for name in LATENCIES.values():
        part = data[data["metric"] == name] if len(data) else data
        if not len(part):
            continue
        charts.append(alt.Chart(part, title=name).mark_line(point=len(part) < 20 * len(inputs.runs)).encode(
            x=alt.X("ms:Q", title=f"{name} (ms)", axis=alt.Axis(format=NUMBER)),
            y=alt.Y("fraction:Q", title=f"share of {'gaps' if name == 'ITL' else 'requests'} at or below",
                    axis=alt.Axis(format="%")),
            color=alt.Color("run:N", scale=_runs_scale(inputs.runs)),
            tooltip=["run", alt.Tooltip("ms:Q", format=",.3~r"), alt.Tooltip("fraction:Q", format=".1%")],
        ).properties(width=250, height=180))
    rows_of_charts = [alt.hconcat(*charts[k:k + 3]) for k in range(0, len(charts), 3)]
    chart = alt.vconcat(*rows_of_charts)
    note = "Curves from every measured request (ITL: every gap between text arrivals)."
    if any(run.requests is None for run in inputs.runs):
        note += " A summary alone gives only its percentiles (p50, p90, p99, p99.9), drawn as points."
    if any(run.itl_s is None for run in inputs.runs):
        note += " ITL needs token times, which a summary or a results file does not keep."
    return Figure("latency", "Latency: the share of requests within each time", chart, note)


def _phases(run: RunView) -> list[dict[str, Any]]:
    """An even sample of the run's completed requests, each phase one row: run, request, phase, its start
    and end (s from the run's start) and its length (ms)."""
    frame = run.requests[run.requests["ok"].astype(bool)]
    picks = frame.iloc[np.unique(np.linspace(0, len(frame) - 1, min(TIMELINE_REQUESTS, len(frame))).astype(int))] \
        if len(frame) else frame
    engine = picks["prefill_start_s"].notna().all() and picks["engine_done_s"].notna().all()
    # With an application, the time before the model call (its stages; an agent's earlier calls and their
    # tools before its last call) and its stages after the model's last token (files
    # written before these columns have neither).
    calls = picks["model_call_s"] if "model_call_s" in picks else picks["send_s"]
    last_tokens = picks["last_token_s"] if "last_token_s" in picks else picks["last_byte_s"]
    staged = {"before the call": bool((calls > picks["send_s"]).any()),
              "after the stream": bool((picks["last_byte_s"] > last_tokens).any())}
    rows = []
    for row, call_s, last_token_s in zip(picks.itertuples(), calls, last_tokens):
        if engine:
            phases = [("before the call", row.send_s, call_s),
                      ("queue", call_s, row.prefill_start_s),
                      ("prefill", row.prefill_start_s, row.first_token_s),
                      ("decode", row.first_token_s, row.engine_done_s),
                      ("delivery", row.engine_done_s, last_token_s),
                      ("after the stream", last_token_s, row.last_byte_s)]
            phases = [phase for phase in phases if staged.get(phase[0], True)]
        else:
            phases = [("to first token", row.send_s, row.first_token_s),
                      ("streaming", row.first_token_s, row.last_byte_s)]
        rows += [{"run": run.label, "request": int(row.request), "phase": phase, "start_s": float(a),
                  "end_s": float(max(a, b)), "ms": float(max(0.0, b - a)) * 1e3} for phase, a, b in phases]
    return rows


def timeline(inputs: Inputs) -> Figure | None:
    """Per request, its phases as bars over the run's time (an even sample of the requests), and beside
    it each phase's length on a scale of its own: queue, prefill and delivery take milliseconds where
    decode takes seconds, too thin to see on the run's scale."""
    # A run where every request failed has none to draw.
    drawn = [(run, rows) for run in inputs.runs if run.requests is not None and (rows := _phases(run))]
    if not drawn:
        return None
    alt = _alt()
    colors = {"before the call": APPLICATION_COLOR, "queue": "#9e9e9e", "prefill": "#f58518", "decode": "#4c78a8",
              "delivery": "#54a24b", "after the stream": "#d6a5c9", "to first token": "#f58518", "streaming": "#4c78a8"}
    # Two runs on the same scales: each phase's longest of both, the later end of both.
    every = [row for _, rows in drawn for row in rows]
    longest = {phase: max(row["ms"] for row in every if row["phase"] == phase)
               for phase in colors if any(row["phase"] == phase for row in every)}
    end_s = max(row["end_s"] for row in every)
    views = []
    for run, rows in drawn:
        order = [phase for phase in colors if any(row["phase"] == phase for row in rows)]
        color = alt.Color("phase:N", sort=order, scale=alt.Scale(domain=order, range=[colors[p] for p in order]))
        tooltip = ["request", "phase", alt.Tooltip("start_s:Q", format=",.4~r"), alt.Tooltip("ms:Q", format=",.4~r")]
        base = alt.Chart(_frame(rows)).mark_bar(height=3)
        over_time = base.encode(
            x=alt.X("start_s:Q", title="time from the run's start (s)", axis=alt.Axis(format=NUMBER),
                    scale=alt.Scale(domain=[0, end_s])), x2="end_s:Q",
            y=alt.Y("request:O", title="request", axis=alt.Axis(labels=False, ticks=False)),
            color=color, tooltip=tooltip).properties(width=TIMELINE_WIDTH, height=300)
        lengths = [base.transform_filter(alt.datum.phase == phase).encode(
            x=alt.X("ms:Q", title=f"{phase} (ms)", axis=alt.Axis(format=NUMBER, tickCount=3),
                    scale=alt.Scale(domain=[0, longest[phase] or 1.0])),
            y=alt.Y("request:O", axis=None), color=color, tooltip=tooltip,
        ).properties(width=PHASE_WIDTH, height=300) for phase in order]
        view = alt.hconcat(over_time, *lengths, spacing=12).resolve_scale(y="shared")
        views.append(view.properties(title=run.label) if len(drawn) > 1 else view)
    chart = alt.vconcat(*views) if len(views) > 1 else views[0]
    return Figure("timeline", "Requests over time: queue, prefill, decode and delivery", chart,
                  f"An even sample of up to {TIMELINE_REQUESTS} completed requests, one line each: over the run's "
                  "time, and beside it each phase's length on a scale of its own (queue: sent to its first step; "
                  "prefill: to its first token at the client; decode: to the step that made its last token; "
                  "delivery: to its last byte; with an application, before the call: its stages before the model "
                  "call, and an agent's earlier calls and tools before its last; after the stream: its stages "
                  "after the model's last token). Measured runs show the wait for the first token and the "
                  "streaming after it.")


def reader(inputs: Inputs) -> Figure | None:
    """One typical request's tokens as they arrive, against a person reading them."""
    runs = [run for run in inputs.runs if run.reader]
    if not runs:
        return None
    alt = _alt()
    rows = []
    for run in runs:
        spec = continuity.ContinuitySpec.of_block(run.summary.get("continuity"))
        arrivals = np.asarray(run.reader["arrival_s"], np.float64)
        read = continuity.read_s(arrivals, run.reader["first_visible_s"], spec)
        reader_line = f"read ({spec.reading_tokens_per_s:.1f} tokens/s from {format_duration(spec.expected_ttft_s)})"
        label = f"{run.label}: request {run.reader['request']}"
        rows += [{"run": label, "line": "arrived at the client", "s": float(t), "tokens": k + 1}
                 for k, t in enumerate(arrivals)]
        rows += [{"run": label, "line": reader_line, "s": float(t), "tokens": k + 1} for k, t in enumerate(read)]
    chart = alt.Chart(_frame(rows)).mark_line(interpolate="step-after").encode(
        x=alt.X("s:Q", title="time since the request was sent (s)", axis=alt.Axis(format=NUMBER)),
        y=alt.Y("tokens:Q", title="tokens", axis=alt.Axis(format=NUMBER)),
        color=alt.Color("line:N", title=None),
    )
    if len(runs) > 1:  # one run needs no key for its dashes
        chart = chart.encode(strokeDash=alt.StrokeDash("run:N", title=None))
    which = f"Request {runs[0].reader['request']}, the" if len(runs) == 1 else "Each run's request with the"
    return Figure("reader", "Token delivery against a reader", chart.properties(width=WIDTH, height=260),
                  f"{which} median E2E. The reader starts at the first visible text or at the expected TTFT, "
                  "whichever is later, and reads one token after another, as the QoE numbers count it. Where the "
                  "arrival line runs left of the reader's, text is ready before a person reads it; where they "
                  "touch, the reader waits (a stall).")


def steps(inputs: Inputs) -> Figure | None:
    runs = [run for run in inputs.runs if run.steps is not None and len(run.steps)]
    if not runs:
        return None
    alt = _alt()
    import pandas as pd

    data = pd.concat([run.steps.assign(run=run.label, step_ms=run.steps["step_s"] * 1e3) for run in runs],
                     ignore_index=True)
    base = alt.Chart(data).encode(
        x=alt.X("start_s:Q", title="time from the run's start (s)", axis=alt.Axis(format=NUMBER)),
        color=alt.Color("run:N", scale=_runs_scale(runs)),
    ).properties(width=WIDTH, height=160)
    batch = base.mark_line(strokeWidth=1).encode(
        y=alt.Y("seqs:Q", title="batch (sequences)", axis=alt.Axis(format=NUMBER)))
    step = base.mark_point(size=6, filled=True, opacity=0.5).encode(
        y=alt.Y("step_ms:Q", title="step time (ms)", axis=alt.Axis(format=NUMBER)))
    return Figure("steps", "The engine over the run: batch size and step time", alt.vconcat(batch, step),
                  "Every engine step, or an even sample of them; replicas overlaid.")


ROOFLINE_HEIGHT = 320
LABEL_FONT_PX, LABEL_DX_PX = 10, 7
LABEL_CHAR_PX = 6            # a generous width of one character of the labels' font
LABEL_LINE_PX = 12           # labels closer than this in y (and overlapping in x) would collide


def _decades(low: float, high: float) -> tuple[float, float]:
    """The powers of ten around [low, high], in log10: the domain of a log axis."""
    return float(np.floor(np.log10(low))), float(np.ceil(np.log10(high)))


def label_positions(points: list[tuple[str, float, float]]) -> list[float]:
    """The y pixel of each point's label (points: text, x px, y px; a label starts LABEL_DX_PX right of
    its point) so that no two overlap: each in turn from the top takes the free spot nearest its
    point's height, in steps of one line down or up."""
    placed: list[tuple[float, float, float]] = []  # left, right, y of the labels placed so far
    ys = [0.0] * len(points)
    for k in sorted(range(len(points)), key=lambda k: points[k][2]):
        text, x_px, y_px = points[k]
        left, right = x_px + LABEL_DX_PX, x_px + LABEL_DX_PX + LABEL_CHAR_PX * len(text)
        for step in range(2 * len(points) + 1):
            y = y_px + LABEL_LINE_PX * ((step + 1) // 2) * (1 if step % 2 else -1)  # 0, +1, -1, +2, -2 lines
            if all(abs(y - y_other) >= LABEL_LINE_PX or right <= left_other or right_other <= left
                   for left_other, right_other, y_other in placed):
                break
        placed.append((left, right, y))
        ys[k] = y
    return ys


def roofline(inputs: Inputs) -> Figure | None:
    runs = [run for run in inputs.runs if run.explain and run.explain.get("roof")]
    if not runs:
        return None
    alt = _alt()
    run = runs[0]
    step, roof = run.explain, run.explain["roof"]
    ops = [op for op in step["ops"] if op["flops"] > 0 and op["bytes"] > 0 and op["time_s"] > 0]
    if not ops:
        return None
    rows = [{"op": op["op"], "bound": op["bound"], "intensity": op["flops"] / op["bytes"],
             "tflops": op["flops"] / op["time_s"] / 1e12, "ms": op["time_s"] * 1e3} for op in ops]
    ridge = roof["flops_per_s"] / roof["hbm_bytes_per_s"]
    low = min(min(r["intensity"] for r in rows) / 2, ridge)
    high = max(max(r["intensity"] for r in rows) * 2, ridge)
    xs = np.geomspace(low, high, 60).tolist() + [ridge]
    roofs = [{"intensity": x, "tflops": min(roof["flops_per_s"], x * roof["hbm_bytes_per_s"]) / 1e12}
             for x in sorted(xs)]
    # The axes' domains are set here, so each label's pixel position is known and labels are kept apart.
    x_domain = _decades(low, high)
    y_domain = _decades(min(r["tflops"] for r in rows + roofs), max(r["tflops"] for r in rows + roofs))

    def pixel(value: float, domain: tuple[float, float], size: float) -> float:
        return (np.log10(value) - domain[0]) / (domain[1] - domain[0]) * size

    points_px = [(r["op"], pixel(r["intensity"], x_domain, WIDTH),
                  ROOFLINE_HEIGHT - pixel(r["tflops"], y_domain, ROOFLINE_HEIGHT)) for r in rows]
    for r, y_px in zip(rows, label_positions(points_px)):
        r["label_tflops"] = 10 ** (y_domain[1] - y_px / ROOFLINE_HEIGHT * (y_domain[1] - y_domain[0]))
    log_x = alt.Scale(type="log", domain=[10 ** x_domain[0], 10 ** x_domain[1]], nice=False)
    log_y = alt.Scale(type="log", domain=[10 ** y_domain[0], 10 ** y_domain[1]], nice=False)
    line = alt.Chart(_frame(roofs)).mark_line(color="#888").encode(
        x=alt.X("intensity:Q", scale=log_x, title="arithmetic intensity (FLOP per byte of HBM)",
                axis=alt.Axis(format=NUMBER)),
        y=alt.Y("tflops:Q", scale=log_y, title="TFLOP/s", axis=alt.Axis(format=NUMBER)))
    points = alt.Chart(_frame(rows)).mark_circle(size=90).encode(
        x="intensity:Q", y="tflops:Q", color=alt.Color("bound:N"),
        tooltip=["op", "bound", alt.Tooltip("ms:Q", format=",.3~r"), alt.Tooltip("tflops:Q", format=",.3~r")])
    labels = points.mark_text(align="left", baseline="middle", dx=LABEL_DX_PX, fontSize=LABEL_FONT_PX).encode(
        y="label_tflops:Q", text="op:N", color=alt.value("#333"))
    shape = step["shape"]
    return Figure("roofline", f"The roofline of one step: {shape['tokens']:,} tokens from {shape['sequences']:,} "
                  "sequences", (line + points + labels).properties(width=WIDTH, height=ROOFLINE_HEIGHT),
                  "Each op of one steady-state step (as --explain): achieved FLOP/s against FLOPs per byte. Ops on "
                  "the sloped roof are memory-bound, on the flat one compute-bound; below both, fixed kernel costs. "
                  "A label that would cover another's sits a line or more below or above its point.")


def tornado(inputs: Inputs) -> Figure | None:
    """Each lever's change of the objective, largest first."""
    if inputs.levers is None:
        return None
    alt = _alt()
    objective = inputs.levers["objective"]["name"]
    rows = [{"lever": lever["name"], "group": str(lever.get("group", "")), "change": float(change)}
            for lever in inputs.levers["levers"] if (change := lever["change"].get("relative")) is not None]
    if not rows:
        return None
    order = [r["lever"] for r in sorted(rows, key=lambda r: -abs(r["change"]))]
    chart = alt.Chart(_frame(rows)).mark_bar().encode(
        x=alt.X("change:Q", title=f"change of {objective}", axis=alt.Axis(format="+.2~%")),  # (-0.4%, not -0%)
        y=alt.Y("lever:N", sort=order, title=None),
        color=alt.Color("group:N"),
        tooltip=["lever", "group", alt.Tooltip("change:Q", format="+.1%")],
    ).properties(width=WIDTH, height=22 * len(rows))
    return Figure("levers", f"Levers: what each change does to {objective}", chart,
                  "One bar per lever, the largest change first (negative: the objective falls).")


SWEEP_X, SWEEP_Y = "throughput.output_tokens_per_s", "latency_s.e2e.p99"


def pareto(inputs: Inputs) -> Figure | None:
    """The sweep's points: throughput against tail latency, the Pareto front joined."""
    frame = inputs.sweep
    if frame is None or SWEEP_X not in frame or SWEEP_Y not in frame:
        return None
    from tokenpath.sweep.point import axis_columns

    alt = _alt()
    axes = axis_columns(list(frame.columns))
    data = frame[[*axes, SWEEP_X, SWEEP_Y]].copy()
    # (records keep each column's type: a row of mixed columns, as iterrows gives, makes every number a float)
    data["point"] = [", ".join(f"{a}={row[a]}" for a in axes) for row in data[axes].to_dict("records")]
    data["e2e_p99_s"], data["tokens_per_s"] = data[SWEEP_Y], data[SWEEP_X]
    ordered = data.sort_values(["tokens_per_s", "e2e_p99_s"], ascending=[False, True])
    best, front = np.inf, []
    for index, row in ordered.iterrows():  # most throughput first: a point is on the front if faster than all before
        if row["e2e_p99_s"] < best:
            best = row["e2e_p99_s"]
            front.append(index)
    data["on the Pareto front"] = data.index.isin(front)
    points = alt.Chart(data[["point", "tokens_per_s", "e2e_p99_s", "on the Pareto front"]]).mark_circle(size=70).encode(
        x=alt.X("tokens_per_s:Q", title="output tokens/s", axis=alt.Axis(format=NUMBER)),
        y=alt.Y("e2e_p99_s:Q", title="E2E p99 (s)", axis=alt.Axis(format=NUMBER)),
        color=alt.Color("on the Pareto front:N"),
        tooltip=["point", alt.Tooltip("tokens_per_s:Q", format=",.3~r"), alt.Tooltip("e2e_p99_s:Q", format=",.3~r")])
    line = alt.Chart(data.loc[front, ["tokens_per_s", "e2e_p99_s"]]).mark_line(color="#54a24b").encode(
        x="tokens_per_s:Q", y="e2e_p99_s:Q")
    return Figure("sweep", f"Sweep {inputs.sweep_name}: throughput against tail latency",
                  (line + points).properties(width=WIDTH, height=320),
                  f"{len(data)} points over {', '.join(axes) or 'no axis'}; the line joins those no other point beats "
                  "on both.")


def search_front(inputs: Inputs) -> Figure | None:
    """A search's candidates at their capacity: requests/s per chip against TTFT p99, the front joined."""
    from tokenpath.sweep.pareto import frontier

    search = inputs.search
    if search is None or not search["candidates"]:
        return None
    alt = _alt()
    rows = [{"candidate": f"{row['layout']}, {row['engine']}, {row['limits']}", "rank": row["rank"],
             "layout": f"{row['rank']}. {row['layout']}",
             "per_chip": row["request_rate_per_chip"], "ttft_p99_ms": row["ttft_p99_s"] * 1e3}
            for row in search["candidates"]]
    front = {id(row) for row in frontier(rows, [("per_chip", "max"), ("ttft_p99_ms", "min")])}
    for row in rows:
        row["on the Pareto front"] = id(row) in front
    data = _frame(rows)
    points = alt.Chart(data).mark_circle(size=80).encode(
        x=alt.X("per_chip:Q", title="requests/s per chip at capacity", axis=alt.Axis(format=NUMBER),
                scale=alt.Scale(zero=False)),
        y=alt.Y("ttft_p99_ms:Q", title="TTFT p99 at capacity (ms)", axis=alt.Axis(format=NUMBER),
                scale=alt.Scale(zero=False)),
        color=alt.Color("on the Pareto front:N"),
        tooltip=["rank", "candidate", alt.Tooltip("per_chip:Q", format=",.3~r"),
                 alt.Tooltip("ttft_p99_ms:Q", format=",.3~r")])
    line = alt.Chart(data[data["on the Pareto front"]].sort_values("per_chip")).mark_line(color="#54a24b").encode(
        x="per_chip:Q", y="ttft_p99_ms:Q")
    labels = points.mark_text(align="left", baseline="middle", dx=LABEL_DX_PX, fontSize=LABEL_FONT_PX).encode(
        text="layout:N", color=alt.value("#333"))
    question = search["question"]
    return Figure("search", f"Search: {question['model']} on {question['chips']}x {question['chip']}, each candidate "
                  "at its capacity", (line + points + labels).properties(width=WIDTH, height=320),
                  f"{len(rows)} candidates searched in full; the line joins those no other beats on both "
                  "(more requests per chip, a lower TTFT p99). Candidates pruned, screened out or close to the "
                  "best have no capacity of their own and are left out (the JSON lists them).")


def figures(inputs: Inputs) -> list[Figure]:
    """Every figure the inputs can draw, in the report's order."""
    made = [attribution(inputs), layer_distributions(inputs), latency_cdfs(inputs), timeline(inputs),
            reader(inputs), steps(inputs), roofline(inputs), tornado(inputs), pareto(inputs), search_front(inputs)]
    return [figure for figure in made if figure is not None]
