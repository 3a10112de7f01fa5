"""Per-request results and the HTML report: the rows reproduce the summary, and the report, opened in
headless Chromium, logs no error, fetches nothing from the network, draws every chart and shows the
JSON's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from browser import chromium, in_ci, open_page
from cli_helpers import assert_user_error, run_cli
from report_helpers import assert_means_match
from tokenpath.config.units import format_duration, format_number
from tokenpath.report.requests import read_results_table

SMALL = ["--num-requests", "60", "--input-len", "200", "--output-len", "40", "--warmup-requests", "5"]

# What the page reports back: for each chart, how many data marks it drew (axes, legends and titles
# left out), and every number shown with its summary key and value.
PROBE = """window.tokenpathRendered.then(() => ({
  charts: [...document.querySelectorAll('div.chart')].map(el => ({
    name: el.dataset.name,
    marks: [...el.querySelectorAll('g.role-mark')]
      .filter(g => !g.closest('.role-axis, .role-legend, .role-title'))
      .reduce((n, g) => n + g.children.length, 0)})),
  numbers: [...document.querySelectorAll('td[data-key]')].map(td => [td.dataset.key, td.dataset.value, td.textContent]),
}))"""


class _Quiet:  # capsys is function-scoped; the CLI writes through rich consoles bound to sys.stdout
    def readouterr(self):
        return "", ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two small simulated runs (the second at a higher rate), with results, HTML and PNGs of the first."""
    folder = tmp_path_factory.mktemp("report")
    mp = pytest.MonkeyPatch()

    a, b = folder / "a.json", folder / "b.json"
    code, _, _ = run_cli(["simulate", *SMALL, "--json", str(a), "--results", str(folder / "a.parquet"),
                          "--html", str(folder / "a.html"), "--png", str(folder / "png")], mp, _Quiet())
    assert code == 0
    code, _, _ = run_cli(["simulate", *SMALL, "--request-rate", "60", "--json", str(b)], mp, _Quiet())
    assert code == 0
    mp.undo()
    return folder


def test_results_reproduce_the_summary(runs):
    summary = json.loads((runs / "a.json").read_text())
    frame, embedded, lines = read_results_table(str(runs / "a.parquet"))
    assert embedded == summary and dict(lines)["model"].startswith("llama-3.1-70b")
    assert len(frame) == 60 and frame["warmup"].sum() == 5
    assert_means_match(frame, summary)
    # The engine's times sit in order inside each request's life.
    kept = frame[frame["ok"]]
    assert (kept["send_s"] <= kept["prefill_start_s"]).all() and (kept["prefill_start_s"] < kept["first_token_s"]).all()
    assert (kept["engine_done_s"] < kept["last_byte_s"]).all()
    assert (frame["replica"] == 0).all() and (frame["preemptions"] == 0).all()


