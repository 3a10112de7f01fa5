"""bench sends multi-turn sessions for real: each turn's prompt is the previous turn's prompt, the
server's actual answer to it and a new message; each turn goes its think time after the previous
turn's last byte; every turn is recorded with its session and turn. Over real HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cli_helpers import run_cli
from serve_helpers import LoopbackServer
from test_bench_server import MODEL, FakeServer
from tokenpath import load_scenario
from tokenpath.bench import Target, bench_summary, read_results, run_bench, workload_requests
from tokenpath.bench.plan import message_tokens
from tokenpath.serve import ServeOptions

THINK_S = 0.15
SESSIONS = {"workload.input": {"kind": "fixed", "value": 40}, "workload.output": {"kind": "fixed", "value": 5},
            "workload.arrival.rate": "inf", "workload.num_requests": 6,
            "workload.sessions": {"turns": 3, "think_time": THINK_S}}


def _scenario(**extra):
    return load_scenario("typical", {**SESSIONS, **extra})


def _run(tmp_path, endpoint="completions", behavior="ok", workers=1):
    scenario = _scenario()
    with FakeServer(behavior) as server:
        result = run_bench(scenario, Target(server.url, MODEL, endpoint), str(tmp_path / "results.jsonl"),
                           workers=workers)
        bodies = list(server.bodies)
    return result, bodies


def _answer(max_tokens: int) -> str:
    """The FakeServer's answer to a request of `max_tokens` ("ok" behavior)."""
    return "".join(f" w{j}" for j in range(max_tokens))


def _by_session(rows):
    sessions: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (r["session"], r["turn"])):
        sessions.setdefault(row["session"], []).append(row)
    return sessions


@pytest.mark.parametrize("workers", [1, 2])
def test_each_turn_carries_the_previous_prompt_and_answer_and_waits_its_think_time(tmp_path, tekken, workers):
    result, bodies = _run(tmp_path, workers=workers)
    rows = result.rows
    assert len(rows) == 6 and all(row["ok"] for row in rows)
    assert result.summary["requests"]["completed"] == 6
    sessions = _by_session(rows)
    assert sorted(sessions) == [0, 1] and [[r["turn"] for r in s] for s in sessions.values()] == [[0, 1, 2]] * 2
    prompts = {body["prompt"]: body for body in bodies}
    assert len(prompts) == 6  # every turn's prompt differs
    # A session's prompts, in the order they grow: each later one starts with the one before + its answer.
    for session in (0, 1):
        # Every turn starts with its session's first turn, whose tag names its row (3 turns a session).
        chain = sorted((p for p in prompts if p.startswith(f"[{result.header['prompt_tag']}{3 * session}]")), key=len)
        assert len(chain) == 3
        for before, after in zip(chain, chain[1:]):
            assert after.startswith(before + _answer(prompts[before]["max_tokens"]))
            assert len(after) > len(before + _answer(5))  # and a new message follows
        # The recorded input tokens are the sent prompts' own counts, by the bench tokenizer.
        recorded = sorted(r["input_tokens"] for r in sessions[session])
        assert recorded == sorted(len(tekken.encode(p)) for p in chain)
    for turns in sessions.values():
        for before, after in zip(turns, turns[1:]):
            assert after["think_ns"] == int(THINK_S * 1e9)
            assert after["sent_ns"] >= before["end_ns"] + after["think_ns"]
            assert after["scheduled_ns"] == before["end_ns"] + after["think_ns"]
    # While session 0 waits its think time, session 1 (arriving at the same time) is not held back.
    assert (sessions[1][0]["sent_ns"] < sessions[0][1]["sent_ns"]
            and sessions[0][0]["sent_ns"] < sessions[1][1]["sent_ns"])
    assert result.header["sessions"] == 2


def test_chat_sends_the_history_as_messages(tmp_path, tekken):
    result, bodies = _run(tmp_path, endpoint="chat")
    assert len(result.rows) == 6 and all(row["ok"] for row in result.rows)
    histories = sorted((body["messages"] for body in bodies), key=len)
    assert [len(h) for h in histories] == [1, 1, 3, 3, 5, 5]
    for history in histories:
        assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2) + ["user"]
        for k in range(1, len(history), 2):
            assert history[k]["content"] == _answer(5)
        earlier = [h for h in histories if len(h) == len(history) - 2 and h == history[:len(h)]]
        assert len(history) == 1 or len(earlier) == 1  # each later turn extends exactly one earlier one
    counts = sorted(len(tekken.encode("".join(m["content"] for m in h))) for h in histories)
    assert sorted(row["input_tokens"] for row in result.rows) == counts


