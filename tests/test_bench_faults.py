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
from pathlib import Path

import numpy as np
import pytest

from test_bench_server import BEHAVIORS, MODEL, FakeServer
from tokenpath.bench import Target, read_results, run_bench
from tokenpath.scenario import load_scenario

EXPECTED = {
    "ok": None, "multi": None, "drop": "dropped", "http500": "http_500", "http429": "http_429",
    "malformed": "malformed", "stall": "stalled", "drip": None, "empty_first": None, "role_first": None,
    "whitespace_first": None, "reasoning": None, "error_event": "server_error", "no_done": None,
    "comments": None, "crlf": None,
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
                           workers=1, timeouts=TIMEOUTS, kernel_timestamps=kernel)
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
    failed = {k: v for k, v in EXPECTED.items() if v is not None}
    assert summary["bench"]["failure_reasons"] == {reason: 2 for reason in failed.values()}


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


def test_multi_token_events_split_the_gap(tmp_path):
    with FakeServer("multi", itl_s=0.005) as server:
        result = run_bench(_scenario(3, output_len=12), Target(server.url, MODEL), str(tmp_path / "r.jsonl"),
                           workers=1, timeouts=TIMEOUTS)
    run_tokens = result.summary["requests"]["output_tokens_mean"]
    assert run_tokens == 12
    for row in result.rows:
        assert sum(row["arrival_tokens"]) == 12
        assert all(k % 3 == 0 for k in row["arrival_tokens"])
    # Each event carries 3 tokens: per-token ITL is a third of the event gap, never zero.
    assert result.summary["latency_s"]["itl"]["p50"] > 0


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


def test_two_worker_processes(tmp_path):
    with FakeServer(lambda i: "http500" if i == 5 else "ok") as server:
        result = run_bench(_scenario(12), Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=2,
                           timeouts=TIMEOUTS)
    assert result.header["workers"] == 2
    assert sorted(row["i"] for row in result.rows) == list(range(12))
    assert [row["i"] for row in result.rows if not row["ok"]] == [5]


def test_unreachable_port_fails_requests_with_connect(tmp_path):
    import socket

    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_bench(_scenario(3), Target(f"http://127.0.0.1:{port}", MODEL), str(tmp_path / "r.jsonl"),
                       workers=1, timeouts=TIMEOUTS)
    assert [row["error"] for row in result.rows] == ["connect"] * 3


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_keeps_what_was_measured(tmp_path, workers):
    """A bench interrupted mid-run exits 130, keeps every finished request, and `report` rebuilds it."""
    results = tmp_path / "r.jsonl"
    with FakeServer(lambda i: "ok" if i < 3 else "drip", drip_s=0.5) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenpath", "bench", "--base-url", server.url, "--model", MODEL,
             "--num-requests", "6", "--request-rate", "inf", "--input-len", "20", "--input-sd", "0",
             "--output-len", "40", "--output-sd", "0", "--results", str(results), "--workers", workers],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if results.exists() and len(results.read_text().splitlines()) >= 4:  # header + 3 finished
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    header, rows = read_results(results)
    assert len(rows) == 6
    assert sorted(row["error"] or "ok" for row in rows) == ["interrupted"] * 3 + ["ok"] * 3
    assert "tokenpath report" in err
    report = subprocess.run([sys.executable, "-m", "tokenpath", "report", str(results), "--json", "-"],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    import json

    summary = json.loads(report.stdout)
    assert summary["requests"] == {"completed": 3, "failed": 3, "input_tokens_mean": 20.0, "output_tokens_mean": 40.0}
    assert summary["bench"]["failure_reasons"] == {"interrupted": 3}
    assert Path(results).stat().st_size > 0