def test_results_formats_and_errors(runs, monkeypatch, capsys, tmp_path):
    for name in ("r.csv", "r.jsonl"):
        code, out, err = run_cli(["simulate", *SMALL, "--results", str(tmp_path / name)], monkeypatch, capsys)
        assert code == 0, err
        frame, _, _ = read_results_table(str(tmp_path / name))
        assert_means_match(frame, json.loads((runs / "a.json").read_text()))
    assert_user_error(*run_cli(["simulate", "--results", str(tmp_path / "r.xlsx")], monkeypatch, capsys),
                      "--results", ".parquet")
    # refused before the run: stdout, an empty path, and the --json file's path
    assert_user_error(*run_cli(["simulate", "--results", "-"], monkeypatch, capsys),
                      "--results -: per-request results are written to a file", "not to stdout")
    assert_user_error(*run_cli(["simulate", "--results", ""], monkeypatch, capsys), "--results ''", "the path is empty")
    assert_user_error(*run_cli(["simulate", "--json", ""], monkeypatch, capsys), "--json ''", "the path is empty")
    same = str(tmp_path / "both.jsonl")
    assert_user_error(*run_cli(["simulate", "--results", same, "--json", same], monkeypatch, capsys),
                      "the same file as --json; give each its own path")
    assert not Path(same).exists()
    # a sweep's rows written as CSV: named as such, with the form report reads
    (tmp_path / "sweep.csv").write_text("deployment.tp,latency_s.ttft.p99\n8,0.5\n", encoding="utf-8")
    assert_user_error(*run_cli(["report", str(tmp_path / "sweep.csv"), "--html", str(tmp_path / "s.html")],
                               monkeypatch, capsys),
                      "sweep.csv: a sweep's table written as .csv; report reads a sweep from its .parquet")
    assert_user_error(*run_cli(["report", str(runs / "a.json"), "--html", str(tmp_path / "x.txt")],
                               monkeypatch, capsys), "--html", ".html")
    both = str(tmp_path / "both.html")  # refused before the run, not after it wrote the page
    assert_user_error(*run_cli(["simulate", *SMALL, "--html", both, "--png", both], monkeypatch, capsys),
                      "--png", "the same path as --html")
    assert not Path(both).exists()
    assert_user_error(*run_cli(["report", str(tmp_path / "none.json"), "--html", str(tmp_path / "x.html")],
                               monkeypatch, capsys), "no such results file")
    junk = tmp_path / "junk.json"
    junk.write_text('{"schema": "other/1"}')
    assert_user_error(*run_cli(["report", str(junk), "--html", str(tmp_path / "x.html")], monkeypatch, capsys),
                      "not a tokenpath.summary/1")


