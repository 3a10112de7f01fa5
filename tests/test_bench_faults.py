"""bench against a real streaming server over loopback: every request is accounted for, ok or failed
with its reason, nothing hangs past its timeout, and every client timestamp follows the server's send.

Timing assertions are one-sided and causal (a client arrival is never before the server's write; a
TTFT is at least the delay the server added before its first token), so a slow machine cannot break
them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from test_bench_server import BEHAVIORS, MODEL, FakeServer
from tokenpath import load_scenario
from tokenpath.bench import Target, bench_summary, read_results, run_bench

EXPECTED = {
    "ok": None, "multi": None, "drop": "dropped", "http500": "http_500", "http429": "http_429",
    "malformed": "malformed", "stall": "stalled", "drip": None, "empty_first": None, "role_first": None,
    "whitespace_first": None, "reasoning": None, "error_event": "server_error", "no_done": None,
    "comments": None, "crlf": None, "json": "malformed", "html": "malformed", "huge": "malformed",
}
DETAIL = {  # what the failure's detail says, in part
    "json": "answered application/json; charset=utf-8, not an SSE stream",
    "html": "not an SSE stream (Content-Type: text/html; charset=utf-8): <html><body>Welcome to nginx!",
    "huge": "is over 1048576 bytes (raise --max-event-bytes",
}
TIMEOUTS = {"stall_timeout_s": 1.0, "request_timeout_s": 20.0, "connect_timeout_s": 5.0}


def _scenario(n: int, rate: float | str = 200.0, input_len: int = 24, output_len: int = 12, **extra):
    table = {"workload.num_requests": n, "workload.arrival.rate": rate,
             "workload.input": {"kind": "fixed", "value": input_len},
             "workload.output": {"kind": "fixed", "value": output_len}}
    table.update(extra)
    return load_scenario(None, table)


@pytest.mark.parametrize("endpoint, kernel", [("completions", True), ("chat", True), ("completions", False)])
def test_every_fault_is_accounted_for(tmp_path, endpoint, kernel):
    n = 2 * len(BEHAVIORS)
    with FakeServer(lambda i: BEHAVIORS[i % len(BEHAVIORS)], drip_s=0.02) as server:
        result = run_bench(_scenario(n), Target(server.url, MODEL, endpoint), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts=TIMEOUTS, kernel_timestamps=kernel, max_event_bytes=2**20)
        sends = dict(server.sends)
    from tokenpath.bench.http import KERNEL_TIMESTAMPS

    assert result.header["timestamps"] == ("kernel" if kernel and KERNEL_TIMESTAMPS else "event loop")
    rows = {row["i"]: row for row in result.rows}
    assert sorted(rows) == list(range(n))
    for i, row in rows.items():
        behavior = BEHAVIORS[i % len(BEHAVIORS)]
        expected = EXPECTED[behavior]
        if behavior in ("role_first",) and endpoint == "completions":
            expected = None
        assert row["error"] == expected, (behavior, row["detail"])
        if behavior in DETAIL:
            assert DETAIL[behavior] in row["detail"], row["detail"]
        assert row["ok"] == (expected is None)
        if row["ok"]:
            assert row["output_tokens"] == 12, behavior
            # Causality: each token arrives after the server wrote it (same monotonic clock).
            token_sends = [t for t, k in sends[i] for _ in range(k)]
            client = np.repeat(np.array(row["arrival_ns"]) + result.header["t0_monotonic_ns"], row["arrival_tokens"])
            assert len(token_sends) == len(client) == 12
            assert (client >= np.array(token_sends)).all(), behavior
    summary = result.summary
    assert summary["requests"]["completed"] + summary["requests"]["failed"] == n
    failed = Counter(2 * [v for v in EXPECTED.values() if v is not None])
    assert summary["bench"]["failure_reasons"] == dict(failed)


def test_role_only_and_empty_first_chunks_do_not_count_as_ttft(tmp_path):
    with FakeServer("role_first", first_delay_s=0.05) as server:
        result = run_bench(_scenario(4), Target(server.url, MODEL, "chat"), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts=TIMEOUTS)
        sends = dict(server.sends)
    t0 = result.header["t0_monotonic_ns"]
    for row in result.rows:
        role_sent, first_token_sent = sends[row["i"]][0][0], sends[row["i"]][1][0]
        assert first_token_sent - role_sent >= 50_000_000
        # TTFT stops at the first token, which the server wrote at least 50 ms after the role chunk.
        assert row["first_token_ns"] + t0 >= first_token_sent
        assert row["first_token_ns"] - row["sent_ns"] >= 50_000_000
    assert result.summary["latency_s"]["ttft"]["p50"] >= 0.05


def test_whitespace_first_token_delays_ttfv_not_ttft(tmp_path):
    with FakeServer("whitespace_first", itl_s=0.01) as server:
        result = run_bench(_scenario(3), Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1,
                           timeouts=TIMEOUTS)
        sends = dict(server.sends)
    t0 = result.header["t0_monotonic_ns"]
    for row in result.rows:
        assert row["first_visible_ns"] > row["first_token_ns"]
        assert row["first_visible_ns"] + t0 >= sends[row["i"]][1][0]  # the second token is the first visible


def test_multi_token_events_are_one_arrival_each(tmp_path):
    from tokenpath.bench.results import build_run, token_times

    with FakeServer("multi", itl_s=0.005) as server:
        result = run_bench(_scenario(3, output_len=12), Target(server.url, MODEL), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts=TIMEOUTS)
    run_tokens = result.summary["requests"]["output_tokens_mean"]
    assert run_tokens == 12
    for row in result.rows:
        assert row["arrival_tokens"] == [3, 3, 3, 3]  # one arrival per event, however the reads fell
        # ITL: the gaps between the events' arrivals, not a per-token share of them; events read together are
        # stamped 1 ns apart, each an arrival (bench/results.py's token_times)
        itl = build_run([row]).itl_ns()
        events = token_times(np.asarray(row["arrival_ns"]), np.ones(len(row["arrival_ns"]), np.int64))
        assert itl.tolist() == np.diff(events).tolist() and len(itl) == 3


def test_strict_openai_counts_from_the_usage_total(tmp_path):
    with FakeServer("multi") as server:
        result = run_bench(_scenario(3, output_len=9), Target(server.url, MODEL, strict_openai=True),
                           str(tmp_path / "r.jsonl"), workers=1, timeouts=TIMEOUTS)
        bodies = list(server.received.values())
    assert all("ignore_eos" not in body and body["stream_options"] == {"include_usage": True} for body in bodies)
    assert [sum(row["arrival_tokens"]) for row in result.rows] == [9, 9, 9]
    assert result.summary["bench"]["output_tokens_from"] == {"usage": 3}


def test_prompts_reach_the_server_at_their_drawn_lengths(tmp_path):
    from tokenpath.bench import load_tokenizer, workload_requests

    scenario = load_scenario(None, {"workload.num_requests": 6, "workload.arrival.rate": "inf",
                                    "workload.output": {"kind": "fixed", "value": 3}})
    with FakeServer("ok") as server:
        run_bench(scenario, Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1, timeouts=TIMEOUTS)
        bodies = dict(server.received)
    tokenizer = load_tokenizer(None)
    drawn = workload_requests(scenario).input_tokens.tolist()
    assert [len(tokenizer.encode(bodies[i]["prompt"])) for i in range(6)] == drawn
    assert all(bodies[i]["max_tokens"] == 3 and bodies[i]["ignore_eos"] for i in range(6))


def test_concurrency_cap_and_client_wait(tmp_path):
    with FakeServer("ok", itl_s=0.002) as server:
        result = run_bench(_scenario(8, rate="inf", **{"workload.max_concurrency": 2}),
                           Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1, timeouts=TIMEOUTS)
    rows = sorted(result.rows, key=lambda r: r["sent_ns"])
    # At most two outstanding: each send after the first two waits for an earlier request's end.
    for k, row in enumerate(rows[2:], start=2):
        ends = sorted(r["end_ns"] for r in rows[:k])
        assert row["sent_ns"] >= ends[k - 2]
    assert result.summary["bench"]["client_wait_s"]["mean"] > 0


def test_request_timeout_bounds_a_slow_drip(tmp_path):
    with FakeServer("drip", drip_s=0.2) as server:
        result = run_bench(_scenario(2, output_len=200), Target(server.url, MODEL), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts={"stall_timeout_s": 5.0, "request_timeout_s": 1.0})
    assert [row["error"] for row in result.rows] == ["timeout", "timeout"]


def test_the_run_time_limit_ends_the_request_in_flight_and_sends_no_more(tmp_path):
    """A closed loop of one, each request dripping 2 s: a 0.6 s limit times the first out and records
    the other two failed, unsent."""
    with FakeServer("drip", drip_s=0.2) as server:
        result = run_bench(_scenario(3, rate="inf", output_len=10, **{"workload.max_concurrency": 1}),
                           Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1,
                           timeouts={"stall_timeout_s": 5.0, "request_timeout_s": 20.0, "run_timeout_s": 0.6})
        answered = len(server.received)
    rows = sorted(result.rows, key=lambda r: r["i"])
    assert [row["error"] for row in rows] == ["timeout", "skipped", "skipped"]
    assert "the run's time limit of 0.6 s" in rows[0]["detail"] and rows[1]["detail"].startswith("not sent")
    assert answered == 1 and result.header["timeouts_s"]["run"] == 0.6


def test_two_worker_processes(tmp_path):
    with FakeServer(lambda i: "http500" if i == 5 else "ok") as server:
        result = run_bench(_scenario(12), Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=2,
                           timeouts=TIMEOUTS)
    assert result.header["workers"] == 2
    assert sorted(row["i"] for row in result.rows) == list(range(12))
    assert [row["i"] for row in result.rows if not row["ok"]] == [5]


def test_no_request_is_sent_before_its_scheduled_time(tmp_path):
    # An event loop's timer may fire up to its resolution early (libuv's 1 ms): the client sleeps again.
    with FakeServer("ok") as server:
        result = run_bench(_scenario(60, rate=40.0, output_len=3), Target(server.url, MODEL),
                           str(tmp_path / "r.jsonl"), workers=1, timeouts=TIMEOUTS)
    assert len(result.rows) == 60
    assert min(row["sent_ns"] - row["scheduled_ns"] for row in result.rows) >= 0


def test_a_concurrency_cap_below_the_workers_asked_for_holds(tmp_path):
    # Each worker holds at least one of the cap's slots: two workers under a cap of 1 would keep two
    # requests in flight, so the run takes one worker, and every request is sent after the last ended.
    with FakeServer("ok") as server:
        result = run_bench(_scenario(6, rate="inf", **{"workload.max_concurrency": 1}), Target(server.url, MODEL),
                           str(tmp_path / "r.jsonl"), workers=2, timeouts=TIMEOUTS)
    assert result.header["workers"] == 1
    rows = sorted(result.rows, key=lambda row: row["sent_ns"])
    assert all(later["sent_ns"] >= earlier["end_ns"] for earlier, later in zip(rows, rows[1:]))


def test_workers_share_a_concurrency_cap_as_one_client(tmp_path):
    """A cap of 3 over 2 workers holds 2 and 1 of its slots. Each sends the plan's next unsent request when
    one of its slots frees, so 3 are in flight until the last is sent; 6 rows each, fixed, kept the 2-slot
    worker idle for half the run while the other's waited one at a time (2 of 3 slots busy on average)."""
    with FakeServer("ok", first_delay_s=0.1, itl_s=0.02) as server:
        result = run_bench(_scenario(12, rate="inf", output_len=5, **{"workload.max_concurrency": 3}),
                           Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=2, timeouts=TIMEOUTS)
    rows = result.rows
    assert result.header["workers"] == 2 and sorted(row["i"] for row in rows) == list(range(12))
    assert all(row["ok"] for row in rows)
    sends = sorted(row["sent_ns"] for row in rows)
    in_flight = [sum(row["sent_ns"] <= t < row["end_ns"] for row in rows) for t in sends]
    assert max(in_flight) <= 3  # the cap holds
    # Until the last send, the cap's slots are in use: their busy time over 3 x that span.
    last = sends[-1]
    busy_ns = sum(min(row["end_ns"], last) - row["sent_ns"] for row in rows if row["sent_ns"] < last)
    assert busy_ns / (3 * (last - sends[0])) > 0.9


