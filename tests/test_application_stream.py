"""A model streaming into the stages after it (`stream_into_next`): those stages start at its first token and
end no earlier than its last, laid out by hand; the five layers still sum exactly to E2E; TTFT, TTFV and the
stream's TPOT do not move; the lever, on a light even load and on an agent's last call."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from report_helpers import assert_five_layers_sum
from tokenpath import load_scenario, simulate
from tokenpath.application.spec import ApplicationSpec
from tokenpath.application.stream import streamed_into, streaming
from tokenpath.application.timeline import draw_latencies_ns, timeline
from tokenpath.config.errors import UserError
from tokenpath.whatif.catalog import APPLICATION_GROUP, catalog

MS = 10**6
LEVER = "stream the answer into the stages after it"


def fixed(ms):
    return {"kind": "fixed", "value": f"{ms} ms"}


def laid_by_hand(stages, latency_ns, stream_ms):
    spec = ApplicationSpec.model_validate({"stages": stages})
    n = len(stream_ms)
    return streamed_into(streaming(spec, latency_ns, timeline(spec, latency_ns, n)), np.array(stream_ms) * MS)


def test_a_stage_reading_the_stream_ends_with_it_or_adds_what_outlasts_it():
    stages = [{"name": "prep", "kind": "cpu", "latency": fixed(30)},
              {"name": "answer", "kind": "model", "after": ["prep"], "stream_into_next": True},
              {"name": "speak", "kind": "tool", "after": ["answer"], "latency": fixed(400)},
              {"name": "format", "kind": "cpu", "after": ["speak"], "latency": fixed(5)}]
    latency = {"prep": np.full(4, 30 * MS), "speak": np.array([400, 3000, 400, 1000]) * MS,
               "format": np.full(4, 5 * MS)}
    # streams of 1 s, 1 s, none (one token) and 1 s: speak starts 1 s before the last token (at the first)
    laid = laid_by_hand(stages, latency, [1000, 1000, 0, 1000])
    # 400 ms inside a 1 s stream ends with it, adding nothing; 3 s adds 3 s less the stream; 1 s ends as
    # the stream does; format follows speak in series in each
    assert laid.post_ns.tolist() == [5 * MS, 2005 * MS, 405 * MS, 5 * MS]
    assert laid.detail_ns["speak"].tolist() == [0, 2000 * MS, 400 * MS, 0]
    assert laid.detail_ns["format"].tolist() == [5 * MS] * 4
    assert laid.pre_ns.tolist() == [30 * MS] * 4 and laid.detail_ns["prep"].tolist() == [30 * MS] * 4
    # without streaming, the stages start at the last token
    plain = [{k: v for k, v in stage.items() if k != "stream_into_next"} for stage in stages]
    assert laid_by_hand(plain, latency, [1000] * 4).post_ns.tolist() == [405 * MS, 3005 * MS, 405 * MS, 1005 * MS]


def test_parallel_stages_after_a_stream_hold_only_what_outlasts_it():
    stages = [{"name": "answer", "kind": "model", "stream_into_next": True},
              {"name": "tts", "kind": "tool", "after": ["answer"], "latency": fixed(1)},
              {"name": "moderate", "kind": "cpu", "after": ["answer"], "latency": fixed(1)},
              {"name": "log", "kind": "cpu", "after": ["tts", "moderate"], "latency": fixed(1)}]
    latency = {"tts": np.array([1200, 300]) * MS, "moderate": np.array([1500, 200]) * MS,
               "log": np.array([10, 10]) * MS}
    laid = laid_by_hand(stages, latency, [1000, 1000])
    # request 0: moderate ends 500 ms after the last token (tts 200 ms), then log: 510 ms, moderate's 500
    # request 1: both end with the stream; log runs from the last token
    assert laid.post_ns.tolist() == [510 * MS, 10 * MS]
    assert laid.detail_ns["moderate"].tolist() == [500 * MS, 0] and laid.detail_ns["tts"].tolist() == [0, 0]
    assert laid.detail_ns["log"].tolist() == [10 * MS, 10 * MS]


def test_only_the_model_streams_into_the_next_stage():
    with pytest.raises(ValueError, match="only the model stage streams into the stages after it"):
        ApplicationSpec.model_validate({"stages": [
            {"name": "answer", "kind": "model"},
            {"name": "format", "kind": "cpu", "after": ["answer"], "latency": fixed(5), "stream_into_next": True}]})


# rag's shape with a long stage after the answer beside its format (no reranker on the GPU: every stage drawn)
STAGES = [
    {"name": "embed", "kind": "cpu", "latency": fixed(8)},
    {"name": "retrieve", "kind": "retrieval", "after": ["embed"], "latency": fixed(20),
     "cache": {"hit_rate": 0.5, "hit_latency": "1 ms"}},
    {"name": "answer", "kind": "model", "after": ["retrieve"],
     "prompt": {"template_tokens": 200, "chunks": 5, "chunk_tokens": 128}},
    {"name": "format", "kind": "cpu", "after": ["answer"], "latency": fixed(5)},
    {"name": "review", "kind": "tool", "after": ["answer", "embed"],
     "latency": {"kind": "lognormal", "mean": "2 s", "sd": "1.5 s"}},
]


def rag(stages, **overrides):
    return load_scenario("rag", {"workload.num_requests": 24, "application.stages": stages, **overrides})


def streamed(stages):
    return [{**stage, "stream_into_next": True} if stage["kind"] == "model" else stage for stage in stages]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([2.0, 40.0]), concurrency=st.one_of(st.none(), st.integers(1, 8)),
       seed=st.integers(0, 1000))
def test_the_five_layers_sum_exactly_with_a_stream_and_its_first_tokens_do_not_move(rate, concurrency, seed):
    knobs = {"workload.arrival.rate": rate, "workload.max_concurrency": concurrency, "seed": seed}
    plain = simulate(rag(STAGES, **knobs)).run
    run = simulate(rag(streamed(STAGES), **knobs)).run
    assert_five_layers_sum(run)
    assert all((part >= 0).all() for part in run.application_detail_ns.values())
    for name in ("ttft_ns", "ttfv_ns", "application_before_ns"):
        assert np.array_equal(getattr(run, name), getattr(plain, name)), name
    assert np.array_equal(run.stream_ns(), plain.stream_ns())
    assert np.array_equal(run.tpot_ns(), plain.tpot_ns(), equal_nan=True)
    assert (run.e2e_ns <= plain.e2e_ns).all() and (run.e2e_ns >= run.stream_ns()).all()


def test_the_lever_moves_e2e_by_the_stream_the_stages_after_it_overlap(tmp_path):
    """At a light, even load: per request, E2E less by max(format, review) less max(0, format - stream,
    review - stream), the stages' drawn times against its stream (last token less first at the client)."""
    from tokenpath.sim.simulate import _APPLICATION_STREAM, _rng

    light = {"workload.num_requests": 12, "workload.arrival.rate": 0.2, "workload.arrival.pattern": "constant"}
    scenario = rag(STAGES, **light)
    table = {"application": {"stages": scenario.application.model_dump(mode="json")["stages"]}}
    levers = {lever.name: lever for lever in catalog(scenario, table, tmp_path) if lever.group == APPLICATION_GROUP}
    base = simulate(scenario).run
    run = simulate(rag(levers[LEVER].overrides["application.stages"], **light)).run
    drawn = draw_latencies_ns(scenario.application, 12, _rng(scenario, _APPLICATION_STREAM))
    stream = base.stream_ns() - base.ttft_ns
    after = np.maximum(drawn["format"], drawn["review"])
    overlapped = np.maximum.reduce([np.zeros(12, np.int64), drawn["format"] - stream, drawn["review"] - stream])
    assert np.array_equal(base.e2e_ns - run.e2e_ns, after - overlapped)
    assert (overlapped == 0).any() and (overlapped > 0).any()  # some reviews end with the stream, some outlast it
    assert np.array_equal(run.application_ns - run.application_before_ns, overlapped)
    again = [lever for lever in catalog(rag(streamed(STAGES)), {}, tmp_path) if lever.name == LEVER]
    assert "streams into the stages after it already" in again[0].skipped
    none = [lever for lever in catalog(rag(STAGES[:3]), {}, tmp_path) if lever.name == LEVER]
    assert "no stage runs after the model call" in none[0].skipped


