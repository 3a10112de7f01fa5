"""compare: the relative difference per metric of two summaries."""

from __future__ import annotations

import json

import pytest

from tokenpath.errors import UserError
from tokenpath.report.compare import compare, compare_document, compare_table, load_summary, relative


def _summary(scale: float, source: str, attribution: bool) -> dict:
    stats = {"mean": 1.0 * scale, "p50": 0.5 * scale, "p90": 2.0 * scale, "p99": 3.0 * scale, "p999": 4.0 * scale}
    return {
        "schema": "tokenpath.summary/1", "source": source, "scenario": {"name": "s", "fingerprint": "f"},
        "requests": {"completed": 10, "failed": 0, "input_tokens_mean": 5.0, "output_tokens_mean": 7.0},
        "window_s": 2.0 * scale,
        "throughput": {"output_tokens_per_s": 100.0 / scale, "requests_per_s": 5.0 / scale, "goodput_requests_per_s": 0.0},
        "latency_s": {key: dict(stats) for key in ("ttft", "ttfv", "tpot", "itl", "e2e")},
        "attribution_s": {"queue": 0.1, "compute": 0.2, "traffic": 0.0, "delivery": 0.05} if attribution else None,
        "bottleneck": None,
        "continuity": {"stall_threshold_s": 0.25, "reading_tokens_per_s": 5.29, "expected_ttft_s": 1.0,
                       "stalls_per_request": 0.5 * scale, "stall_s_per_request": 0.3 * scale,
                       "requests_with_stalls": 0.2 * scale, "stall_s_max": 0.9 * scale,
                       "qoe": {"mean": 0.98 / scale, "p1": 0.5, "p10": 0.9 / scale, "p50": 1.0, "below_0_9": 0.1}},
    }


def test_relative():
    assert relative(2.0, 3.0) == pytest.approx(0.5)
    assert relative(4.0, 1.0) == pytest.approx(-0.75)
    assert relative(0.0, 0.0) == 0.0
    assert relative(0.0, 1.0) is None
    assert relative(None, 1.0) is None


def test_compare_rows():
    a, b = _summary(1.0, "simulate", True), _summary(2.0, "bench", False)
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["TTFT p50"] == {"metric": "TTFT p50", "unit": "s", "a": 0.5, "b": 1.0, "relative": 1.0}
    assert rows["E2E p99.9"]["relative"] == pytest.approx(1.0)
    assert rows["output tokens/s"]["relative"] == pytest.approx(-0.5)
    assert rows["goodput requests/s"]["relative"] == 0.0
    assert rows["requests completed"]["relative"] == 0.0
    # Attribution on one side only: the other side has none, so no difference is claimed.
    assert rows["queue (mean)"]["a"] == 0.1 and rows["queue (mean)"]["b"] is None and rows["queue (mean)"]["relative"] is None
    assert len([m for m in rows if m.startswith(("TTFT", "TTFV", "TPOT", "ITL", "E2E"))]) == 25
    document = compare_document(a, b, "a.json", "b.json")
    assert document["same_scenario"] is True and document["rows"] == compare(a, b)
    assert compare_table(a, b).row_count == len(rows)


def test_load_summary_errors(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_summary(1.0, "bench", False)))
    assert load_summary(good)["source"] == "bench"
    with pytest.raises(UserError, match="no such file"):
        load_summary(tmp_path / "missing.json")
    results = tmp_path / "r.jsonl"
    results.write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(UserError, match="tokenpath report"):
        load_summary(results)
    wrong = tmp_path / "wrong.json"
    wrong.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a tokenpath.summary/1"):
        load_summary(wrong)


def test_compare_shows_continuity():
    a, b = _summary(1.0, "simulate", True), _summary(2.0, "bench", False)
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["stalls per request"] == {"metric": "stalls per request", "unit": "", "a": 0.5, "b": 1.0, "relative": 1.0}
    assert rows["stall time per request"]["unit"] == "s" and rows["stall time per request"]["b"] == pytest.approx(0.6)
    assert rows["requests with stalls"]["relative"] == pytest.approx(1.0)
    assert rows["QoE mean"]["a"] == 0.98 and rows["QoE mean"]["relative"] == pytest.approx(-0.5)
    assert rows["QoE p10"]["b"] == pytest.approx(0.45)
    assert "stall threshold" not in rows  # the same settings on both sides
    b["continuity"]["stall_threshold_s"] = 0.5
    rows = {row["metric"]: row for row in compare(a, b)}
    assert (rows["stall threshold"]["a"], rows["stall threshold"]["b"]) == (0.25, 0.5)
    table = compare_table(a, b)
    assert "QoE p10" in table.columns[0]._cells and table.columns[1]._cells[table.columns[0]._cells.index("QoE p10")] == "0.9"
    # A summary without the block (an older file): the rows are there, unknown on that side.
    del a["continuity"]
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["QoE mean"]["a"] is None and rows["QoE mean"]["relative"] is None


@pytest.mark.parametrize("field, value, shown", [
    (("latency_s", "ttft", "p50"), "12 ms", "'12 ms'"),
    (("throughput", "requests_per_s"), [5.0], "[5.0]"),
    (("requests", "failed"), True, "True"),
    (("continuity", "qoe", "p10"), float("nan"), "nan"),
])
def test_report_and_compare_name_a_metric_that_is_not_a_number(field, value, shown, tmp_path, monkeypatch, capsys):
    """A summary off the schema is bad input: both commands refuse it with the same line, naming the field."""
    from cli_helpers import assert_user_error, run_cli

    document = _summary(1.0, "bench", True)
    parent = document
    for key in field[:-1]:
        parent = parent[key]
    parent[field[-1]] = value
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps(document))
    good.write_text(json.dumps(_summary(1.0, "simulate", True)))
    lines = [assert_user_error(*run_cli(argv, monkeypatch, capsys), "bad.json", f"{'.'.join(field)} is {shown}", "not a number")
             for argv in (["report", str(bad)], ["compare", str(good), str(bad)])]
    assert lines[0] == lines[1]


def test_report_and_compare_show_an_unknown_metric_alike(tmp_path, monkeypatch, capsys):
    """null (unknown) is '-' in report's table and compare's, with no difference claimed."""
    from cli_helpers import run_cli

    document = _summary(1.0, "bench", True)
    document["latency_s"]["ttft"]["p50"] = None
    document["throughput"]["goodput_requests_per_s"] = None
    unknown, good = tmp_path / "unknown.json", tmp_path / "good.json"
    unknown.write_text(json.dumps(document))
    good.write_text(json.dumps(_summary(1.0, "simulate", True)))
    code, out, err = run_cli(["report", str(unknown)], monkeypatch, capsys)
    assert code == 0, err
    ttft = next(line for line in out.splitlines() if "TTFT" in line).split("│")
    assert [cell.strip() for cell in ttft[2:4]] == ["1 s", "-"]  # mean, p50
    assert next(line for line in out.splitlines() if "goodput" in line).split("│")[2].strip() == "-"
    code, out, err = run_cli(["compare", str(good), str(unknown)], monkeypatch, capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if "TTFT p50" in line).split("│")
    assert [cell.strip() for cell in row[2:5]] == ["500 ms", "-", "n/a"]
