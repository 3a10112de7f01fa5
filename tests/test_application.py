"""The [application] table: the stages' DAG laid out per request by hand, the engine seeing the model
calls, the five layers summing exactly to E2E, its one-line errors, and its levers."""

import json

import numpy as np
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from report_helpers import assert_five_layers_sum
from tokenpath import load_scenario, simulate
from tokenpath.application.spec import ApplicationSpec
from tokenpath.application.timeline import draw_latencies_ns, timeline
from tokenpath.sim.simulate import prepare
from tokenpath.whatif.catalog import APPLICATION_GROUP, catalog

MS = 10**6


def fixed(ms):
    return {"kind": "fixed", "value": f"{ms} ms"}


# embed -> retrieve --\
#          tools ------> answer -> format, and rerank beside format after the answer
STAGES = [
    {"name": "embed", "kind": "cpu", "latency": fixed(8)},
    {"name": "retrieve", "kind": "retrieval", "after": ["embed"], "latency": fixed(20),
     "cache": {"hit_rate": 0.5, "hit_latency": "1 ms"}},
    {"name": "tools", "kind": "tool", "latency": fixed(100), "start": "ahead", "ahead": "80 ms"},
    {"name": "answer", "kind": "model", "after": ["retrieve", "tools"],
     "prompt": {"template_tokens": 200, "chunks": 5, "chunk_tokens": 128}},
    {"name": "format", "kind": "cpu", "after": ["answer"], "latency": fixed(5)},
    {"name": "log", "kind": "cpu", "after": ["answer", "embed"], "latency": fixed(3)},
]


def test_the_critical_path_by_hand():
    spec = ApplicationSpec.model_validate({"stages": STAGES})
    # request 0: tools (ahead 80 of 100 ms) ends at 20 ms, embed + retrieve (a miss) at 28: the path is theirs
    # request 1: retrieve hits (1 ms): embed + hit end at 9 ms, tools at 20: tools holds all 20 ms
    # request 2: tools takes 500 ms, started 80 ms early: 420 ms, all of it tools'
    # request 3: tools 30 ms, ends 50 ms before the send; retrieve 1 ms: 8 + 1
    latency = {"embed": np.full(4, 8 * MS), "retrieve": np.array([20, 1, 20, 1]) * MS,
               "tools": np.array([100, 100, 500, 30]) * MS, "format": np.full(4, 5 * MS), "log": np.full(4, 3 * MS)}
    laid = timeline(spec, latency, 4)
    assert laid.pre_ns.tolist() == [28 * MS, 20 * MS, 420 * MS, 9 * MS]
    assert laid.detail_ns["embed"].tolist() == [8 * MS, 0, 0, 8 * MS]
    assert laid.detail_ns["retrieve"].tolist() == [20 * MS, 0, 0, 1 * MS]
    assert laid.detail_ns["tools"].tolist() == [0, 20 * MS, 420 * MS, 0]
    # after the answer, format (5 ms) and log (3 ms) run in parallel: the longer one holds the path
    assert laid.post_ns.tolist() == [5 * MS] * 4
    assert laid.detail_ns["format"].tolist() == [5 * MS] * 4 and laid.detail_ns["log"].tolist() == [0] * 4


def test_stages_in_series_after_the_model_add_up():
    stages = [{"name": "answer", "kind": "model"},
              {"name": "check", "kind": "cpu", "after": ["answer"], "latency": fixed(7)},
              {"name": "format", "kind": "cpu", "after": ["check"], "latency": fixed(5)}]
    spec = ApplicationSpec.model_validate({"stages": stages})
    laid = timeline(spec, draw_latencies_ns(spec, 3, np.random.default_rng(0)), 3)
    assert laid.pre_ns.tolist() == [0, 0, 0] and laid.post_ns.tolist() == [12 * MS] * 3
    assert laid.detail_ns["check"].tolist() == [7 * MS] * 3


def test_cache_hits_are_drawn_at_the_hit_rate_and_cost_the_hit_latency():
    spec = ApplicationSpec.model_validate({"stages": STAGES})
    drawn = draw_latencies_ns(spec, 4000, np.random.default_rng(3))["retrieve"]
    assert set(drawn.tolist()) == {1 * MS, 20 * MS}
    assert (drawn == MS).mean() == pytest.approx(0.5, abs=0.03)
    again = draw_latencies_ns(spec, 4000, np.random.default_rng(3))["retrieve"]
    assert np.array_equal(drawn, again)