def test_an_agent_streams_its_last_call_into_the_stages_after_it():
    base = load_scenario("agent", {"workload.num_requests": 12, "workload.arrival.rate": 0.5})
    stages = base.application.model_dump(mode="json", exclude_none=True)["stages"]
    stages = [{**stage, "latency": fixed(3000)} if stage["name"] == "format" else stage for stage in stages]
    plain = simulate(load_scenario("agent", {"workload.num_requests": 12, "workload.arrival.rate": 0.5,
                                             "application.stages": stages})).run
    run = simulate(load_scenario("agent", {"workload.num_requests": 12, "workload.arrival.rate": 0.5,
                                           "application.stages": streamed(stages)})).run
    # the last call's stream (last token less first) overlaps the 3 s format stage
    stream = plain.stream_ns() - plain.ttft_ns
    assert np.array_equal(plain.e2e_ns - run.e2e_ns, np.minimum(stream, 3000 * MS))
    assert np.array_equal(run.application_detail_ns["format"], np.maximum(3000 * MS - stream, 0))
    assert_five_layers_sum(run)
    assert np.array_equal(run.ttft_ns, plain.ttft_ns)


def test_a_stage_that_is_not_the_model_cannot_stream_is_one_line(tmp_path):
    stages = [{"name": "answer", "kind": "model"},
              {"name": "format", "kind": "cpu", "after": ["answer"], "latency": fixed(5), "stream_into_next": True}]
    with pytest.raises(UserError, match="stage 'format': only the model stage streams"):
        load_scenario("rag", {"application.stages": stages})
