"""Metrics of a run (tokenpath.sim.summary, tokenpath.sim.run.Run) on small runs worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.delivery.spec import INVISIBLE_TOKEN_FRACTION
from tokenpath.sim.run import Run, itl_per_token_ns
from tokenpath.sim.summary import (
    LAYERS,
    PERCENTILES,
    SCHEMA,
    attribution_s,
    meets_slo,
    stats_s,
    summarize,
    tpot_ns,
    window_ns,
)

MS = 1_000_000  # ns


def ns(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def hand_run(failed=None) -> Run:
    """Three requests (times in ms):

    request  sent  ttft  ttfv  e2e   tokens at the client   input
    0        0     50    80    120   60, 80, 120            100
    1        10    100   120   160   130, 130, 160, 170     200   (two tokens share one event)
    2        20    170   180   180   200                    300

    Attribution (queue, compute, traffic, delivery): 0: 10+70+20+20, 1: 30+80+30+20, 2: 60+60+20+40.
    """
    return Run(
        source="simulate",
        scheduled_ns=ns([0, 10, 20]) * MS,
        sent_ns=ns([0, 10, 20]) * MS,
        input_tokens=ns([100, 200, 300]),
        output_tokens=ns([3, 4, 1]),
        ttft_ns=ns([50, 100, 170]) * MS,
        ttfv_ns=ns([80, 120, 180]) * MS,
        e2e_ns=ns([120, 160, 180]) * MS,
        token_client_ns=ns([60, 80, 120, 130, 130, 160, 170, 200]) * MS,
        token_offsets=ns([0, 3, 7, 8]),
        queue_ns=ns([10, 30, 60]) * MS,
        compute_ns=ns([70, 80, 60]) * MS,
        traffic_ns=ns([20, 30, 20]) * MS,
        delivery_ns=ns([20, 20, 40]) * MS,
        failed=failed,
    )


NO_SLO = {"ttft": None, "ttfv": None, "tpot": None, "e2e": None}


# stats_s

def test_stats_of_a_hand_sample():
    got = stats_s(ns([1, 2, 3, 4]) * 1_000_000_000)
    assert got == pytest.approx({"mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97, "p999": 3.997}, rel=1e-12)
    assert list(got) == ["mean", "p50", "p90", "p99", "p999"]


def test_stats_of_an_empty_sample_are_unknown():
    assert stats_s(np.empty(0, np.int64)) == {"mean": None, "p50": None, "p90": None, "p99": None, "p999": None}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**13), min_size=1, max_size=300))
def test_stats_match_numpy_percentiles(values):
    sample = ns(values)
    got = stats_s(sample)
    assert got["mean"] == pytest.approx(sample.mean() / 1e9, rel=1e-9, abs=1e-12)
    for key, q in PERCENTILES.items():
        assert got[key] == pytest.approx(np.percentile(sample, q) / 1e9, rel=1e-9, abs=1e-12)
    assert min(values) / 1e9 <= got["p50"] <= got["p90"] <= got["p99"] <= got["p999"] <= max(values) / 1e9
    assert all(isinstance(v, float) for v in got.values())


# Per-request metrics

def test_tpot_is_decode_time_per_token_after_the_first():
    run = hand_run()
    # (120 - 50) / 2 = 35 ms, (160 - 100) / 3 = 20 ms; the one-token request has no TPOT.
    assert tpot_ns(run).tolist() == [35 * MS, 20 * MS]


def test_itl_skips_the_gap_into_the_next_request_and_gaps_inside_an_event():
    run = hand_run()
    # Flat gaps: 20, 40, | 10 (request 0 -> 1), 0 (same event), 30, 10, | 30 (request 1 -> 2).
    assert sorted(run.itl_ns().tolist()) == sorted([20 * MS, 40 * MS, 30 * MS, 10 * MS])


def test_itl_of_single_token_requests_is_empty():
    run = Run("bench", ns([0, 0]), ns([0, 5]), ns([1, 1]), ns([1, 1]), ns([3, 3]), ns([3, 3]), ns([3, 3]),
              ns([3, 8]), ns([0, 1, 2]))
    assert run.itl_ns().tolist() == []


def _run_of_arrivals(increments):
    """A measured run of one request per list, each its own arrival times (the running sums of its
    increments; a zero increment is a token of the same event as the one before)."""
    rows = [np.cumsum(inc) + 1000 * i for i, inc in enumerate(increments)]
    lengths = [len(r) for r in rows]
    n = len(rows)
    run = Run("bench", ns([0] * n), ns([0] * n), ns([1] * n), ns(lengths), ns([1] * n), ns([1] * n), ns([1] * n),
              ns(np.concatenate(rows)), ns(np.concatenate([[0], np.cumsum(lengths)])))
    return rows, run


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=1, max_size=8))
def test_itl_is_the_positive_gaps_within_each_request(increments):
    """Each request: its own non-decreasing arrival times (zero increments are tokens of one event)."""
    rows, run = _run_of_arrivals(increments)
    expected = [int(g) for r in rows for g in np.diff(r) if g > 0]
    assert sorted(run.itl_ns().tolist()) == sorted(expected)


def test_sglang_bench_servings_itl_spreads_an_events_gap_over_its_tokens():
    # Events of 1, 3 and 1 tokens at 0, 30 and 40 ms: SGLang's bench_serving adds 30/3 ms three times,
    # then 10 ms (python/sglang/bench_serving.py); per event (vLLM's client, Run.itl_ns) 30 and 10 ms.
    times = ns([0, 30 * MS, 30 * MS, 30 * MS, 40 * MS])
    run = Run("bench", ns([0]), ns([0]), ns([1]), ns([5]), ns([1]), ns([1]), ns([1]), times, ns([0, 5]))
    assert itl_per_token_ns(run).tolist() == [10 * MS] * 4
    assert sorted(run.itl_ns().tolist()) == [10 * MS, 30 * MS]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=8), min_size=1, max_size=8))
def test_with_a_token_an_event_both_itls_are_the_same_gaps(increments):
    _, run = _run_of_arrivals(increments)
    assert sorted(itl_per_token_ns(run).tolist()) == sorted(run.itl_ns().tolist())


@pytest.mark.parametrize("metric, limit_ms, expected", [
    ("ttft", 100, [True, True, False]),
    ("ttft", 99.999999, [True, False, False]),
    ("ttfv", 150, [True, True, False]),
    ("tpot", 30, [False, True, True]),     # a one-token request has no decode time to miss
    ("tpot", 35, [True, True, True]),
    ("e2e", 160, [True, True, False]),
    ("e2e", 100, [False, False, False]),
])
def test_meets_slo_checks_each_target_inclusively(metric, limit_ms, expected):
    slo = {**NO_SLO, metric: limit_ms / 1000}
    assert meets_slo(hand_run(), slo).tolist() == expected


def test_meets_slo_needs_every_target_and_a_completed_request():
    run = hand_run()
    assert meets_slo(run, NO_SLO).tolist() == [True, True, True]
    both = {**NO_SLO, "ttft": 0.2, "tpot": 0.03}
    assert meets_slo(run, both).tolist() == [False, True, True]
    failed = hand_run(failed=np.array([False, True, False]))
    assert meets_slo(failed, NO_SLO).tolist() == [True, False, True]


def test_window_runs_from_first_send_to_last_byte():
    assert window_ns(hand_run()) == 200 * MS  # request 2: sent 20 + e2e 180
    # Without request 2 the last byte is request 1's: 10 + 160.
    assert window_ns(hand_run(failed=np.array([False, False, True]))) == 170 * MS
    assert window_ns(hand_run(failed=np.array([True, True, True]))) == 0


def test_attribution_means_per_layer_sum_to_the_mean_e2e():
    run = hand_run()
    got = attribution_s(run)
    assert list(got) == list(LAYERS)
    assert got == pytest.approx({"queue": 0.1 / 3, "compute": 0.070, "traffic": 0.07 / 3, "delivery": 0.08 / 3},
                                rel=1e-12)
    assert sum(got.values()) == pytest.approx(run.e2e_ns.mean() / 1e9, rel=1e-12)
    only_first = attribution_s(hand_run(failed=np.array([False, True, True])))
    assert only_first == pytest.approx({"queue": 0.010, "compute": 0.070, "traffic": 0.020, "delivery": 0.020},
                                       rel=1e-12)


def test_attribution_is_absent_for_a_run_without_it():
    run = Run("bench", ns([0]), ns([0]), ns([1]), ns([1]), ns([3]), ns([3]), ns([3]), ns([3]), ns([0, 1]))
    assert attribution_s(run) is None
    assert summarize(run, "m", "f" * 64, NO_SLO)["attribution_s"] is None


# The whole summary

def test_summary_of_a_hand_made_run():
    slo = {**NO_SLO, "ttft": 0.15}
    got = summarize(hand_run(), "hand", "ab" * 32, slo, bottleneck="compute")
    assert list(got) == ["schema", "source", "scenario", "requests", "window_s", "throughput", "latency_s",
                         "attribution_s", "bottleneck", "continuity"]
    # Every token within 180 ms of its send and no gap near 250 ms: the reader is never behind.
    assert got["continuity"]["qoe"]["mean"] == 1.0 and got["continuity"]["stalls_per_request"] == 0.0
    assert got["schema"] == SCHEMA == "tokenpath.summary/1"
    assert got["source"] == "simulate"
    assert got["scenario"] == {"name": "hand", "fingerprint": "ab" * 32}
    assert got["requests"] == {"completed": 3, "failed": 0, "input_tokens_mean": 200.0, "output_tokens_mean": 8 / 3,
                                "warmup": 0}
    assert got["window_s"] == pytest.approx(0.2)
    assert got["throughput"] == pytest.approx(
        {"output_tokens_per_s": 8 / 0.2, "requests_per_s": 3 / 0.2, "goodput_requests_per_s": 2 / 0.2})
    latency = got["latency_s"]
    assert list(latency) == ["ttft", "ttfv", "tpot", "itl", "e2e"]
    assert latency["ttft"]["mean"] == pytest.approx(0.32 / 3)
    assert latency["ttft"]["p50"] == pytest.approx(0.100)
    assert latency["ttfv"]["mean"] == pytest.approx(0.38 / 3)
    assert latency["tpot"]["mean"] == pytest.approx(0.0275)
    assert latency["tpot"]["p50"] == pytest.approx(0.0275)
    assert latency["itl"]["mean"] == pytest.approx(0.025)
    assert latency["itl"]["p50"] == pytest.approx(0.025)
    assert latency["e2e"]["mean"] == pytest.approx(0.46 / 3)
    assert latency["e2e"]["p999"] == pytest.approx(0.160 + 0.998 * 0.020)  # linear: rank 0.999 x 2 = 1.998
    assert got["attribution_s"]["compute"] == pytest.approx(0.070)
    assert got["bottleneck"] == "compute"
    assert json.loads(json.dumps(got)) == got  # plain JSON types only


def test_failed_requests_are_left_out_of_every_latency_and_count():
    got = summarize(hand_run(failed=np.array([False, True, False])), "hand", "0" * 64, {**NO_SLO, "ttft": 0.15})
    assert got["requests"] == {"completed": 2, "failed": 1, "input_tokens_mean": 200.0, "output_tokens_mean": 2.0,
                               "warmup": 0}
    latency = got["latency_s"]
    assert latency["ttft"]["mean"] == pytest.approx(0.110)      # (50 + 170) / 2
    assert latency["ttfv"]["mean"] == pytest.approx(0.130)      # (80 + 180) / 2
    assert latency["e2e"]["mean"] == pytest.approx(0.150)       # (120 + 180) / 2
    assert latency["tpot"]["mean"] == pytest.approx(0.035)      # request 0 only
    assert latency["itl"]["mean"] == pytest.approx(0.030)       # 20 and 40: request 1's gaps are gone
    assert latency["itl"]["p99"] <= 0.040
    assert got["window_s"] == pytest.approx(0.2)
    assert got["throughput"] == pytest.approx(
        {"output_tokens_per_s": 4 / 0.2, "requests_per_s": 2 / 0.2, "goodput_requests_per_s": 1 / 0.2})
    assert got["attribution_s"]["queue"] == pytest.approx(0.035)  # (10 + 60) / 2


def test_summary_of_a_run_where_everything_failed_has_no_latencies():
    got = summarize(hand_run(failed=np.array([True, True, True])), "hand", "0" * 64, NO_SLO)
    assert got["requests"] == {"completed": 0, "failed": 3, "input_tokens_mean": 0.0, "output_tokens_mean": 0.0,
                               "warmup": 0}
    assert got["window_s"] == 0.0
    assert set(got["throughput"].values()) == {0.0}
    for stats in got["latency_s"].values():  # no sample: unknown, not 0 s
        assert set(stats.values()) == {None}
    assert set(got["attribution_s"].values()) == {0.0}


def test_run_length_and_completed_mask():
    run = hand_run()
    assert len(run) == 3 and run.completed.tolist() == [True, True, True]
    assert hand_run(failed=np.array([True, False, False])).completed.tolist() == [False, True, True]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 10**12), min_size=1, max_size=400))
def test_log_histogram_percentiles_are_within_a_tenth_of_a_percent(values):
    from tokenpath.sim.summary import LogHistogram, stats_s

    histogram = LogHistogram()
    half = len(values) // 2
    histogram.add(np.array(values[:half], np.int64))
    histogram.add(np.array(values[half:], np.int64))
    exact, approx = stats_s(np.array(values)), histogram.stats_s()
    assert approx["mean"] == pytest.approx(exact["mean"], rel=1e-12)
    for key in ("p50", "p90", "p99", "p999"):
        # each sample is placed within 0.1% of itself, so any blend of two samples is too
        assert approx[key] == pytest.approx(exact[key], rel=1.001e-3)


def test_a_warm_up_leaves_the_first_requests_out_of_every_metric():
    from tokenpath import load_scenario, simulate
    from tokenpath.sim.document import result_document

    overrides = {"workload.num_requests": 60, "workload.max_concurrency": 6, "workload.arrival.rate": "inf"}
    whole = simulate(load_scenario("typical", overrides)).run
    warm = result_document(simulate(load_scenario("typical", {**overrides, "workload.warmup_requests": 20})))[0]
    kept = whole.after(20)
    assert warm["requests"]["completed"] == 40 and warm["requests"]["warmup"] == 20
    assert warm["latency_s"]["ttft"]["mean"] == pytest.approx(kept.ttft_ns.mean() / 1e9, rel=1e-12)
    assert warm["latency_s"]["e2e"]["p50"] == pytest.approx(np.percentile(kept.e2e_ns, 50) / 1e9, rel=1e-12)
    assert warm["attribution_s"]["queue"] == pytest.approx(kept.queue_ns.mean() / 1e9, rel=1e-12)
    # The window runs from the first measured send to the last byte.
    assert warm["window_s"] == pytest.approx(((kept.sent_ns + kept.e2e_ns).max() - kept.sent_ns.min()) / 1e9)
    # Its tokens are the measured requests' own: ITL over the 40 requests' gaps only.
    assert len(kept.itl_ns()) < len(whole.itl_ns())
    assert np.array_equal(kept.token_client_ns, whole.token_client_ns[whole.token_offsets[20]:])


def test_a_warm_up_that_leaves_nothing_to_measure_is_a_one_line_error():
    from tokenpath import load_scenario
    from tokenpath.config.errors import UserError

    with pytest.raises(UserError, match="warmup_requests 50 leaves none of the 50 requests"):
        load_scenario("typical", {"workload.num_requests": 50, "workload.warmup_requests": 50})


def test_a_simulations_summary_carries_the_scenario_as_it_ran(monkeypatch, capsys):
    """`resolved`: the deployment, engine and last mile as plain values, the defaults filled in."""
    from cli_helpers import simulate_json

    document = simulate_json(["--num-requests", "40", "--tp", "4", "--set", "delivery.detokenize=\"detokenizer\"",
                              "--set", "delivery.network_rtt=\"50ms\""], monkeypatch, capsys)
    resolved = document["resolved"]
    assert ({key: resolved["deployment"][key]
             for key in ("model", "precision", "chip", "chips", "tp", "pp", "replicas")}
            == {"model": "llama-3.1-70b", "precision": "fp8", "chip": "h200", "chips": 8, "tp": 4, "pp": 1,
                "replicas": 2})
    assert resolved["deployment"]["fabric"]["kind"] == document["fabric"]["kind"] == "switch"
    assert resolved["deployment"]["fabric"]["name"] == document["fabric"]["name"]
    # The engine profile's defaults, resolved: vllm-v1's newest release schedules each step while the one before
    # runs (its async scheduling) and replays every step's graph.
    assert (resolved["engine"]["scheduler"], resolved["engine"]["host_overlap"], resolved["engine"]["cuda_graphs"]) \
        == ("vllm-v1", True, "all")
    assert resolved["engine"]["max_num_seqs"] == 1024 and resolved["engine"]["max_num_batched_tokens"] == 8192
    assert resolved["delivery"]["detokenize"] == "detokenizer"
    assert resolved["delivery"]["api_servers"] == 2  # vLLM V1: one per data-parallel replica
    assert resolved["delivery"]["network_rtt_s"] == pytest.approx(0.05)
    assert resolved["delivery"]["stream_interval_tokens"] == 1
    assert resolved["delivery"]["invisible_token_fraction"] == INVISIBLE_TOKEN_FRACTION
    assert resolved["workload"]["requests"] == 40