def _lognormal_stages(retrieve_cache=None):
    """Three drawn stages before the model; retrieve with `retrieve_cache` where given."""
    drawn = {"kind": "lognormal", "mean": "40 ms", "sd": "15 ms"}
    retrieve = {"name": "retrieve", "kind": "retrieval", "after": ["embed"], "latency": drawn}
    if retrieve_cache is not None:
        retrieve["cache"] = retrieve_cache
    return ApplicationSpec.model_validate({"stages": [
        {"name": "embed", "kind": "cpu", "latency": {"kind": "exponential", "mean": "8 ms"}}, retrieve,
        {"name": "tools", "kind": "tool", "latency": drawn},
        {"name": "answer", "kind": "model", "after": ["retrieve", "tools"]}]})


def test_a_cache_at_no_hits_repeats_the_run_without_it_and_moves_no_other_stage():
    # Each stage draws from a stream of its own, its hit/miss numbers always: a 0% cache is a no-op, and a
    # 50% cache in front of retrieve changes retrieve's hits alone
    without = draw_latencies_ns(_lognormal_stages(), 500, np.random.default_rng(5))
    none_hit = draw_latencies_ns(_lognormal_stages({"hit_rate": 0.0, "hit_latency": "1 ms"}), 500,
                                 np.random.default_rng(5))
    half = draw_latencies_ns(_lognormal_stages({"hit_rate": 0.5, "hit_latency": "1 ms"}), 500,
                             np.random.default_rng(5))
    for name in ("embed", "retrieve", "tools"):
        assert none_hit[name].tolist() == without[name].tolist()
    assert half["embed"].tolist() == without["embed"].tolist() and half["tools"].tolist() == without["tools"].tolist()
    hits = half["retrieve"] == MS
    assert 0.4 < hits.mean() < 0.6 and half["retrieve"][~hits].tolist() == without["retrieve"][~hits].tolist()


def test_a_cache_at_no_hits_leaves_every_request_s_times_as_they_were():
    cached = rag()
    stages = [dict(stage) for stage in cached.application.model_dump(exclude_unset=True)["stages"]]
    for stage in stages:
        stage.pop("cache", None)
    without = rag(application={"stages": stages})
    for stage in stages:
        if stage["name"] == "retrieve":
            stage["cache"] = {"hit_rate": 0.0, "hit_latency": "1 ms"}
    no_hits = rag(application={"stages": stages})
    run, again = simulate(without).run, simulate(no_hits).run
    assert again.e2e_ns.tolist() == run.e2e_ns.tolist()
    for name, values in run.application_detail_ns.items():
        assert again.application_detail_ns[name].tolist() == values.tolist()


def rag(**overrides):
    return load_scenario("rag", {"workload.num_requests": 80, **overrides})


def drawn_stages():
    """rag's stages without its reranker on the GPU (what waited for it waits for what it waited for),
    every stage's time drawn before the run."""
    stages = load_scenario("rag").application.model_dump(mode="json", exclude_none=True)["stages"]
    rerank = next(stage for stage in stages if stage["name"] == "rerank")
    def bypass(after):
        return list(dict.fromkeys(a for name in after for a in (rerank["after"] if name == "rerank" else [name])))
    return [{**stage, "after": bypass(stage["after"])} for stage in stages if stage is not rerank]


def drawn_rag(**overrides):
    return rag(**{"application.stages": drawn_stages(), **overrides})