def test_png_figures(runs):
    names = sorted(path.name for path in (runs / "png").iterdir())
    assert names == ["01-attribution.png", "02-layers.png", "03-latency.png", "04-timeline.png", "05-reader.png",
                     "06-steps.png", "07-roofline.png"]
    for name in names:
        data = (runs / "png" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _fixtures(runs: Path) -> tuple[Path, Path]:
    """A levers JSON written by `tokenpath levers --json` (two levers of a small run), and a sweep Parquet in
    the schema `tokenpath sweep` writes."""
    if not (runs / "levers.json").exists():
        mine = runs / "mine.toml"
        mine.write_text('[[levers]]\nname = "tp 4"\ngroup = "deployment"\noverrides = { "deployment.tp" = 4 }\n'
                        '[[levers]]\nname = "far client"\ngroup = "mine"\n'
                        'overrides = { "delivery.network_rtt" = "200 ms" }\n', encoding="utf-8")
        mp = pytest.MonkeyPatch()
        args = ["levers", *SMALL, "--levers", str(mine), "--no-catalog", "--workers", "1", "--draws", "1",
                "--objective", "latency_s.e2e.p99", "--json", str(runs / "levers.json")]
        code, _, err = run_cli(args, mp, _Quiet())
        mp.undo()
        assert code == 0, err
    # As a sweep writes its table: each point's id and the sweep's, its axes, then the summary from `schema` on.
    rows = {"point": ["a", "b", "c", "d"], "sweep": ["s"] * 4,
            "deployment.tp": [1, 1, 2, 2], "workload.arrival.rate": [10.0, 20.0, 40.0, 80.0], "schema": ["x"] * 4,
            "throughput.output_tokens_per_s": [400.0, 800.0, 1500.0, 1450.0],
            "latency_s.e2e.p99": [2.0, 2.5, 4.0, 9.0], "latency_s.ttft.p99": [0.1, 0.2, 0.3, 0.9]}
    pq.write_table(pa.table(rows), runs / "sweep.parquet")
    return runs / "levers.json", runs / "sweep.parquet"


def test_overlay_levers_and_sweep_report(runs, monkeypatch, capsys):
    levers, sweep = _fixtures(runs)
    out = runs / "both.html"
    code, _, err = run_cli(["report", str(runs / "a.json"), str(runs / "b.json"), str(levers), str(sweep),
                            "--html", str(out)], monkeypatch, capsys)
    assert code == 0, err
    text = out.read_text()
    assert "a.json" in text and "b.json" in text and "Levers" in text and "Sweep" in text


def test_two_runs_are_named_by_what_differs(runs, monkeypatch, capsys, tmp_path):
    """The second run differs in its request rate only: each run's name says its own, the page says both."""
    from tokenpath.report.views import load_inputs

    a, b = json.loads((runs / "a.json").read_text()), json.loads((runs / "b.json").read_text())
    rate = format_number(a["resolved"]["workload"]["rate_per_s"], 6)
    labels = [run.label for run in load_inputs([str(runs / "a.json"), str(runs / "b.json")]).runs]
    assert labels == [f"a.json (rate {rate}/s)", "b.json (rate 60/s)"]
    out = tmp_path / "two.html"
    code, _, err = run_cli(["report", str(runs / "a.json"), str(runs / "b.json"), "--html", str(out)],
                           monkeypatch, capsys)
    assert code == 0, err
    text = out.read_text()
    assert f"<h1>tokenpath report: a.json (rate {rate}/s) vs b.json (rate 60/s)</h1>" in text
    assert f"The runs differ in:</b> rate {rate}/s vs 60/s</p>" in text
    # Files without the resolved scenario (from before it): named by their fingerprints.
    for name, summary in (("old-a.json", a), ("old-b.json", b)):
        del summary["resolved"]
        (tmp_path / name).write_text(json.dumps(summary))
    labels = [run.label for run in load_inputs([str(tmp_path / "old-a.json"), str(tmp_path / "old-b.json")]).runs]
    assert labels == [f"old-a.json (scenario {a['scenario']['fingerprint'][:12]})",
                      f"old-b.json (scenario {b['scenario']['fingerprint'][:12]})"]
    # One scenario twice: the file names alone.
    assert [run.label for run in load_inputs([str(runs / "a.json"), str(tmp_path / "old-a.json")]).runs] == \
        ["a.json", "old-a.json"]


def _check_page(path: Path, summaries: list[dict], expected_charts: list[str]) -> None:
    page = open_page(path.resolve().as_uri(), PROBE)
    assert page["errors"] == []
    assert page["requests"] and all(url.startswith(("file:", "data:")) for url in page["requests"]), page["requests"]
    charts = page["value"]["charts"]
    assert [chart["name"] for chart in charts] == expected_charts
    assert all(chart["marks"] > 0 for chart in charts), charts
    numbers = page["value"]["numbers"]
    assert len(numbers) > 30 * len(summaries)
    for key, value, text in numbers:
        run, dotted = key.split(":")
        expected = summaries[int(run)]
        for part in dotted.split("."):
            expected = expected[part]
        if expected is None:
            assert text == "-"
            continue
        assert float(value) == expected
        if dotted.startswith(("latency_s", "attribution_s", "window_s")) or dotted.endswith("_s_per_request") \
                or dotted.endswith("_s_max"):
            assert text == format_duration(expected), (key, text)
        elif dotted.endswith(("requests_with_stalls", "below_0_9", "hit_rate")):  # shares
            assert text == f"{expected:.1%}", (key, text)
        else:
            assert text == format_number(expected), (key, text)


@pytest.mark.skipif(chromium() is None and not in_ci(), reason="needs Debian's chromium (.ci/run installs it)")
def test_html_report_in_a_browser(runs, monkeypatch, capsys):
    html = (runs / "a.html").read_text()
    assert "<script src" not in html and "<link" not in html  # nothing to fetch
    summary = json.loads((runs / "a.json").read_text())
    _check_page(runs / "a.html", [summary], ["attribution", "layers", "latency", "timeline", "reader", "steps",
                                               "roofline"])
    levers, sweep = _fixtures(runs)
    out = runs / "overlay.html"
    code, _, err = run_cli(["report", str(runs / "a.json"), str(runs / "b.json"), str(levers), str(sweep),
                            "--html", str(out)], monkeypatch, capsys)
    assert code == 0, err
    _check_page(out, [summary, json.loads((runs / "b.json").read_text())],
                ["attribution", "latency", "levers", "sweep"])  # summaries alone: no rows, steps or roofline


def test_a_levers_file_is_checked_for_its_objective_and_changes(runs, monkeypatch, capsys, tmp_path):
    """A levers JSON whose objective or a lever's change is not the object `levers --json` writes is a
    one-line error, not a chart with no bars."""
    levers, _ = _fixtures(runs)
    document = json.loads(levers.read_text())
    for broken, fragment in [({**document, "objective": "latency_s.e2e.p99"}, "'objective' must be an object"),
                             ({**document, "levers": [{**document["levers"][0], "change": -0.25}]},
                              "levers[0] has no 'change' object")]:
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(broken))
        assert_user_error(*run_cli(["report", str(path), "--html", str(tmp_path / "x.html")], monkeypatch, capsys),
                          fragment)