def test_a_failed_turn_skips_the_rest_of_its_session(tmp_path):
    # Row 1 (session 0, turn 1) fails; the server tells requests apart by the tag at the prompt's head,
    # which for a session is its first turn's: fail every request of session 0 after its first.
    seen: list[int] = []

    def behavior(i: int) -> str:
        seen.append(i)
        return "http500" if i == 0 and seen.count(0) == 2 else "ok"

    scenario = _scenario()
    with FakeServer(behavior) as server:
        result = run_bench(scenario, Target(server.url, MODEL), str(tmp_path / "results.jsonl"), workers=1)
        sent = len(server.bodies)
    by_row = {row["i"]: row for row in result.rows}
    assert len(by_row) == 6 and sent == 5  # session 0's third turn is never sent
    assert [by_row[i]["ok"] for i in range(6)] == [True, False, False, True, True, True]
    assert by_row[1]["error"] == "http_500" and by_row[2]["error"] == "skipped"
    assert by_row[2]["detail"] == "not sent: turn 1 of session 0 failed (http_500)"
    assert result.summary["requests"]["failed"] == 2


def test_message_lengths_add_up_to_the_drawn_prompts():
    requests = workload_requests(_scenario(**{"workload.input": {"kind": "normal", "mean": 60, "sd": 20},
                                              "workload.num_requests": 20}))
    messages = message_tokens(requests)
    assert (messages >= 1).all()
    turn = requests.sessions.turn
    for r in np.flatnonzero(turn > 0):
        assert requests.input_tokens[r] == requests.input_tokens[r - 1] + requests.output_tokens[r - 1] + messages[r]
    assert (messages[turn == 0] == requests.input_tokens[turn == 0]).all()


def test_bench_cli_runs_sessions_and_report_reads_them(tmp_path, monkeypatch, capsys):
    results = tmp_path / "r.jsonl"
    with FakeServer() as server:
        code, out, err = run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results", str(results),
                                  "--num-requests", "6", "--input-len", "30", "--input-dist", "fixed",
                                  "--output-len", "4", "--output-dist", "fixed", "--request-rate", "inf",
                                  "--set", "workload.sessions.turns=3", "--set", "workload.sessions.think_time=0.05",
                                  "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    code, out, err = run_cli(["report", str(results), "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["requests"]["completed"] == 6


def test_sessions_against_tokenpath_serve_count_the_prompts_as_the_server_does(tmp_path):
    scenario = _scenario(**{"delivery.network_rtt": 0})
    with LoopbackServer(scenario, ServeOptions(network_delay=False)) as url:
        result = run_bench(scenario, Target(url, "m"), str(tmp_path / "results.jsonl"), workers=1)
    rows = result.rows
    assert len(rows) == 6 and all(row["ok"] for row in rows)
    assert [row["input_tokens"] for row in rows] == [row["prompt_tokens_server"] for row in rows]
    for turns in _by_session(rows).values():  # the prompt grows by the answer and a new message each turn
        assert turns[0]["input_tokens"] < turns[1]["input_tokens"] < turns[2]["input_tokens"]
        assert all(after["sent_ns"] >= before["end_ns"] + after["think_ns"] for before, after in zip(turns, turns[1:]))


def test_a_run_stopped_while_sessions_think_keeps_their_finished_turns(tmp_path):
    """Ctrl-C while both sessions wait a long think time: exit 130 at once, both first turns kept, the
    turns not yet sent left out (not_sent), and the summary rebuilt from the file."""

    results = tmp_path / "r.jsonl"
    with FakeServer() as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenpath", "bench", "--base-url", server.url, "--model", MODEL,
             "--num-requests", "6", "--request-rate", "inf", "--input-len", "20", "--input-dist", "fixed",
             "--output-len", "4", "--output-dist", "fixed", "--results", str(results), "--workers", "1",
             "--set", "workload.sessions.turns=3", "--set", "workload.sessions.think_time=60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (results.exists() and len(results.read_text().splitlines()) >= 3):
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=15)  # well before the 60 s think time ends
    assert process.returncode == 130, err
    header, rows = read_results(results)
    assert [(row["session"], row["turn"], row["ok"]) for row in rows] == [(0, 0, True), (1, 0, True)]
    summary = bench_summary(header, rows)
    assert summary["requests"]["completed"] == 2 and summary["bench"]["not_sent"] == 4