def test_the_engine_sees_each_model_call_when_the_stages_before_it_are_done():
    scenario = drawn_rag()
    plain = prepare(load_scenario("rag", {"workload.num_requests": 80, "application": None}))
    prepared = prepare(scenario)
    laid = prepared.application
    user_send_ns = np.rint(plain.requests.arrival_s * 1e9).astype(np.int64)
    call_ns = np.rint(prepared.requests.arrival_s * 1e9).astype(np.int64)
    # the calls in the order they reach the server; each a user send plus its pre-model time
    assert sorted((call_ns - laid.pre_ns).tolist()) == sorted(user_send_ns.tolist())
    assert (np.diff(call_ns) >= 0).all()
    assert sorted(prepared.requests.input_tokens.tolist()) == sorted((plain.requests.input_tokens + 840).tolist())
    run = simulate(prepared).run
    # the server has a request at its call time: its upload starts there, after the user's send
    assert np.array_equal(run.sent_ns + laid.pre_ns, call_ns)
    assert (run.prefill_start_ns >= call_ns).all()


def test_ttft_counts_from_the_users_send():
    without = simulate(load_scenario("rag", {"workload.num_requests": 80, "workload.arrival.rate": 0.5,
                                             "application.stages": [{"name": "answer", "kind": "model"}]})).run
    slow = [{"name": "think", "kind": "cpu", "latency": fixed(250)},
            {"name": "answer", "kind": "model", "after": ["think"]}]
    run = simulate(load_scenario("rag", {"workload.num_requests": 80, "workload.arrival.rate": 0.5,
                                         "application.stages": slow})).run
    # at half a request a second nothing queues: each request's time is the same plus the 250 ms stage
    assert np.array_equal(run.ttft_ns - 250 * MS, without.ttft_ns)
    assert np.array_equal(run.e2e_ns - 250 * MS, without.e2e_ns)
    assert np.array_equal(run.application_ns, np.full(80, 250 * MS))
    assert np.array_equal(run.sent_ns, without.sent_ns)


@pytest.mark.parametrize("loop", [None, {"turns": 2, "result_tokens": {"kind": "fixed", "value": 50},
                                          "call_output": {"kind": "fixed", "value": 20}}], ids=["one call", "agent"])
def test_the_results_name_each_row_by_its_request_in_the_workload(loop):
    """The model calls reach the server in another order than the users' sends (a stage of random length
    before them): the rows come in the calls' order, and each names the request it is."""
    from tokenpath.report.requests import request_columns

    light = {"workload.num_requests": 24, "workload.arrival.rate": 4.0}
    without = simulate(load_scenario("rag", {**light, "application.stages": [{"name": "answer", "kind": "model"}]}))
    stages = [{"name": "think", "kind": "cpu", "latency": {"kind": "exponential", "mean": "400 ms"}},
              {"name": "answer", "kind": "model", "after": ["think"], **({} if loop is None else {"loop": loop})}]
    run = simulate(load_scenario("rag", {**light, "application.stages": stages})).run
    request = request_columns(run)["request"]
    assert sorted(request.tolist()) == list(range(24))
    assert (np.diff(run.scheduled_ns) < 0).any()  # (rows out of the sends' order)
    assert np.array_equal(run.scheduled_ns, without.run.scheduled_ns[request])


@pytest.mark.parametrize("loop", [None, {"turns": 2, "result_tokens": {"kind": "fixed", "value": 50},
                                          "call_output": {"kind": "fixed", "value": 20}}], ids=["one call", "agent"])
def test_the_warm_up_is_the_users_first_sends_whatever_order_the_calls_reach_the_server(loop):
    """A stage of random length before the model reorders the calls: the warm-up left out of the figures is
    still the users' first sends (docs/design.md), each kept row with its own token times."""
    from tokenpath.sim.summary import summarize

    stages = [{"name": "think", "kind": "cpu", "latency": {"kind": "exponential", "mean": "2 s"}},
              {"name": "answer", "kind": "model", "after": ["think"], **({} if loop is None else {"loop": loop})}]
    scenario = load_scenario("rag", {"workload.num_requests": 24, "workload.arrival.rate": 4.0,
                                     "workload.warmup_requests": 6, "application.stages": stages})
    run = simulate(scenario).run
    assert (run.request_index[:6] >= 6).any()  # (a later send's call among the first rows)
    kept = run.after(6)
    sends = np.sort(run.scheduled_ns)
    assert np.array_equal(np.sort(kept.scheduled_ns), sends[6:])
    assert sorted(kept.request_index.tolist()) == list(range(6, 24))
    for row, i in enumerate(kept.request_index):
        whole = int(np.flatnonzero(run.request_index == i)[0])
        assert np.array_equal(kept.token_client_ns[kept.token_offsets[row]:kept.token_offsets[row + 1]],
                              run.token_client_ns[run.token_offsets[whole]:run.token_offsets[whole + 1]])
    summary = summarize(run, "rag", "", {}, warmup_requests=6)
    assert summary["requests"]["completed"] == 18
    assert summary["latency_s"]["e2e"]["mean"] == pytest.approx(float(run.e2e_ns[run.request_index >= 6].mean()) / 1e9)