def test_tornado_and_pareto_data(runs):
    """The tornado's bars are each lever's change of the objective; the Pareto front leaves out the
    point another beats on both throughput and latency."""
    from tokenpath.report.charts import pareto, tornado
    from tokenpath.report.views import load_inputs

    levers, sweep = _fixtures(runs)
    inputs = load_inputs([str(levers), str(sweep)])
    figure = tornado(inputs)
    assert figure.title == "Levers: what each change does to latency_s.e2e.p99"
    values = {row["lever"]: row["change"] for row in next(iter(figure.chart.to_dict()["datasets"].values()))}
    document = json.loads(levers.read_text())
    base = document["baseline"]["latency_s"]["e2e"]["p99"]
    expected = {lever["name"]: (lever["summary"]["latency_s"]["e2e"]["p99"] - base) / base
                for lever in document["levers"]}
    assert values == pytest.approx(expected) and set(values) == {"tp 4", "far client"}
    assert values["far client"] > 0.05 and values["tp 4"] > 0.05  # a 200 ms RTT; replicas of half the chips
    # ticks keep a change under 1% apart from none: d3's "+.2~%" reads -0.004 as "-0.4%", not "-0%"
    assert figure.chart.to_dict()["encoding"]["x"]["axis"]["format"] == "+.2~%"
    spec = pareto(inputs).chart.to_dict()
    front = [row for data in spec["datasets"].values() for row in data if row.get("on the Pareto front") is True]
    assert sorted(row["tokens_per_s"] for row in front) == [400.0, 800.0, 1500.0]  # 1450 tokens/s at 9 s is beaten
    points = sorted(row["point"] for data in spec["datasets"].values() for row in data if "point" in row)
    assert points[0] == "deployment.tp=1, workload.arrival.rate=10.0"  # a whole-number axis as written, not 1.0
    assert np.isfinite([row["e2e_p99_s"] for row in front]).all()


@pytest.fixture(scope="module")
def simulated():
    """A small simulation's view, as `simulate --html` draws it: requests, token times, steps and roofline."""
    from tokenpath import load_scenario, simulate
    from tokenpath.report.simulation import describe
    from tokenpath.report.views import Inputs, from_simulation
    from tokenpath.sim.document import result_document

    sim = simulate(load_scenario("typical", {"workload.num_requests": 120}))
    document, _ = result_document(sim)
    return Inputs([from_simulation(sim, document, describe(sim), "typical")])


def _rows(spec: dict) -> list[dict]:
    return [row for data in spec["datasets"].values() for row in data]


