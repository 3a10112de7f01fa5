"""compare: the relative difference per metric of two summaries."""

from __future__ import annotations

import json

import pytest

from tokenpath import load_summary
from tokenpath.config.errors import UserError
from tokenpath.report.compare import (
    application_note,
    compare,
    compare_document,
    compare_table,
    difference_line,
    relative,
    run_names,
)


def _summary(scale: float, source: str, attribution: bool) -> dict:
    stats = {"mean": 1.0 * scale, "p50": 0.5 * scale, "p90": 2.0 * scale, "p99": 3.0 * scale, "p999": 4.0 * scale}
    return {
        "schema": "tokenpath.summary/1", "source": source, "scenario": {"name": "s", "fingerprint": "f"},
        "requests": {"completed": 10, "failed": 0, "input_tokens_mean": 5.0, "output_tokens_mean": 7.0},
        "window_s": 2.0 * scale,
        "throughput": {"output_tokens_per_s": 100.0 / scale, "requests_per_s": 5.0 / scale,
                       "goodput_requests_per_s": 0.0},
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
    assert (rows["queue (mean)"]["a"] == 0.1 and rows["queue (mean)"]["b"] is None
            and rows["queue (mean)"]["relative"] is None)
    assert len([m for m in rows if m.startswith(("TTFT", "TTFV", "TPOT", "ITL", "E2E"))]) == 25
    document = compare_document(a, b, "a.json", "b.json")
    assert document["same_scenario"] is True and document["rows"] == compare(a, b)
    assert compare_table(a, b).row_count == len(rows)


def test_compare_shows_the_application_and_each_stage_either_side_has():
    a, b = _summary(1.0, "simulate", True), _summary(1.0, "simulate", True)
    a["attribution_s"] |= {"application": 0.04, "application_detail": {"embed": 0.01, "retrieve": 0.03}}
    b["attribution_s"] |= {"application": 0.02, "application_detail": {"embed": 0.01, "rerank": 0.01}}
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["application (mean)"]["relative"] == pytest.approx(-0.5)
    assert rows["  embed (mean)"]["relative"] == 0.0
    assert rows["  retrieve (mean)"]["b"] is None and rows["  rerank (mean)"]["a"] is None
    plain = {row["metric"] for row in compare(_summary(1.0, "simulate", True), _summary(1.0, "bench", False))}
    assert "application (mean)" not in plain


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


@pytest.mark.parametrize("key, value, fragment", [
    ("throughput", None, "the summary has no 'throughput' object (throughput is None)"),
    ("requests", -5, "the summary has no 'requests' object (requests is -5)"),
    ("latency_s", {"ttft": 0.5}, "latency_s.ttft is 0.5, not an object"),
    ("continuity", {"qoe": 0.9}, "continuity.qoe is 0.9, not an object"),
    ("load", [1], "load is [1], not an object"),
])
def test_compare_refuses_a_summary_field_of_the_wrong_type_in_one_line(key, value, fragment, tmp_path, monkeypatch,
                                                                        capsys):
    from cli_helpers import assert_user_error, run_cli

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_summary(1.0, "bench", False)))
    bad.write_text(json.dumps({**_summary(1.0, "bench", False), key: value}))
    assert_user_error(*run_cli(["compare", str(good), str(bad)], monkeypatch, capsys), "bad.json: ", fragment,
                      "the file is damaged")


def test_compare_shows_continuity():
    a, b = _summary(1.0, "simulate", True), _summary(2.0, "bench", False)
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["stalls per request"] == {"metric": "stalls per request", "unit": "", "a": 0.5, "b": 1.0,
                                          "relative": 1.0}
    assert rows["stall time per request"]["unit"] == "s" and rows["stall time per request"]["b"] == pytest.approx(0.6)
    assert rows["requests with stalls"]["relative"] == pytest.approx(1.0)
    assert rows["QoE mean"]["a"] == 0.98 and rows["QoE mean"]["relative"] == pytest.approx(-0.5)
    assert rows["QoE p10"]["b"] == pytest.approx(0.45)
    assert "stall threshold" not in rows  # the same settings on both sides
    b["continuity"]["stall_threshold_s"] = 0.5
    rows = {row["metric"]: row for row in compare(a, b)}
    assert (rows["stall threshold"]["a"], rows["stall threshold"]["b"]) == (0.25, 0.5)
    table = compare_table(a, b)
    assert ("QoE p10" in table.columns[0]._cells
            and table.columns[1]._cells[table.columns[0]._cells.index("QoE p10")] == "0.9")
    # A summary without the block (an older file): the rows are there, unknown on that side.
    del a["continuity"]
    rows = {row["metric"]: row for row in compare(a, b)}
    assert rows["QoE mean"]["a"] is None and rows["QoE mean"]["relative"] is None