def test_stages_after_the_model_lengthen_e2e_but_not_the_streams_tpot():
    light = {"workload.num_requests": 40, "workload.arrival.rate": 0.5}
    without = simulate(load_scenario("rag", {**light, "application.stages": [{"name": "answer", "kind": "model"}]}))
    after = [{"name": "answer", "kind": "model"}, {"name": "format", "kind": "cpu", "after": ["answer"],
                                                   "latency": fixed(400)}]
    run = simulate(load_scenario("rag", {**light, "application.stages": after})).run
    assert np.array_equal(run.e2e_ns - 400 * MS, without.run.e2e_ns)
    assert np.array_equal(run.stream_ns(), without.run.stream_ns())
    assert np.array_equal(run.tpot_ns(), without.run.tpot_ns(), equal_nan=True)
    assert np.array_equal(run.application_before_ns, np.zeros(40, np.int64))


def test_ttfts_parts_hold_the_stages_before_the_call_as_application_not_queue():
    from tokenpath.diagnose.felt import felt_parts_s

    # One request, by hand: the user sends at 0; 30 ms of stages, then a concurrency cap holds the call
    # back 20 ms more, so it goes at 50 ms; its upload takes 1 ms, its prefill starts at 61 ms (10 ms in
    # the engine's queue) and its first token leaves at 91 ms, at the client at 93 ms; the last at 193 ms,
    # and a 7 ms stage after the model ends it at 200 ms.
    ms = lambda *values: np.array(values, np.int64) * MS  # noqa: E731
    e2e = {"queue": ms(30), "compute": ms(120), "traffic": ms(0), "delivery": ms(13), "application": ms(37)}
    parts = felt_parts_s(ms(0), ms(1), ms(61), ms(91), ms(93), ms(93), e2e, np.array([11]), {"compute": 1.0},
                         model_sent_ns=ms(50), application_before_ns=ms(30))
    assert parts["ttft"] == pytest.approx({"queue": 0.030, "compute": 0.030, "traffic": 0.0, "delivery": 0.003,
                                           "application": 0.030})
    # TPOT: the stream's 100 ms over 10 tokens, none of it the stage after the model
    assert parts["tpot"] == pytest.approx({"queue": 0.0, "compute": 0.009, "traffic": 0.0, "delivery": 0.001,
                                           "application": 0.0})


def test_qoe_counts_from_the_users_send():
    from tokenpath.sim import continuity

    light = {"workload.num_requests": 30, "workload.arrival.rate": 0.5}
    alone = simulate(load_scenario("rag", {**light, "application.stages": [{"name": "answer", "kind": "model"}]})).run
    slow = [{"name": "think", "kind": "cpu", "latency": fixed(2000)},
            {"name": "answer", "kind": "model", "after": ["think"]}]
    run = simulate(load_scenario("rag", {**light, "application.stages": slow})).run
    # the reader expects text 1 s after asking: 2 s of stages first put every request behind
    assert (alone.qoe == 1).all() and (run.qoe < 1).all()
    again = continuity.per_request(run.token_client_ns, run.token_offsets, run.sent_ns, run.sent_ns + run.ttfv_ns,
                                   run.continuity)
    assert np.array_equal(run.qoe, again["qoe"])