def test_the_reader_starts_where_qoe_starts_it(simulated):
    """The reader's line starts at the later of the first visible text and the expected TTFT (1 s), as
    the caption and continuity.py's QoE say; one run draws no key for its dashes."""
    from tokenpath.report.charts import reader

    view = simulated.runs[0]
    figure = reader(simulated)
    spec = figure.chart.to_dict()
    read = sorted((row for row in _rows(spec) if row["line"].startswith("read")), key=lambda row: row["tokens"])
    expected_ttft = view.summary["continuity"]["expected_ttft_s"]
    assert view.reader["first_visible_s"] < expected_ttft == 1.0  # a typical request's text is there before 1 s
    assert read[0]["s"] == max(view.reader["first_visible_s"], expected_ttft)
    assert read[0]["line"] == "read (5.3 tokens/s from 1 s)" and "expected TTFT" in figure.note
    assert "strokeDash" not in spec["encoding"]
    assert {row["line"] for row in _rows(spec)} == {"arrived at the client", read[0]["line"]}  # every key has a line


def test_the_itl_curve_and_the_reader_leave_the_warm_up_out(monkeypatch):
    """With half the run a warm-up (whose ITL differs: the batch is still filling), the ITL curve's
    gaps are the summary's (its percentiles match) and the reader's request is a measured one, the
    median E2E of those, numbered as in the run."""
    from tokenpath import load_scenario, simulate
    from tokenpath.report import views
    from tokenpath.sim.document import result_document

    monkeypatch.setattr(views, "MAX_ITL_SAMPLES", 10**9)  # every gap, so the percentiles are exact
    warmup = 150
    sim = simulate(load_scenario("typical", {"workload.num_requests": 300, "workload.warmup_requests": warmup,
                                             "workload.arrival.rate": 60}))
    document, _ = result_document(sim)
    view = views.from_simulation(sim, document, [], "typical")
    itl = document["latency_s"]["itl"]
    assert np.mean(view.itl_s) == pytest.approx(itl["mean"], rel=1e-9)
    assert np.percentile(view.itl_s, [50, 99]) == pytest.approx([itl["p50"], itl["p99"]], rel=1e-9)
    assert np.mean(sim.run.itl_ns()) / 1e9 > 1.1 * itl["mean"]  # the warm-up's gaps would move it
    request = view.reader["request"]
    measured = np.sort(sim.run.e2e_ns[warmup:])
    assert request >= warmup and sim.run.e2e_ns[request] == measured[len(measured) // 2]
    assert view.reader["first_visible_s"] == sim.run.ttfv_ns[request] / 1e9


def test_the_itl_curve_counts_gaps_and_the_others_requests(simulated):
    """Each latency curve's y-axis names what it counts: ITL's samples are gaps between arrivals."""
    from tokenpath.report.charts import latency_cdfs

    spec = latency_cdfs(simulated).chart.to_dict()
    titles = {chart["title"]: chart["encoding"]["y"]["title"] for row in spec["vconcat"] for chart in row["hconcat"]}
    assert titles == {"TTFT": "share of requests at or below", "TTFV": "share of requests at or below",
                      "TPOT": "share of requests at or below", "ITL": "share of gaps at or below",
                      "E2E": "share of requests at or below"}


def test_the_readers_line_gives_the_runs_qoe():
    """The reader drawn for a late request (first text at 1.5 s, then a 3 s gap) is the timeline QoE
    counts: Andes' QoE from its read times is continuity.per_request's."""
    from tokenpath.sim import continuity
    from tokenpath.sim.continuity import read_s

    spec = continuity.ContinuitySpec(0.25, 4.0, 1.0)
    arrivals = np.array([1.5, 1.6, 1.7, 4.7, 4.8, 4.9])
    read = read_s(arrivals, 1.5, spec)
    assert read.tolist() == pytest.approx([1.5, 1.75, 2.0, 4.7, 4.95, 5.2])
    expected = spec.expected_ttft_s + np.arange(len(arrivals)) / spec.reading_tokens_per_s
    end = max(read[-1], expected[-1])
    qoe = 1 - np.maximum(read - expected, 0).sum() / (end - expected).sum()
    ns = (arrivals * 1e9).astype(np.int64)
    judged = continuity.per_request(ns, np.array([0, len(ns)]), np.array([0]), ns[:1], spec)["qoe"][0]
    assert qoe == pytest.approx(judged, rel=1e-9) and qoe < 0.9
    # Text there before the expected TTFT waits for it: the reader starts at 1 s.
    assert read_s(np.array([0.2, 0.3]), 0.2, spec).tolist() == pytest.approx([1.0, 1.25])


def test_the_timeline_shows_every_phase_on_a_scale_it_can_be_seen_at(simulated):
    """Queue, prefill and delivery take milliseconds, a few pixels at most on the run's time axis, so each
    phase also has a panel on a scale of its own: the median request's bar there is at least 3 pixels
    wide, and over 5 times as wide as over the run."""
    from tokenpath.report.charts import PHASE_WIDTH, TIMELINE_WIDTH, timeline

    spec = timeline(simulated).chart.to_dict()
    rows = _rows(spec)
    window_s = max(row["end_s"] for row in rows)
    panels = spec["hconcat"][1:]
    shown = [panel["transform"][0]["filter"] for panel in panels]
    assert shown == [f"(datum.phase === '{phase}')" for phase in ("queue", "prefill", "decode", "delivery")]
    for phase, panel in zip(("queue", "prefill", "delivery"), [panels[0], panels[1], panels[3]]):
        lengths_ms = np.array([row["ms"] for row in rows if row["phase"] == phase])
        median_ms = float(np.median(lengths_ms))
        assert panel["encoding"]["x"]["scale"]["domain"] == [0, lengths_ms.max()]
        in_panel_px = median_ms / lengths_ms.max() * PHASE_WIDTH
        assert in_panel_px >= 3.0 and in_panel_px > 5 * median_ms / 1e3 / window_s * TIMELINE_WIDTH, phase
    # The legend names the phases drawn, no more.
    assert spec["hconcat"][0]["encoding"]["color"]["scale"]["domain"] == ["queue", "prefill", "decode", "delivery"]


def test_roofline_labels_do_not_collide(simulated):
    from tokenpath.report.charts import LABEL_CHAR_PX, LABEL_DX_PX, LABEL_LINE_PX, ROOFLINE_HEIGHT, WIDTH, roofline

    spec = roofline(simulated).chart.to_dict()
    x_domain = np.log10(spec["layer"][0]["encoding"]["x"]["scale"]["domain"])
    y_domain = np.log10(spec["layer"][0]["encoding"]["y"]["scale"]["domain"])
    labels = [row for row in _rows(spec) if "op" in row]

    def px(value, domain, size):
        return (np.log10(value) - domain[0]) / (domain[1] - domain[0]) * size

    boxes = [(px(r["intensity"], x_domain, WIDTH) + LABEL_DX_PX, LABEL_CHAR_PX * len(r["op"]),
              ROOFLINE_HEIGHT - px(r["tflops"], y_domain, ROOFLINE_HEIGHT),
              ROOFLINE_HEIGHT - px(r["label_tflops"], y_domain, ROOFLINE_HEIGHT)) for r in labels]
    crowded = 0
    for k, (left, width, point_y, label_y) in enumerate(boxes):
        for left2, width2, point_y2, label_y2 in boxes[k + 1:]:
            if left < left2 + width2 and left2 < left + width:  # overlapping in x
                crowded += abs(point_y - point_y2) < LABEL_LINE_PX
                assert abs(label_y - label_y2) >= LABEL_LINE_PX - 1e-6
    assert crowded >= 1  # ops that sit closer than a line at their points: their labels were moved apart
    assert spec["layer"][2]["encoding"]["y"]["field"] == "label_tflops"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.floats(0, 560), st.floats(0, 320)), max_size=12))