def test_streams_that_end_before_their_max_tokens_are_completed_and_counted_by_their_finish(tmp_path):
    """ignore_eos asked, a server that stops two answers at their second token with "stop": completed (as
    vLLM's bench serve counts them), with their two tokens, and the bench block says how each ended."""
    with FakeServer(lambda i: "stop_early" if i in (1, 4) else "ok") as server:
        result = run_bench(_scenario(6, output_len=6), Target(server.url, MODEL), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts=TIMEOUTS)
    rows = {row["i"]: row for row in result.rows}
    assert all(row["ok"] for row in rows.values())
    assert [rows[i]["output_tokens"] for i in range(6)] == [6, 2, 6, 6, 2, 6]
    assert result.summary["bench"]["finish_reasons"] == {"length": 4, "stop": 2}


def test_unreachable_port_fails_requests_with_connect(tmp_path):
    import socket

    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_bench(_scenario(3), Target(f"http://127.0.0.1:{port}", MODEL), str(tmp_path / "r.jsonl"),
                       workers=1, timeouts=TIMEOUTS)
    assert [row["error"] for row in result.rows] == ["connect"] * 3


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> str:
    """A 300-token byte-level BPE of the corpus: the CLI starts in a fraction of the default's time."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tokenpath.bench.prompts import corpus_text

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([corpus_text()], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def _children(pid: int) -> list[int]:
    """Live (not zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("workers, stop, status", [
    ("1", signal.SIGINT, 130), ("2", signal.SIGINT, 130), ("1", signal.SIGTERM, 143), ("2", signal.SIGTERM, 143),
    ("2", signal.SIGKILL, -9),
])
def test_a_stopped_run_keeps_what_was_measured(tmp_path, small_tokenizer, workers, stop, status):
    """Ctrl-C or SIGTERM mid-run: exit 130 or 143, every finished request kept, the requests in flight
    recorded as interrupted, no worker left sending, and `report` rebuilds the summary. A parent killed
    outright (SIGKILL) takes its workers with it, and they too record their requests in flight."""
    results = tmp_path / "r.jsonl"
    with FakeServer(lambda i: "ok" if i < 3 else "drip", drip_s=0.5) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenpath", "bench", "--base-url", server.url, "--model", MODEL,
             "--num-requests", "6", "--request-rate", "inf", "--input-len", "20", "--input-sd", "0",
             "--output-len", "40", "--output-sd", "0", "--results", str(results), "--workers", workers,
             "--tokenizer", small_tokenizer],
            stdout=subprocess.DEVNULL if stop == signal.SIGKILL else subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if results.exists() and len(results.read_text().splitlines()) >= 4:  # header + 3 finished
                break
            time.sleep(0.05)
        linux = sys.platform.startswith("linux")
        workers_before = _children(process.pid) if linux else []
        process.send_signal(stop)
        # The workers inherit the pipes: communicate returns once they are gone too (the drips take 20 s).
        out, err = process.communicate(timeout=15)
        deadline = time.monotonic() + 15
        while linux and any(map(_alive, workers_before)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, workers_before))
    assert len(workers_before) == (int(workers) if linux and workers != "1" else 0)
    assert process.returncode == status, err
    header, rows = read_results(results)
    assert len(rows) == 6
    assert sorted(row["error"] or "ok" for row in rows) == ["interrupted"] * 3 + ["ok"] * 3
    if stop != signal.SIGKILL:
        assert f"stopped by {signal.Signals(stop).name}" in err and "tokenpath report" in err
    summary = bench_summary(header, rows)  # what `report` prints (tests/test_bench_cli.py runs it)
    assert summary["requests"] == {"completed": 3, "failed": 3, "input_tokens_mean": 20.0, "output_tokens_mean": 40.0,
                                  "warmup": 0}
    assert summary["bench"]["failure_reasons"] == {"interrupted": 3}
    assert Path(results).stat().st_size > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker processes in /proc")
def test_sigterm_while_the_workers_start_stops_the_run(tmp_path, small_tokenizer):
    """SIGTERM as soon as the workers exist (before or just after the first send): exit 143, no
    traceback, no worker left, and every request the server got is in the results file."""
    results = tmp_path / "r.jsonl"
    with FakeServer("drip", drip_s=0.5) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenpath", "bench", "--base-url", server.url, "--model", MODEL,
             "--num-requests", "40", "--request-rate", "20", "--input-len", "20", "--input-sd", "0",
             "--output-len", "40", "--output-sd", "0", "--results", str(results), "--workers", "2",
             "--tokenizer", small_tokenizer],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 60
        while not (workers := _children(process.pid)) and time.monotonic() < deadline:
            pass  # no sleep: the signal lands while the parent is still starting its workers
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
        received = len(server.received)
    assert process.returncode == 143, err
    assert "Traceback" not in err and "stopped by SIGTERM" in err
    assert workers and not any(map(_alive, workers))
    recorded = len(read_results(results)[1]) if results.stat().st_size else 0
    assert recorded == received
