"""Multi-turn sessions: each turn's prompt repeats the conversation so far, sent a think time after
the previous answer reached the client; the prefix cache finds the history."""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.config.errors import UserError
from tokenpath.sim.document import result_document
from tokenpath.workload import generate
from tokenpath.workload.spec import SessionSpec, WorkloadSpec

BLOCK = 64  # engine.block_size under the newest vLLM (engine/kv_blocks.py)


def _scenario(routing="round_robin", replicas=1, sessions=None, **workload):
    overrides = {
        "workload.num_requests": 30, "workload.arrival": {"rate": 2.0},
        "workload.sessions": sessions or {"turns": 3, "think_time": "1.5 s"},
        "deployment.chips": replicas, "deployment.tp": 1, "deployment.routing": routing,
    }
    overrides.update({f"workload.{key}": value for key, value in workload.items()})
    return load_scenario("typical", overrides)


def test_sessions_grow_their_prompts_by_the_previous_answer_and_a_new_message():
    spec = WorkloadSpec(num_requests=10, sessions={"turns": 3, "think_time": "2 s"},
                        input={"kind": "fixed", "value": 100}, output={"kind": "fixed", "value": 40})
    requests = generate(spec, np.random.default_rng(0))
    assert requests.sessions.session.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]  # the last session cut short
    assert requests.sessions.turn.tolist() == [0, 1, 2] * 3 + [0]
    assert requests.input_tokens.tolist() == [100, 240, 380] * 3 + [100]
    assert requests.sessions.think_s.tolist() == [0.0, 2.0, 2.0] * 3 + [0.0]
    # A session's turns share its start time (a lower bound); sessions start by the arrival process.
    assert requests.arrival_s[0] == requests.arrival_s[2] < requests.arrival_s[3]
    # Turn 3 names the whole session: message 1 (ends at 100), answer 1 (less its last token: 139),
    # message 2 (240), answer 2 (279), message 3 (380), answer 3 (419).
    keys, ends = requests.prefixes.segments(2)
    assert ends == [100, 139, 240, 279, 380, 419]
    assert keys[:4] == requests.prefixes.segments(1)[0][:4]


def test_a_three_turn_session_finds_the_previous_turns_prompt_and_answer_and_waits_its_think_time():
    sim = simulate(_scenario())
    run, requests = sim.run, sim.requests
    turn = requests.sessions.turn
    later = np.flatnonzero(turn > 0)
    before = later - 1
    # Everything fits in the cache: each later turn finds the previous prompt and answer (its last
    # token's KV is never computed), in whole blocks.
    expected = (requests.input_tokens[before] + requests.output_tokens[before] - 1) // BLOCK * BLOCK
    assert np.array_equal(run.prefix_hit_tokens[later], expected)
    assert (run.prefix_hit_tokens[turn == 0] == 0).all()
    # Turn k + 1 is sent 1.5 s after turn k's last byte reached the client.
    last_byte_ns = run.sent_ns[before] + run.e2e_ns[before]
    assert np.array_equal(run.sent_ns[later], last_byte_ns + 1_500_000_000)
    assert np.array_equal(run.scheduled_ns[later], run.sent_ns[later])


def test_the_hit_rate_counts_a_chat_template_s_tokens_in_the_prompts_as_in_the_hits():
    # Two turns of a 10-token message and a 10-token answer, each message wrapped in 35 template tokens: the
    # engine takes 45, then 45 + 10 + 45 = 100 tokens, and turn 2 finds message 1 (ends at 45) and answer 1
    # less its last token (54): 3 whole blocks of 16, 48 tokens. The client counts 10 and 30.
    sim = simulate(load_scenario("typical", {
        "workload.num_requests": 2, "workload.sessions": {"turns": 2, "think_time": "1 s"},
        "workload.chat_template_tokens": 35, "workload.input": {"kind": "fixed", "value": 10},
        "workload.output": {"kind": "fixed", "value": 10}, "deployment.chips": 1, "deployment.tp": 1,
        "engine.block_size": 16}))
    assert sim.run.prefix_hit_tokens.tolist() == [0, 48]
    assert sim.run.input_tokens.tolist() == [10, 30]
    assert sim.summary["prefix_cache"]["hit_rate"] == 48 / 145  # (it read 48 / 40: 120%)


def _routed(policy):
    sim = simulate(_scenario(policy, replicas=4, num_requests=80))
    return sim, result_document(sim)[0]


def test_session_affinity_keeps_each_session_on_one_replica_and_finds_more_history_than_round_robin():
    affine, affine_doc = _routed("session_affinity")
    spread, spread_doc = _routed("round_robin")
    sessions = affine.requests.sessions.session
    for s in np.unique(sessions):
        assert len(np.unique(affine.run.replica[sessions == s])) == 1
    # Round-robin sends turns of one session to different replicas, where the history is not cached.
    assert any(len(np.unique(spread.run.replica[sessions == s])) > 1 for s in np.unique(sessions))
    assert affine_doc["prefix_cache"]["hit_rate"] > spread_doc["prefix_cache"]["hit_rate"] + 0.2
    # Round-robin's turns still wait for the turn before, wherever it ran.
    later = np.flatnonzero(spread.requests.sessions.turn > 0)
    think_ns = spread.run.sent_ns[later] - (spread.run.sent_ns[later - 1] + spread.run.e2e_ns[later - 1])
    assert (think_ns == 1_500_000_000).all()