def _resolved(tp: int, pp: int, detokenize: str = "engine") -> dict:
    return {"deployment": {"chip": "h200", "chips": 8, "tp": tp, "pp": pp, "fabric": {"kind": "switch", "name": "x"}},
            "engine": {"scheduler": "vllm-v1", "host_overlap": False},
            "delivery": {"detokenize": detokenize, "network_rtt_s": 0.02}, "workload": {"rate_per_s": None}}


def test_two_runs_are_named_by_what_differs():
    a, b = _summary(1.0, "simulate", True), _summary(1.0, "simulate", True)
    a["resolved"], b["resolved"] = _resolved(8, 1), _resolved(2, 4)
    b["scenario"]["fingerprint"] = "g"
    assert run_names(a, b) == ("tp 8, pp 1", "tp 2, pp 4")
    assert difference_line(a, b) == "tp 8 vs 2, pp 1 vs 4"
    assert "tp 8, pp 1" in compare_table(a, b).title and "tp 2, pp 4" in compare_table(a, b).title
    document = compare_document(a, b, "a.json", "b.json")
    assert document["differences"] == [{"key": "deployment.tp", "a": 8, "b": 2},
                                       {"key": "deployment.pp", "a": 1, "b": 4}]
    assert (document["a"]["name"], document["b"]["name"]) == ("tp 8, pp 1", "tp 2, pp 4")
    # Settings read with their units; a rate of inf, written null, is all at once.
    b["resolved"] = _resolved(8, 1, "detokenizer")
    b["resolved"]["delivery"]["network_rtt_s"] = 0.05
    b["resolved"]["engine"]["host_overlap"] = True
    a["resolved"]["workload"]["rate_per_s"], b["resolved"]["workload"]["rate_per_s"] = None, 20.0
    assert difference_line(a, b) == ("host overlap off vs on, detokenize engine vs detokenizer, "
                                     "network rtt 20 ms vs 50 ms, rate all at once vs 20/s")
    b["resolved"]["deployment"]["fabric"]["kind"] = "torus"
    assert run_names(a, b)[1] == ("fabric kind torus, host overlap on, detokenize detokenizer, "
                                  "network rtt 50 ms and 1 more")


def test_runs_without_a_resolved_scenario_fall_back_to_the_fingerprint():
    a, b = _summary(1.0, "simulate", True), _summary(1.0, "bench", False)
    a["resolved"] = _resolved(8, 1)  # a measurement has no resolved scenario
    assert run_names(a, b) is None and difference_line(a, b) is None  # one fingerprint: one scenario
    b["scenario"]["fingerprint"] = "0123456789abcdef"
    assert run_names(a, b) == ("scenario f", "scenario 0123456789ab")
    assert difference_line(a, b) == "scenario f vs scenario 0123456789ab"
    b["resolved"] = _resolved(8, 1)  # the same settings, another scenario (e.g. another seed)
    assert run_names(a, b) == ("scenario f", "scenario 0123456789ab")