def test_the_verdict_names_the_stage_that_holds_ttft():
    from tokenpath.sim.document import result_document

    # (slow enough to hold TTFT, short enough that engine compute still holds most of E2E)
    slow = [{"name": "think", "kind": "cpu", "latency": fixed(500)},
            {"name": "answer", "kind": "model", "after": ["think"]}]
    scenario = load_scenario("rag", {"workload.num_requests": 40, "workload.arrival.rate": 0.5,
                                     "application.stages": slow})
    reason = result_document(simulate(scenario))[0]["bottleneck_reason"]
    assert "of E2E is engine compute" in reason.split(";")[0]
    assert "; TTFT: 91% of TTFT is the application's stages before the model call, most of it think (500 ms" in reason


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([2.0, 40.0, "inf"]), concurrency=st.one_of(st.none(), st.integers(1, 8)),
       ahead_ms=st.integers(0, 400), hit_rate=st.floats(0, 1), seed=st.integers(0, 1000))
def test_the_five_layers_sum_exactly_to_e2e(rate, concurrency, ahead_ms, hit_rate, seed):
    stages = [dict(stage) for stage in STAGES]
    stages[1] = {**stages[1], "cache": {"hit_rate": hit_rate, "hit_latency": "1 ms"}}
    stages[2] = {**stages[2], "ahead": f"{ahead_ms} ms"}
    run = simulate(rag(**{"workload.num_requests": 40, "workload.arrival.rate": rate, "seed": seed,
                          "workload.max_concurrency": concurrency, "application.stages": stages})).run
    assert_five_layers_sum(run)
    assert (run.ttft_ns <= run.ttfv_ns).all() and (run.ttfv_ns <= run.e2e_ns).all()


