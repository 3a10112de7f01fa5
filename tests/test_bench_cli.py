"""`tokenpath bench`, `report` and `compare` from the command line: one-line errors, a full run."""

from __future__ import annotations

import io
import json
import socket

import pytest
from rich.console import Console

from cli_helpers import assert_user_error, run_cli
from report_helpers import assert_means_match
from test_bench_server import MODEL, FakeServer
from tokenpath.diagnose.overload import verdict_line
from tokenpath.report.requests import read_results_table
from tokenpath.report.table import print_summary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    with FakeServer("ok") as running:
        yield running


SMALL = ["--num-requests", "10", "--request-rate", "50", "--input-len", "30", "--input-sd", "0",
         "--output-len", "8", "--output-sd", "0"]


@pytest.mark.parametrize("args, fragments", [
    (["--model", MODEL], ["--base-url is required"]),
    (["--base-url", "http://127.0.0.1:1"], ["--model is required"]),
    (["--base-url", "ftp://host", "--model", MODEL], ["--base-url", "not an http(s) URL"]),
    (["--base-url", "http://[::1:8000", "--model", MODEL],
     ["--base-url: 'http://[::1:8000' is not a valid URL (Invalid IPv6 URL)", "http://[::1]:8000"]),
    (["--base-url", "http://127.0.0.1:0", "--model", MODEL], ["--base-url: 'http://127.0.0.1:0' has an invalid port",
                                                               "from 1 to 65535"]),
    (["--base-url", "http://127.0.0.1:65536", "--model", MODEL], ["--base-url", "has an invalid port"]),
    (["--base-url", "SERVER", "--model", MODEL, "--endpoint", "embeddings"], ["--endpoint", "completions, chat"]),
    (["--base-url", "SERVER", "--model", MODEL, "--workers", "0"], ["--workers"]),
    (["--base-url", "SERVER", "--model", MODEL, "--timeout", "-1"], ["--timeout"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", "{oops"], ["--extra-body", "not JSON"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", "[1]"], ["--extra-body", "object"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", '{"model": "zzz"}'],
     ["--extra-body: 'model' is a field bench sets itself (give --model instead); remove it"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", '{"temperature": 0, "max_tokens": 9}'],
     ["--extra-body: 'max_tokens' is a field bench sets itself", "--output-len"]),
    (["--base-url", "SERVER", "--model", MODEL, "--endpoint", "chat", "--extra-body", '{"messages": []}'],
     ["--extra-body: 'messages'"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", '{"stream": false}'], ["--extra-body: 'stream'"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", '{"stream_options": {}}'],
     ["--extra-body: 'stream_options'"]),
    (["--base-url", "SERVER", "--model", MODEL, "--extra-body", '{"ignore_eos": false}'],
     ["--extra-body: 'ignore_eos'", "--strict-openai"]),
    (["--base-url", "SERVER", "--model", MODEL, "--api-key-env", "TOKENPATH_TEST_UNSET_KEY"],
     ["TOKENPATH_TEST_UNSET_KEY", "not set"]),
    (["--base-url", "SERVER", "--model", "other-model"], ["--model 'other-model'", "test-model"]),
    (["--base-url", "SERVER", "--model", MODEL, "--request-rate", "fast"], ["--request-rate"]),
    (["--base-url", "SERVER", "--model", MODEL, "--tokenizer", "no/such/tokenizer.json"],
     ["tokenizer", "no/such/tokenizer.json"]),
    (["nonexistent.toml", "--base-url", "SERVER", "--model", MODEL], ["nonexistent.toml"]),
    (["--base-url", "SERVER", "--model", MODEL, "--max-failure-ratio", "1.5"], ["--max-failure-ratio", "from 0 to 1"]),
    (["--base-url", "SERVER", "--model", MODEL, "--max-event-bytes", "lots"], ["--max-event-bytes", "'lots'"]),
    (["--base-url", "SERVER", "--model", MODEL, "--max-event-bytes", "0"], ["--max-event-bytes", "from 1 B"]),
])
def test_bad_flags_are_one_line_errors(args, fragments, server, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOKENPATH_TEST_UNSET_KEY", raising=False)
    args = [server.url if a == "SERVER" else a for a in args]
    assert_user_error(*run_cli(["bench", *SMALL, *args], monkeypatch, capsys), *fragments)
    assert not list(tmp_path.glob("bench-*.jsonl"))  # a refused run leaves no results file


def test_unreachable_server_is_a_assert_user_error(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    line = assert_user_error(*run_cli(["bench", "--base-url", url, "--model", MODEL, *SMALL], monkeypatch, capsys),
                          "cannot reach", url)
    assert "refused" in line.lower()


def test_existing_results_file_is_not_overwritten(server, monkeypatch, capsys, tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text("precious\n")
    assert_user_error(*run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(results), *SMALL],
                            monkeypatch, capsys), "already exists")
    assert results.read_text() == "precious\n"


@pytest.mark.parametrize("results, json_out, fragment", [
    ("same.jsonl", "same.jsonl", "--results same.jsonl: the same file as --json"),
    ("-", None, "--results -: per-request results are written to a file"),
    ("/proc/x.jsonl", None, "--results /proc/x.jsonl: cannot be created"),  # (os.access says yes to root there)
])
def test_results_that_would_be_lost_are_refused_before_any_request(monkeypatch, capsys, tmp_path, results, json_out,
                                                                   fragment):
    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a refusal must come before the first request
    argv = ["bench", "--base-url", url, "--model", MODEL, "--results", results, *SMALL]
    assert_user_error(*run_cli(argv + (["--json", json_out] if json_out else []), monkeypatch, capsys), fragment)
    assert list(tmp_path.iterdir()) == []


def test_the_table_says_how_many_streams_ended_before_their_max_tokens(monkeypatch, capsys, tmp_path):
    with FakeServer(lambda i: "stop_early" if i == 3 else "ok") as stopping:
        code, out, err = run_cli(["bench", "--base-url", stopping.url, "--model", MODEL, *SMALL], monkeypatch, capsys)
    assert code == 0, err
    assert "1 request ended before the max_tokens asked, ignore_eos sent (finish_reason stop 1)" in " ".join(
        out.split())


def test_bench_report_and_compare(server, monkeypatch, capsys, tmp_path):
    results, bench_json, report_json, sim_json = (tmp_path / name
                                                  for name in ("r.jsonl", "b.json", "rep.json", "s.json"))
    code, out, err = run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(results),
                              "--json", str(bench_json), *SMALL], monkeypatch, capsys)
    assert code == 0, err
    assert "TTFT" in out and "client wait" in out and "ended before the max_tokens" not in out
    bench = json.loads(bench_json.read_text())
    assert bench["schema"] == "tokenpath.summary/1" and bench["source"] == "bench"
    assert bench["requests"] == {"completed": 10, "failed": 0, "input_tokens_mean": 30.0, "output_tokens_mean": 8.0,
                                 "warmup": 0}
    assert bench["attribution_s"] is None and bench["bench"]["planned"] == 10
    client = bench["bench"]["client"]  # the worker's own CPU and loop lag; whether it saturated is the machine's
    assert 0 <= client["cpu_busy_fraction"] <= 1 and client["workers"] == 1 and isinstance(client["saturated"], bool)
    # The load line says what the document judged (ten requests at a light load read as neither overloaded
    # nor filling on a quiet machine; a busy one can slow the last requests, which the judgement then reports).
    assert ("load:" in out) == (verdict_line(bench["load"]) is not None)
    assert ("load: overloaded" in out) == bench["load"]["overloaded"]
    console = Console(file=io.StringIO(), width=200, color_system=None)
    # (a run still filling and not overloaded, whatever the measured run was: a busy machine can make it so)
    filling = {**bench, "load": {**bench["load"], "overloaded": False, "settled": False,
                                 "caveat": "still filling: ..."}}
    print_summary(console, filling, [], None)
    assert "load: still filling: ..." in console.file.getvalue()

    code, out, err = run_cli(["report", str(results), "--json", str(report_json)], monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(report_json.read_text()) == bench

    # The same requests as one row each, in every format: their means are the summary's.
    for name in ("rows.parquet", "rows.csv", "rows.jsonl"):
        code, out, err = run_cli(["report", str(results), "--results", str(tmp_path / name)], monkeypatch, capsys)
        assert code == 0, err
        frame, _, _ = read_results_table(str(tmp_path / name))
        assert len(frame) == 10 and sorted(frame["request"]) == list(range(10))
        assert_means_match(frame, bench)
        assert frame["queue_s"].isna().all() and frame["replica"].isna().all()  # a measurement has neither

    code, out, err = run_cli(["simulate", *SMALL, "--json", str(sim_json)], monkeypatch, capsys)
    assert code == 0, err
    simulated = json.loads(sim_json.read_text())
    assert simulated["scenario"]["fingerprint"] == bench["scenario"]["fingerprint"]  # same workload, same scenario

    code, out, err = run_cli(["compare", str(sim_json), str(bench_json), "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["same_scenario"] is True
    rows = {row["metric"]: row for row in document["rows"]}
    ttft = rows["TTFT p50"]
    assert ttft["a"] == simulated["latency_s"]["ttft"]["p50"] and ttft["b"] == bench["latency_s"]["ttft"]["p50"]
    assert ttft["relative"] == pytest.approx((ttft["b"] - ttft["a"]) / ttft["a"])
    assert rows["requests completed"]["relative"] == 0.0

    code, out, err = run_cli(["compare", str(sim_json), str(bench_json)], monkeypatch, capsys)
    assert code == 0 and "TTFT p50" in out and "B vs A" in out


@pytest.mark.parametrize("command", [["report"], ["calibrate", "engine", "--from"]])
def test_results_of_another_version_name_its_schema_and_this_ones(tmp_path, monkeypatch, capsys, command):
    older = tmp_path / "older.jsonl"
    header = {"schema": "tokenpath.bench/0", "scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 0}
    older.write_text(json.dumps(header) + "\n")
    line = assert_user_error(*run_cli([*command, str(older)], monkeypatch, capsys))
    assert line == (f"error: {older}: bench results of schema 'tokenpath.bench/0', but this version of tokenpath "
                    "reads 'tokenpath.bench/1'; run `tokenpath bench` again with this version")


def test_report_and_compare_errors(monkeypatch, capsys, tmp_path):
    assert_user_error(*run_cli(["report", str(tmp_path / "none.jsonl")], monkeypatch, capsys), "no such results file")
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{}\n")
    assert_user_error(*run_cli(["report", str(junk)], monkeypatch, capsys), "not a tokenpath bench results file")
    assert_user_error(*run_cli(["compare", str(junk), str(junk)], monkeypatch, capsys), "report")
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something/9"}')
    assert_user_error(*run_cli(["compare", str(other), str(other)], monkeypatch, capsys), "not a tokenpath.summary/1")


def test_failed_requests_set_the_exit_status(monkeypatch, capsys, tmp_path):
    """Any failed request exits 1, unless --max-failure-ratio allows that share."""
    with FakeServer(lambda i: "http500" if i == 3 else "ok") as server:
        def bench(name, *extra):
            return run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(tmp_path / name),
                            *SMALL, *extra], monkeypatch, capsys)

        code, out, err = bench("a.jsonl")
        assert code == 1 and "1 of 10 requests failed (10.0%), more than --max-failure-ratio 0 allows" in err
        assert "Traceback" not in err and "TTFT" in out  # the summary is printed all the same
        code, out, err = bench("b.jsonl", "--max-failure-ratio", "0.1")
        assert code == 0 and "failed (" not in err
        code, out, err = bench("c.jsonl", "--max-failure-ratio", "0.05")
        assert code == 1


def test_a_run_where_every_request_failed_has_unknown_latencies(monkeypatch, capsys, tmp_path):
    results, bench_json, sim_json = tmp_path / "r.jsonl", tmp_path / "b.json", tmp_path / "s.json"
    with FakeServer("http500") as server:
        code, out, err = run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(results),
                                  "--json", str(bench_json), *SMALL], monkeypatch, capsys)
    assert code == 1 and "10 of 10 requests failed" in err
    bench = json.loads(bench_json.read_text())
    for metric, stats in bench["latency_s"].items():
        assert set(stats.values()) == {None}, metric  # unknown, not 0 s
    ttft_row = next(line for line in out.splitlines() if "TTFT" in line)
    assert ttft_row.split("TTFT")[1].split() == ["│", "-", "│", "-", "│", "-", "│", "-", "│", "-", "│"]

    code, out, err = run_cli(["report", str(results), "--json", "-"], monkeypatch, capsys)
    assert code == 0 and json.loads(out) == bench
    code, out, err = run_cli(["simulate", *SMALL, "--json", str(sim_json)], monkeypatch, capsys)
    assert code == 0, err
    code, out, err = run_cli(["compare", str(sim_json), str(bench_json), "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    rows = {row["metric"]: row for row in json.loads(out)["rows"]}
    assert rows["TTFT p99"]["a"] > 0 and rows["TTFT p99"]["b"] is None and rows["TTFT p99"]["relative"] is None
    code, out, err = run_cli(["compare", str(sim_json), str(bench_json)], monkeypatch, capsys)
    assert code == 0 and "Traceback" not in err
    assert "n/a" in next(line for line in out.splitlines() if "TTFT p99 " in line)


def test_report_on_a_damaged_results_file(server, monkeypatch, capsys, tmp_path):
    results = tmp_path / "r.jsonl"
    code, _, err = run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(results), *SMALL],
                           monkeypatch, capsys)
    assert code == 0, err
    lines = results.read_bytes().splitlines(keepends=True)
    assert lines[-1].startswith(b'{"client":')  # the worker's own CPU and loop lag, written as it ended
    lines = lines[:-1]  # a crash leaves none
    torn = tmp_path / "torn.jsonl"  # a crash mid-write: the last line cut short, no newline
    torn.write_bytes(b"".join(lines[:-1]) + lines[-1][:30])
    code, out, err = run_cli(["report", str(torn), "--json", "-"], monkeypatch, capsys)
    assert code == 0 and json.loads(out)["bench"]["recorded"] == 9
    assert err.strip() == f"warning: {torn}:11: skipped a torn last line (the run was cut off while writing it)"
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"".join(lines[:4]) + b'{"i": 3, "sent_ns": "later"}\n' + b"".join(lines[5:]))
    assert_user_error(*run_cli(["report", str(damaged)], monkeypatch, capsys),
                      f"{damaged}:5: no field 'scheduled_ns'", "the file is damaged")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"".join(lines[:4]) + b"\x00\xff garbage\n" + b"".join(lines[5:]))
    assert_user_error(*run_cli(["report", str(garbage)], monkeypatch, capsys), f"{garbage}:5: not a JSON line")


def test_a_server_that_does_not_answer_in_http_is_one_line(monkeypatch, capsys, tmp_path):
    from raw_server import RawServer

    monkeypatch.chdir(tmp_path)
    with RawServer(b"\x00\x01GARBAGE\r\n\r\n") as garbage:
        line = assert_user_error(*run_cli(["bench", "--base-url", garbage.url, "--model", MODEL, *SMALL],
                                          monkeypatch, capsys), f"{garbage.url}/v1/models", "not answer in HTTP",
                                 "GARBAGE", "--base-url")
    assert "BadStatusLine" in line
    assert not list(tmp_path.glob("bench-*.jsonl"))
