"""Continuity: stalls after the first visible text and Andes' QoE (continuity.py), in simulate and bench."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_bench_server import MODEL, FakeServer
from tokenpath import load_scenario, simulate
from tokenpath.bench import Target, run_bench
from tokenpath.bench.results import token_times
from tokenpath.config.errors import UserError
from tokenpath.sim.continuity import (
    READING_TOKENS_PER_S,
    ContinuitySettings,
    ContinuitySpec,
    parse_reading_speed,
    per_request,
)
from tokenpath.sim.document import result_document

MS = 1_000_000


def reference_qoe(arrivals_ns, sent_ns, visible_ns, spec):
    """Andes' QoE token by token, as its definition reads: a reader digests at most one token per 1/TDS,
    nothing before the first visible character; QoE = 1 - S_delay / S_whole."""
    period = round(1e9 / spec.reading_tokens_per_s)
    read, previous = [], None
    for arrival in arrivals_ns:
        arrival = max(arrival, visible_ns)
        previous = arrival if previous is None else max(arrival, previous + period)
        read.append(previous)
    expected = [sent_ns + spec.expected_ttft_s * 1e9 + k * period for k in range(len(arrivals_ns))]
    end = max(read[-1], expected[-1])
    s_delay = sum(max(0.0, r - e) for r, e in zip(read, expected))
    s_whole = sum(end - e for e in expected)
    return 1.0 if s_delay == 0 else 1.0 - s_delay / s_whole


def test_hand_computed_request():
    # Reader at 10 tokens/s, expecting the first token at 1 s: tokens arrive at 1.5, 1.6 and 2.2 s.
    # Read at 1.5, 1.6, 2.2 against 1.0, 1.1, 1.2 expected: S_delay = 0.5 + 0.5 + 1.0 = 2.0 token-s;
    # S_whole to t_end = 2.2 s: 1.2 + 1.1 + 1.0 = 3.3 token-s; QoE = 1 - 2.0/3.3. One stall: 1.6 -> 2.2.
    spec = ContinuitySpec(stall_threshold_s=0.25, reading_tokens_per_s=10.0, expected_ttft_s=1.0)
    flow = per_request(np.array([1500, 1600, 2200]) * MS, np.array([0, 3]), np.array([0]), np.array([1500 * MS]), spec)
    assert flow["stalls"].tolist() == [1]
    assert flow["stall_ns"].tolist() == [600 * MS]
    assert abs(flow["qoe"][0] - (1 - 2.0 / 3.3)) < 1e-12


def test_reading_speed_default_is_brysbaert_in_tokens():
    assert abs(READING_TOKENS_PER_S - 238 / 60 * 4 / 3) < 1e-12  # 5.29 tokens/s


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_vectorized_matches_the_definition(data):
    n = data.draw(st.integers(1, 5))
    spec = ContinuitySpec(0.25, data.draw(st.sampled_from([2.0, 5.29, 40.0])), data.draw(st.sampled_from([0.2, 1.0])))
    tokens, offsets, sent, visible = [], [0], [], []
    for _ in range(n):
        start = data.draw(st.integers(0, 10**9))
        times = sorted(start + t for t in data.draw(st.lists(st.integers(0, 4 * 10**9), min_size=1, max_size=8)))
        tokens += times
        offsets.append(len(tokens))
        sent.append(start)
        visible.append(times[data.draw(st.integers(0, len(times) - 1))])
    flow = per_request(np.array(tokens), np.array(offsets), np.array(sent), np.array(visible), spec)
    for i in range(n):
        times = tokens[offsets[i]:offsets[i + 1]]
        assert abs(flow["qoe"][i] - reference_qoe(times, sent[i], visible[i], spec)) < 1e-9
        gaps = [(b - a) for a, b in zip(times, times[1:]) if a >= visible[i] and b - a > 0.25e9]
        assert flow["stalls"][i] == len(gaps) and flow["stall_ns"][i] == sum(gaps)


def _small(n=200, **extra):
    return load_scenario(None, {"workload.num_requests": n, **extra})


def test_qoe_is_one_when_delivery_outpaces_the_reader():
    # The default deployment at 34 req/s: TTFV about 0.1 s and about 30 ms a token, both well ahead of
    # a reader expecting the first token at 1 s and one every 0.19 s.
    document, _ = result_document(simulate(_small()))
    flow = document["continuity"]
    assert flow["qoe"]["mean"] == 1.0 and flow["qoe"]["p1"] == 1.0
    assert flow["stalls_per_request"] == 0.0


def test_simulate_matches_the_definition_on_its_own_token_times():
    # A 3 s round trip puts every first token past the reader's 1 s: QoE below 1, as the reference says.
    sim = simulate(_small(40, **{"delivery.network_rtt": "3 s"}))
    run, spec = sim.run, ContinuitySpec()
    qoe = []
    for i in range(len(run)):
        times = run.token_client_ns[run.token_offsets[i]:run.token_offsets[i + 1]].tolist()
        qoe.append(reference_qoe(times, int(run.sent_ns[i]), int(run.sent_ns[i] + run.ttfv_ns[i]), spec))
    assert np.allclose(run.qoe, qoe, atol=1e-9)
    assert max(qoe) < 1.0
    document, _ = result_document(sim)
    assert abs(document["continuity"]["qoe"]["mean"] - np.mean(qoe)) < 1e-9



def test_a_simulation_that_skips_judging_has_the_same_times_and_a_summary_judges_them_alike():
    """simulate(continuity=False), as validate calls it: every time the same, no stalls or QoE on the run, and a
    summary built from it judges the token times as the simulation would have (same values)."""
    scenario = _small(40, **{"delivery.network_rtt": "3 s"})
    judged, skipped = simulate(scenario), simulate(scenario, continuity=False)
    assert skipped.run.qoe is None and skipped.run.stalls is None and skipped.run.stall_ns is None
    for name in ("ttft_ns", "ttfv_ns", "e2e_ns", "queue_ns", "delivery_ns", "token_client_ns"):
        assert np.array_equal(getattr(judged.run, name), getattr(skipped.run, name))
    assert result_document(skipped)[0]["continuity"] == result_document(judged)[0]["continuity"]

def test_bench_counts_a_server_stall(tmp_path):
    scenario = load_scenario(None, {"workload.num_requests": 2, "workload.arrival.rate": 100.0,
                                    "workload.input": {"kind": "fixed", "value": 16},
                                    "workload.output": {"kind": "fixed", "value": 8}})
    with FakeServer("pause", pause_s=0.6) as server:
        result = run_bench(scenario, Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1,
                           timeouts={"stall_timeout_s": 5.0, "request_timeout_s": 20.0, "connect_timeout_s": 5.0})
    flow = result.summary["continuity"]
    # Recount from the recorded arrivals: every gap after the first visible text over 250 ms.
    lines = [orjson.loads(line) for line in (tmp_path / "r.jsonl").read_bytes().splitlines()[1:]]
    rows = [line for line in lines if "client" not in line]  # each worker's own CPU and lag close the file
    stalls = []
    for row in rows:  # (events read together are stamped 1 ns apart, as the run stamps them: bench/results.py)
        times = token_times(np.asarray(row["arrival_ns"]), np.ones(len(row["arrival_ns"]), np.int64)).tolist()
        stalls.append([b - a for a, b in zip(times, times[1:]) if a >= row["first_visible_ns"] and b - a > 0.25e9])
    assert all(len(gaps) >= 1 for gaps in stalls)  # the server's 0.6 s pause, in every request
    assert flow["stalls_per_request"] == np.mean([len(gaps) for gaps in stalls])
    assert abs(flow["stall_s_per_request"] - np.mean([sum(gaps) for gaps in stalls]) / 1e9) < 1e-9
    assert flow["stall_s_max"] >= 0.6
    assert flow["requests_with_stalls"] == 1.0


def test_the_stall_threshold_decides_what_counts():
    # Tokens at 1.0 (first visible), 1.1, 1.4, 2.0 s: gaps of 100, 300 and 600 ms after the first
    # visible text. 50 ms counts all three, 250 ms the two longer, 500 ms only the 600 ms gap.
    arrivals = np.array([1000, 1100, 1400, 2000]) * MS
    counted = {}
    for threshold in ("50 ms", "250 ms", "500 ms", "1 s"):
        spec = ContinuitySettings.model_validate({"stall_threshold": threshold}).spec()
        flow = per_request(arrivals, np.array([0, 4]), np.array([0]), np.array([1000 * MS]), spec)
        counted[threshold] = (int(flow["stalls"][0]), int(flow["stall_ns"][0]) // MS)
    assert counted == {"50 ms": (3, 1000), "250 ms": (2, 900), "500 ms": (1, 600), "1 s": (0, 0)}


def test_scenario_continuity_settings_reach_the_summary():
    # A 20 ms threshold on a stream about 30 ms a token: nearly every gap is a stall; the default
    # 250 ms finds none. A reader expecting the first token at 10 ms is always behind: QoE below 1.
    default, _ = result_document(simulate(_small(40)))
    tight, _ = result_document(simulate(_small(40, **{"continuity": {"stall_threshold": "20 ms",
                                                                     "expected_ttft": "10 ms",
                                                                     "reading_speed": "600 words/min"}})))
    assert default["continuity"]["stalls_per_request"] == 0.0 and default["continuity"]["qoe"]["mean"] == 1.0
    assert tight["continuity"]["stalls_per_request"] > 10 and tight["continuity"]["qoe"]["mean"] < 1.0
    assert (tight["continuity"]["stall_threshold_s"], tight["continuity"]["expected_ttft_s"]) == (0.02, 0.01)
    assert tight["continuity"]["reading_tokens_per_s"] == pytest.approx(600 / 60 * 4 / 3)
    assert default["continuity"]["stall_threshold_s"] == 0.25


@pytest.mark.parametrize("table, fragment", [
    ({"stall_threshold": "0 ms"}, "continuity.stall_threshold: Input should be greater than 0"),
    ({"stall_threshold": "soon"}, "continuity.stall_threshold: cannot read 'soon' as a duration"),
    ({"reading_speed": "238 words/hour"}, "continuity.reading_speed: cannot read '238 words/hour' as a reading speed"),
    ({"reading_speed": 0}, "continuity.reading_speed: 0 is out of range: a reading speed runs from 0.1"),
    ({"reading": "238 words/min"}, "continuity.reading"),
])
def test_bad_continuity_settings_are_one_line_errors(table, fragment):
    with pytest.raises(UserError) as error:
        _small(4, continuity=table)
    assert fragment in str(error.value) and "\n" not in str(error.value)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.1, 10_000.0), st.sampled_from(["tokens/s", "token/s", "tokens / min", "words/min", "words/s", ""]))
def test_reading_speeds_parse_in_their_unit(number, unit):
    per_token = {"tokens/s": 1.0, "token/s": 1.0, "tokens / min": 1 / 60, "words/min": 4 / 3 / 60, "words/s": 4 / 3,
                 "": 1.0}
    tokens_per_s = number * per_token[unit]
    if not 0.1 <= tokens_per_s <= 10_000:
        with pytest.raises(ValueError, match="out of range"):
            parse_reading_speed(f"{number!r} {unit}")
        return
    assert parse_reading_speed(f"{number!r} {unit}") == pytest.approx(tokens_per_s, rel=1e-12)
    settings_ = ContinuitySettings.model_validate({"reading_speed": f"{number!r} {unit}"})
    assert ContinuitySettings.model_validate(settings_.model_dump(mode="json")) == settings_  # round trip


def test_bench_judges_stalls_by_the_scenario_threshold(tmp_path):
    # The server's 0.6 s pause is no stall when the scenario's threshold is 1 s.
    scenario = load_scenario(None, {"workload.num_requests": 2, "workload.arrival.rate": 100.0,
                                    "workload.input": {"kind": "fixed", "value": 16},
                                    "workload.output": {"kind": "fixed", "value": 8},
                                    "continuity.stall_threshold": "1 s"})
    with FakeServer("pause", pause_s=0.6) as server:
        result = run_bench(scenario, Target(server.url, MODEL), str(tmp_path / "r.jsonl"), workers=1,
                           timeouts={"stall_timeout_s": 5.0, "request_timeout_s": 20.0, "connect_timeout_s": 5.0})
    flow = result.summary["continuity"]
    assert flow["stall_threshold_s"] == 1.0 and flow["stalls_per_request"] == 0.0 and flow["stall_s_max"] == 0.0
    header = orjson.loads((tmp_path / "r.jsonl").read_bytes().splitlines()[0])
    assert header["scenario"]["table"]["continuity"]["stall_threshold"] == "1 s"


def test_a_request_read_on_time_is_not_held_back_by_the_one_before():
    # Request 0 (sent at 2 s) has all its tokens by 2.3 s, before the reader expects the first one
    # (3 s); its 300 ms gap is longer than a token's reading time (100 ms), so it takes the exact sum.
    # Request 1, sent at 0, is read at 0.5 and 0.9 s, ahead of 1.0 and 1.1 s. Both are never behind,
    # whatever else shares the computation.
    spec = ContinuitySpec(stall_threshold_s=0.25, reading_tokens_per_s=10.0, expected_ttft_s=1.0)
    tokens = np.array([2000, 2300, 500, 900]) * MS
    flow = per_request(tokens, np.array([0, 2, 4]), np.array([2000, 0]) * MS, np.array([2000, 500]) * MS, spec)
    assert flow["qoe"].tolist() == [1.0, 1.0]
    assert flow["qoe"].tolist() == [reference_qoe([2000 * MS, 2300 * MS], 2000 * MS, 2000 * MS, spec),
                                    reference_qoe([500 * MS, 900 * MS], 0, 500 * MS, spec)]


def test_a_disaggregated_simulation_skips_judging_alike():
    scenario = load_scenario("typical", {"deployment.chips": 16, "deployment.prefill_replicas": 1,
                                         "workload.num_requests": 30})
    judged, skipped = simulate(scenario), simulate(scenario, continuity=False)
    assert skipped.run.qoe is None and judged.run.qoe is not None
    assert np.array_equal(judged.run.ttft_ns, skipped.run.ttft_ns)
    assert result_document(skipped)[0]["continuity"] == result_document(judged)[0]["continuity"]