def test_the_summary_and_table_show_the_application(monkeypatch, capsys):
    code, out, err = run_cli(["simulate", "rag", "--num-requests", "60", "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    parts = json.loads(out)["attribution_s"]
    layers = ("queue", "compute", "traffic", "delivery", "application")
    assert sum(parts[layer] for layer in layers) == pytest.approx(json.loads(out)["latency_s"]["e2e"]["mean"])
    assert set(parts["application_detail"]) == {"embed", "retrieve", "rerank", "history", "tools", "format"}
    assert sum(parts["application_detail"].values()) == pytest.approx(parts["application"])
    code, out, err = run_cli(["simulate", "rag", "--num-requests", "60"], monkeypatch, capsys)
    assert "│ application " in out and "│   retrieve " in out


def test_without_an_application_the_summary_has_no_application_layer():
    summary = simulate(load_scenario("typical", {"workload.num_requests": 40})).summary
    assert "application" not in summary["attribution_s"] and "application_detail" not in summary["attribution_s"]
    assert "application" not in load_scenario("typical").to_toml()


@pytest.mark.parametrize("stages, fragments", [
    ([{"name": "a", "kind": "cpu", "after": ["b"], "latency": fixed(1)},
      {"name": "b", "kind": "cpu", "after": ["a"], "latency": fixed(1)},
      {"name": "m", "kind": "model", "after": ["a"]}], ["cycle", "a -> b -> a"]),
    ([{"name": "m", "kind": "model", "after": ["nope"]}], ["'nope', which is no stage"]),
    ([{"name": "m", "kind": "model"}, {"name": "n", "kind": "model"}], ["2 model stages", "its loop table"]),
    ([{"name": "m", "kind": "model", "colour": 1}], ["colour"]),
    ([{"name": "x", "kind": "cpu", "latency": fixed(1)}, {"name": "m", "kind": "model"}],
     ["'x' is neither before the model call nor after it"]),
    ([{"name": "x", "kind": "cpu"}, {"name": "m", "kind": "model", "after": ["x"]}], ["needs a latency"]),
    ([{"name": "x", "kind": "cpu", "latency": fixed(1)}, {"name": "m", "kind": "model", "needs": ["x"]}],
     ["'m' needs 'x' but does not run after it", "add it to after"]),
])
def test_a_bad_application_is_one_line_exit_2(stages, fragments, tmp_path, monkeypatch, capsys):
    path = tmp_path / "app.toml"
    path.write_text(tomli_w.dumps({"application": {"stages": stages}}), encoding="utf-8")
    assert_user_error(*run_cli(["simulate", str(path), "--num-requests", "5"], monkeypatch, capsys),
                      "application", *fragments)


def test_the_levers_move_the_critical_path(tmp_path):
    scenario = drawn_rag()
    table = {"application": {"stages": drawn_stages()}}
    levers = {lever.name: lever for lever in catalog(scenario, table, tmp_path) if lever.group == APPLICATION_GROUP}
    assert "has a cache already" in levers["cache retrieval and reranking (50% hits)"].skipped
    ahead = levers["start retrieval ahead (embed, retrieve: 300 ms)"]
    stages = {stage["name"]: stage for stage in ahead.overrides["application.stages"]}
    assert stages["embed"]["start"] == stages["retrieve"]["start"] == "ahead"
    moved = prepare(rag(**ahead.overrides)).application
    before = prepare(drawn_rag()).application
    # with 300 ms ahead, embed + retrieve (tens of ms) end before the send: the tools stage or the history
    # read (started at the send) holds it
    assert (moved.detail_ns["embed"] == 0).all() and (moved.detail_ns["retrieve"] == 0).all()
    assert np.array_equal(moved.detail_ns["tools"] + moved.detail_ns["history"], moved.pre_ns)
    assert moved.pre_ns.mean() < before.pre_ns.mean() * 0.6
    parallel = levers["run independent stages in parallel (history)"]
    assert {s["name"]: s["after"] for s in parallel.overrides["application.stages"]}["history"] == []
    uncached = [{k: v for k, v in stage.items() if k != "cache"} for stage in drawn_stages()]
    bare = rag(**{"application.stages": uncached})
    cache = next(lever for lever in catalog(bare, {"application": {"stages": uncached}}, tmp_path)
                 if lever.name == "cache retrieve (50% hits)")
    retrieve = next(s for s in cache.overrides["application.stages"] if s["name"] == "retrieve")
    assert retrieve["cache"] == {"hit_rate": 0.5, "hit_latency": "1 ms"}
    assert not [lever for lever in catalog(load_scenario("typical"), {}, tmp_path) if lever.group == APPLICATION_GROUP]


@pytest.mark.parametrize("make", [drawn_rag, rag], ids=["without its reranker", "shipped"])
def test_serial_parallel_and_ahead_stages_move_ttfv_by_the_hand_computed_stage_times(make, tmp_path):
    """`rag` at a light, even load (one request in the engine at a time): each lever's TTFV against the
    scenario's, per request, is the difference of the time before the model call computed by hand from
    the stages' drawn times. The shipped `rag` reranks on the model's GPU: each job runs on an idle GPU
    for its kernel time k (0 without the reranker)."""
    from tokenpath.sim.simulate import _APPLICATION_STREAM, _rng

    light = {"workload.num_requests": 12, "workload.arrival.rate": 0.2, "workload.arrival.pattern": "constant"}
    scenario = make(**light)
    table = {"application": {"stages": scenario.application.model_dump(mode="json")["stages"]}}
    levers = {lever.name.split(" (")[0]: lever for lever in catalog(scenario, table, tmp_path)
              if lever.group == APPLICATION_GROUP and not lever.skipped}
    drawn = draw_latencies_ns(scenario.application, 12, _rng(scenario, _APPLICATION_STREAM))
    e, r, h, t = (drawn[name] for name in ("embed", "retrieve", "history", "tools"))
    prepared = prepare(scenario)
    serial = simulate(prepared).run
    zero = np.zeros(12, np.int64)
    k = zero if prepared.shared is None else prepared.shared.done_ns - prepared.shared.ready_ns
    head = 300 * MS  # the tools stage starts 300 ms before the send, and the ahead lever moves embed there too
    pre = {  # rerank and history after the retrieval; the model call when the last ends, not before the send
        "serial": np.maximum.reduce([zero, e + r + np.maximum(k, h), t - head]),
        "run independent stages in parallel": np.maximum.reduce([zero, e + r + k, h, t - head]),
        "start retrieval ahead": np.maximum.reduce([zero, np.maximum(zero, e + r - head) + np.maximum(k, h),
                                                    t - head]),
    }
    assert np.array_equal(serial.application_before_ns, pre["serial"])
    for name in ("run independent stages in parallel", "start retrieval ahead"):
        run = simulate(make(**light, **levers[name].overrides)).run
        assert np.array_equal(run.ttfv_ns - serial.ttfv_ns, pre[name] - pre["serial"]), name
        assert (pre[name] <= pre["serial"]).all(), name
    assert (pre["start retrieval ahead"] < pre["serial"]).any()