def test_exponential_think_times_have_the_mean_asked_for():
    spec = WorkloadSpec(num_requests=20_000, sessions={"turns": 2, "think_time": "3 s",
                                                       "think_distribution": "exponential"})
    think_s = generate(spec, np.random.default_rng(1)).sessions.think_s
    assert abs(think_s[1::2].mean() - 3.0) < 0.1
    assert (think_s[0::2] == 0).all()


@pytest.mark.parametrize("sessions, extra, fragment", [
    ({"turns": 3, "thinking": "1 s"}, {}, "thinking"),
    ({"turns": 0}, {}, "turns 0 must be from 1 to 1000"),
    ({"turns": {"kind": "fixed", "value": 2000}}, {}, "turns: value 2000 is above 1000"),
    ({"think_time": "5 parsecs"}, {}, "think_time"),
    ({"turns": 2}, {"workload.max_concurrency": 4}, "do not combine with max_concurrency"),
])
def test_bad_session_settings_are_one_line_errors(sessions, extra, fragment):
    with pytest.raises(UserError) as caught:
        load_scenario("typical", {"workload.sessions": sessions, **extra})
    message = str(caught.value)
    assert fragment in message and "\n" not in message


def test_the_printed_summary_shows_the_hit_rate_the_load_per_replica_and_the_sessions():
    import io
    import re

    from rich.console import Console

    from tokenpath.report.simulation import describe
    from tokenpath.report.table import print_summary

    sim, document = _routed("session_affinity")
    out = io.StringIO()
    print_summary(Console(file=out, width=200), document, describe(sim), None)
    text = out.getvalue()
    served = document["routing"]["requests_per_replica"]
    rate = document["prefix_cache"]["hit_rate"]
    assert re.search(r"prefix cache hit rate\s*│\s*" + re.escape(f"{rate:.1%} ("), text)
    assert " / ".join(str(count) for count in served) + f" (imbalance {max(served) / (sum(served) / 4):.2f})" in text
    assert "4 replicas, session-affinity routing" in text
    assert "3 turns each, 1.5 s think time after each answer's last byte" in text
    assert f"the turns of {int(sim.requests.sessions.session[-1]) + 1} sessions" in text


def _no_keys(monkeypatch):
    """Fail the test if a session's prefix keys (n x turns of them) are built."""
    def refuse(rows):
        raise AssertionError(f"prefix keys built for {len(rows):,} requests")

    monkeypatch.setattr(importlib.import_module("tokenpath.workload.generate"), "session_prefixes", refuse)


def test_sessions_too_long_for_the_context_are_refused_before_their_keys_are_built(monkeypatch):
    # 1000 turns of about 700 tokens each: the last turns need ~700k tokens of context, the model
    # holds 131,072. Building the keys first took 23.7 GB for a million requests.
    from tokenpath.sim.simulate import prepare

    _no_keys(monkeypatch)
    scenario = load_scenario("typical", {"workload.sessions.turns": 1000, "workload.num_requests": 1_000_000})
    with pytest.raises(UserError) as caught:
        prepare(scenario)
    message = str(caught.value)
    assert message.startswith("workload.sessions.turns: request ") and "of its session) needs " in message
    assert "tokens of context but llama-3.1-70b holds 131072; lower workload.sessions.turns" in message


def test_the_context_error_of_a_long_session_is_one_line_from_the_command_line():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tokenpath", "simulate", "--set", "workload.sessions.turns=1000",
                           "--set", "workload.num_requests=100000"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "workload.sessions.turns: request 20999 (turn 1000 of its session) needs" in done.stderr


def test_sessions_too_large_for_memory_are_refused_naming_turns(monkeypatch):
    # Short turns fit the context, but 1000 turns of a million requests name 1,001,000,000 segments
    # (each turn its message and answer and every one before it): 113 GiB.
    from tokenpath.config import memory

    _no_keys(monkeypatch)
    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * memory.GIB)
    spec = WorkloadSpec(num_requests=1_000_000, sessions={"turns": 1000}, input={"kind": "fixed", "value": 10},
                        output={"kind": "fixed", "value": 10})
    with pytest.raises(UserError) as caught:
        generate(spec, np.random.default_rng(0))
    assert str(caught.value) == (
        "workload.sessions.turns: 1,000,000 requests with 1,001,000,000 prefix segments (each turn names every turn "
        "before it) need about 113.2 GiB of memory and this machine has 8.0 GiB available; lower "
        "workload.sessions.turns or workload.num_requests")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 60), turns=st.integers(1, 8), answer=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_the_segment_count_checked_is_the_number_of_keys_built(n, turns, answer, seed):
    from tokenpath.workload.generate import session_prefixes, session_rows, session_segments

    rng = np.random.default_rng(seed)
    rows = session_rows(SessionSpec(turns=turns), np.zeros(n), rng.integers(1, 50, n), rng.integers(1, answer + 1, n),
                        rng)
    assert session_segments(rows) == len(session_prefixes(rows).keys)