def test_label_positions_never_overlap_and_stay_near_their_points(points):
    from tokenpath.report.charts import LABEL_CHAR_PX, LABEL_DX_PX, LABEL_LINE_PX, label_positions

    ys = label_positions(points)
    for k, ((text, x, y), placed) in enumerate(zip(points, ys)):
        assert abs(placed - y) <= LABEL_LINE_PX * len(points)
        for (text2, x2, _), placed2 in zip(points[k + 1:], ys[k + 1:]):
            if x + LABEL_DX_PX < x2 + LABEL_DX_PX + LABEL_CHAR_PX * len(text2) and \
                    x2 < x + LABEL_CHAR_PX * len(text):
                assert abs(placed - placed2) >= LABEL_LINE_PX


@pytest.fixture(scope="module")
def rag_run(tmp_path_factory):
    """The `rag` scenario, small: its summary, results and report."""
    folder = tmp_path_factory.mktemp("rag")
    mp = pytest.MonkeyPatch()

    class Capture:
        def readouterr(self):
            return "", ""

    code, _, _ = run_cli(["simulate", "rag", "--num-requests", "60", "--warmup-requests", "5", "--json",
                          str(folder / "rag.json"), "--results", str(folder / "rag.parquet"), "--html",
                          str(folder / "rag.html")], mp, Capture())
    mp.undo()
    assert code == 0
    return folder