def test_compare_shows_a_measured_overload():
    """bench's summary carries `load` as a simulation's does (diagnose.overload.load_of), and compare shows it."""
    from tokenpath.bench.results import bench_summary

    ms = 1_000_000
    # 20 requests sent 10 ms apart (100 req/s); the server finishes one every 100 ms (10 req/s).
    rows = []
    for k in range(20):
        first, end = 100 * ms * k + 50 * ms, 100 * ms * (k + 1)
        rows.append({"i": k, "scheduled_ns": 10 * ms * k, "sent_ns": 10 * ms * k, "input_tokens": 7, "ok": True,
                     "first_token_ns": first, "first_visible_ns": first, "end_ns": end, "arrival_ns": [first, end],
                     "arrival_tokens": [1, 1], "tokens_from": "usage_per_event"})
    header = {"scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 20}
    measured = bench_summary(header, rows)
    load = measured["load"]
    assert (load["offered_requests_per_s"], load["served_requests_per_s"], load["overloaded"]) == \
        (pytest.approx(100.0), pytest.approx(10.0), True)
    simulated = _summary(1.0, "simulate", True)
    simulated["load"] = {"offered_requests_per_s": 100.0, "served_requests_per_s": 99.0, "overloaded": False,
                         "settled": False}  # still filling when its sends stopped
    rows = {row["metric"]: row for row in compare(simulated, measured)}
    assert (rows["settled"]["a"], rows["settled"]["b"]) == (0.0, None)  # the measured run too short to watch
    assert rows["offered requests/s"]["b"] == pytest.approx(100.0)
    assert rows["served requests/s"]["relative"] == pytest.approx(10 / 99 - 1)
    assert (rows["overloaded"]["a"], rows["overloaded"]["b"], rows["overloaded"]["relative"]) == (0.0, 1.0, None)
    table = compare_table(simulated, measured)
    cells = table.columns[0]._cells
    assert [table.columns[k]._cells[cells.index("overloaded")] for k in (1, 2)] == ["no", "yes"]
    assert [table.columns[k]._cells[cells.index("settled")] for k in (1, 2)] == ["no", "-"]
    # Neither side with a load block (older files): no load rows.
    del simulated["load"], measured["load"]
    assert "overloaded" not in {row["metric"] for row in compare(simulated, measured)}


def test_report_and_compare_name_the_schema_of_a_summary_of_another_version(tmp_path, monkeypatch, capsys):
    from cli_helpers import assert_user_error, run_cli

    older, good = tmp_path / "older.json", tmp_path / "good.json"
    older.write_text(json.dumps({**_summary(1.0, "bench", True), "schema": "tokenpath.summary/0"}))
    good.write_text(json.dumps(_summary(1.0, "simulate", True)))
    for argv in (["report", str(older)], ["compare", str(good), str(older)]):
        line = assert_user_error(*run_cli(argv, monkeypatch, capsys))
        assert line == (f"error: {older}: a summary of schema 'tokenpath.summary/0', but this version of tokenpath "
                        "reads 'tokenpath.summary/1'; run the simulate, bench or report that wrote it again with "
                        "this version")


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
    lines = [assert_user_error(*run_cli(argv, monkeypatch, capsys), "bad.json", f"{'.'.join(field)} is {shown}",
                               "not a number")
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


def test_a_bench_run_is_not_the_scenario_of_a_simulation_with_an_application(tmp_path, monkeypatch, capsys):
    """bench ignores [application] and sends the model call alone: against a simulation of the same scenario
    (one fingerprint) that ran the application's stages, compare says the two are different runs."""
    from cli_helpers import run_cli

    simulated, measured = _summary(1.0, "simulate", True), _summary(1.0, "bench", False)
    simulated["attribution_s"] |= {"application": 0.4, "application_detail": {"retrieve": 0.4}}
    assert run_names(simulated, measured) == ("with its application", "the model call alone")
    assert run_names(measured, simulated) == ("the model call alone", "with its application")
    document = compare_document(simulated, measured, "sim.json", "bench.json")
    assert document["same_scenario"] is False
    assert document["note"].startswith("B (bench) measured the model call alone")
    assert difference_line(simulated, measured) == document["note"]
    # without an application, the fingerprint decides as before
    plain = compare_document(_summary(1.0, "simulate", True), measured, "sim.json", "bench.json")
    assert plain["same_scenario"] is True and plain["note"] is None
    paths = [tmp_path / "sim.json", tmp_path / "bench.json"]
    for path, summary in zip(paths, (simulated, measured)):
        path.write_text(json.dumps(summary), encoding="utf-8")
    code, out, err = run_cli(["compare", *map(str, paths)], monkeypatch, capsys)
    assert code == 0, err
    assert "note: the two runs are of different scenarios: B (bench) measured the model call alone" in " ".join(
        out.split())
    # a bench run of another scenario is named as any run of another scenario is, not as this one's model call
    other = {**measured, "scenario": {**measured["scenario"], "fingerprint": "f" * 64}}
    assert application_note(simulated, other) is None
    assert run_names(simulated, other) != ("with its application", "the model call alone")


def test_compare_names_settings_and_shares_as_people_read_them():
    from tokenpath.report.compare import _cell, _setting, _shown

    assert _setting("engine.speculative.num_speculative_tokens") == "num speculative tokens"
    assert _setting("deployment.fabric.kind") == "fabric kind" and _setting("delivery.network_rtt_s") == "network rtt"
    assert _shown("workload.rate_per_s", None) == "all at once" and _shown("engine.version", None) == "none"
    assert _cell(0.5267, "share") == "52.7%"


@pytest.mark.parametrize("path, fragment", [
    (("requests", "failed"), "the summary has no requests.failed"),  # (a count report prints: it read KeyError)
    (("latency_s", "ttft", "p50"), "the summary has no latency_s.ttft.p50"),
    (("window_s",), "the summary has no window_s"),
    (("scenario", "name"), "the summary has no scenario.name"),
    (("bottleneck",), "the summary has no bottleneck"),
])
def test_report_refuses_a_summary_without_a_field_it_reads_in_one_line(path, fragment, tmp_path, monkeypatch, capsys):
    from cli_helpers import assert_user_error, run_cli

    summary = _summary(1.0, "simulate", True)
    holder = summary
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(summary))
    assert_user_error(*run_cli(["report", str(bad)], monkeypatch, capsys), "bad.json: ", fragment,
                      "the file is damaged")