def test_an_applications_rows_hold_its_layer_and_stages(rag_run):
    summary = json.loads((rag_run / "rag.json").read_text())
    frame, _, _ = read_results_table(str(rag_run / "rag.parquet"))
    kept = frame[frame["ok"] & ~frame["warmup"]]
    parts = summary["attribution_s"]
    assert kept["application_s"].mean() == pytest.approx(parts["application"], rel=1e-12)
    for stage, mean_s in parts["application_detail"].items():
        assert kept[f"application.{stage}_s"].mean() == pytest.approx(mean_s, rel=1e-12)
    layers = ("queue", "compute", "traffic", "delivery", "application")
    assert np.allclose(sum(kept[f"{layer}_s"] for layer in layers), kept["e2e_s"], rtol=0, atol=1e-9)
    # the model call goes when the stages before it are done; the format stage (5 ms) follows the last token
    assert (kept["model_call_s"] > kept["send_s"]).all()
    assert np.allclose(kept["last_byte_s"] - kept["last_token_s"], 0.005, rtol=0, atol=1e-9)
    # a results file alone gives the same attribution, its application included
    from tokenpath.report.views import _summary_of

    rebuilt = _summary_of(frame)["attribution_s"]
    assert rebuilt["application"] == pytest.approx(parts["application"])
    assert rebuilt["application_detail"] == pytest.approx(parts["application_detail"])


def test_an_applications_report_draws_its_layer_and_stages(rag_run):
    from tokenpath.report.charts import attribution, timeline
    from tokenpath.report.views import load_inputs

    inputs = load_inputs([str(rag_run / "rag.parquet")])
    bars = _rows(attribution(inputs).chart.to_dict())
    summary = json.loads((rag_run / "rag.json").read_text())
    layers = ("queue", "compute", "traffic", "delivery", "application")
    assert {row["layer"]: row["ms"] / 1e3 for row in bars} == pytest.approx(
        {layer: summary["attribution_s"][layer] for layer in layers})
    phases = {row["phase"] for row in _rows(timeline(inputs).chart.to_dict())}
    assert phases == {"before the call", "queue", "prefill", "decode", "delivery", "after the stream"}


@pytest.mark.skipif(chromium() is None and not in_ci(), reason="needs Debian's chromium (.ci/run installs it)")
def test_an_applications_html_report_in_a_browser(rag_run):
    summary = json.loads((rag_run / "rag.json").read_text())
    _check_page(rag_run / "rag.html", [summary], ["attribution", "layers", "latency", "timeline", "reader", "steps",
                                                  "roofline"])
    html = (rag_run / "rag.html").read_text()
    for stage in ("embed", "retrieve", "history", "tools", "format"):
        assert f'data-key="0:attribution_s.application_detail.{stage}"' in html
