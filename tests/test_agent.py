"""Agent loops: a model stage's calls as one user request, tool stages between them. The layers of two
calls and a tool by hand, prompts growing by each answer and tool result with the prefix cache finding
the turn before, the five layers summing exactly, the "fewer agent turns" lever, and one-line errors."""

import numpy as np
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from report_helpers import assert_five_layers_sum
from tokenpath import load_scenario, simulate
from tokenpath.application.timeline import Timeline
from tokenpath.config.errors import UserError
from tokenpath.sim.agent import AgentPlan, with_agent
from tokenpath.sim.run import Run
from tokenpath.sim.simulate import prepare
from tokenpath.whatif.catalog import APPLICATION_GROUP, catalog

MS = 10**6
BLOCK = 16  # engine.block_size's default


def fixed_ms(ms):
    return {"kind": "fixed", "value": f"{ms} ms"}


def tokens(value):
    return {"kind": "fixed", "value": value}


def agent_stages(turns=3, tool_ms=300, between=("tool",)):
    return [
        {"name": "agent", "kind": "model", "loop": {"turns": turns, "between": list(between),
                                                     "result_tokens": tokens(50), "call_output": tokens(20)}},
        {"name": "tool", "kind": "tool", "latency": fixed_ms(tool_ms)},
        {"name": "format", "kind": "cpu", "after": ["agent"], "latency": fixed_ms(5)},
    ]


def agent(**overrides):
    """The agent scenario, small and with fixed lengths: prompts 100 tokens, answers 30, no shared prefix."""
    return load_scenario("agent", {
        "workload.num_requests": 12, "workload.arrival.rate": 0.5, "workload.shared_prefix": None,
        "workload.input": tokens(100), "workload.output": tokens(30), "application.stages": agent_stages(),
        **overrides})


def test_two_calls_and_a_tool_by_hand():
    # The user sends at 1000 ms; a 10 ms stage runs before the first call, a 300 ms tool between the two
    # calls, a 5 ms stage after the second. Call 1 takes 400 ms (queue 20, compute 300, traffic 60,
    # delivery 20), call 2 500 ms (10, 380, 80, 30), its tokens 150, 250, 350 and 500 ms after its send,
    # its first visible character 160 ms after it.
    call_2_sent = 1010 + 400 + 300
    calls = Run(
        source="simulate", scheduled_ns=np.array([1010, 1010]) * MS, sent_ns=np.array([1010, call_2_sent]) * MS,
        input_tokens=np.array([100, 170]), output_tokens=np.array([2, 4]), ttft_ns=np.array([100, 150]) * MS,
        ttfv_ns=np.array([100, 160]) * MS, e2e_ns=np.array([400, 500]) * MS,
        token_client_ns=np.array([1110, 1410, call_2_sent + 150, call_2_sent + 250, call_2_sent + 350,
                                  call_2_sent + 500]) * MS,
        token_offsets=np.array([0, 2, 6]), queue_ns=np.array([20, 10]) * MS, compute_ns=np.array([300, 380]) * MS,
        traffic_ns=np.array([60, 80]) * MS, delivery_ns=np.array([20, 30]) * MS,
        prefix_hit_tokens=np.array([0, 96]), replica=np.array([0, 0]))
    outer = Timeline(np.array([10 * MS]), np.array([5 * MS]),
                     {"prep": np.array([10 * MS]), "format": np.array([5 * MS])})
    plan = AgentPlan(outer, np.array([2]), np.array([0, 300 * MS]), {"tool": np.array([0, 300 * MS])})
    run = with_agent(calls, plan)
    assert run.sent_ns.tolist() == [1000 * MS]
    assert run.e2e_ns.tolist() == [(10 + 400 + 300 + 500 + 5) * MS]
    # the user reads the second call's answer: its first token 10 + 400 + 300 + 150 ms after the send
    assert run.ttft_ns.tolist() == [860 * MS] and run.ttfv_ns.tolist() == [870 * MS]
    assert [run.queue_ns[0], run.compute_ns[0], run.traffic_ns[0], run.delivery_ns[0]] == [
        30 * MS, 680 * MS, 140 * MS, 50 * MS]
    assert run.application_ns.tolist() == [315 * MS] and run.application_before_ns.tolist() == [310 * MS]
    assert {stage: values.tolist() for stage, values in run.application_detail_ns.items()} == {
        "prep": [10 * MS], "format": [5 * MS], "tool": [300 * MS]}
    # only the second call's tokens are the user's: TPOT (500 - 150) / 3 ms, ITL 100, 100, 150 ms
    assert run.output_tokens.tolist() == [4] and run.token_offsets.tolist() == [0, 4]
    assert run.tpot_ns().tolist() == pytest.approx([350 / 3 * MS])
    assert run.itl_ns().tolist() == [100 * MS, 100 * MS, 150 * MS]
    assert run.model_sent_ns.tolist() == [call_2_sent * MS]
    assert {part: values.tolist() for part, values in run.earlier_calls_ns.items()} == {
        "queue": [20 * MS], "compute": [300 * MS], "traffic": [60 * MS], "delivery": [20 * MS]}
    assert run.input_tokens.tolist() == [270] and run.prefix_hit_tokens.tolist() == [96]
    assert run.model_calls.tolist() == [2] and run.model_call_output_tokens.tolist() == [6]


def test_prompts_grow_by_each_answer_and_result_and_the_cache_finds_the_call_before():
    prepared = prepare(agent())
    calls = prepared.requests
    assert calls.sessions.turn.tolist()[:6] == [0, 1, 2, 0, 1, 2]
    # 100, then + 20 (the tool call) + 50 (the tool's result), twice; the last answer is the workload's 30
    assert calls.input_tokens.tolist()[:3] == [100, 170, 240]
    assert calls.output_tokens.tolist()[:3] == [20, 20, 30]
    assert calls.sessions.think_s.tolist()[:3] == [0.0, 0.3, 0.3]
    run = simulate(prepared).run
    # call 2 finds call 1's prompt and answer less its last token, 119 tokens, in whole blocks (64 tokens,
    # the newest vLLM's): 64; call 3 finds 189: 128. The user's input is every call's prompt.
    assert run.prefix_hit_tokens.tolist() == [64 + 128] * 12
    assert run.input_tokens.tolist() == [100 + 170 + 240] * 12
    assert (run.model_calls == 3).all() and (run.model_call_output_tokens == 20 + 20 + 30).all()
    # each later call was sent 300 ms (the tool) after the call before reached the client
    waited_ns = run.model_sent_ns - run.sent_ns - sum(run.earlier_calls_ns.values())
    assert (waited_ns == 2 * 300 * MS).all() and (run.application_before_ns == 2 * 300 * MS).all()
    assert (run.e2e_ns - run.stream_ns() == 5 * MS).all()


def test_session_affinity_keeps_a_requests_calls_on_its_replica():
    overrides = {"model.name": "llama-3.1-8b", "deployment.chips": 2, "deployment.tp": 1}
    affine = simulate(agent(**overrides, **{"deployment.routing": "session_affinity"})).run
    assert affine.prefix_hit_tokens.tolist() == [64 + 128] * 12
    spread = simulate(agent(**overrides, **{"deployment.routing": "round_robin"})).run
    assert spread.prefix_hit_tokens.sum() < affine.prefix_hit_tokens.sum()
    waited_ns = spread.model_sent_ns - spread.sent_ns - sum(spread.earlier_calls_ns.values())
    assert (waited_ns == 2 * 300 * MS).all()  # wherever a call ran, the next waited for it


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([1.0, 30.0, "inf"]), turns=st.one_of(
           st.integers(1, 4), st.builds(lambda mean: {"kind": "uniform", "mean": mean, "range_ratio": 0.5},
                                         st.sampled_from([2.0, 3.0]))),
       tool_ms=st.integers(0, 400), seed=st.integers(0, 1000))
def test_the_five_layers_sum_exactly_to_e2e(rate, turns, tool_ms, seed):
    stages = agent_stages(turns, tool_ms)
    stages[0]["loop"]["result_tokens"] = {"kind": "lognormal", "mean": 80, "sd": 40}
    run = simulate(load_scenario("agent", {"workload.num_requests": 10, "workload.arrival.rate": rate,
                                           "seed": seed, "application.stages": stages})).run
    assert_five_layers_sum(run)
    assert (run.ttft_ns <= run.ttfv_ns).all() and (run.ttfv_ns <= run.stream_ns()).all()
    assert len(run.token_client_ns) == run.output_tokens.sum()


def test_a_large_runs_itl_histogram_leaves_out_every_call_of_the_warm_up(monkeypatch):
    """Past the limit of kept token times, the ITL histogram holds every call's gaps (docs/application.md)
    but those of the warm-up requests' calls, as the calls' own token times give them."""
    from tokenpath.sim import simulate as pipeline
    from tokenpath.sim.run import itl_gaps_ns
    from tokenpath.sim.summary import LogHistogram

    prepared = prepare(load_scenario("agent", {"workload.num_requests": 40, "workload.warmup_requests": 10}))
    calls = pipeline._simulate(prepared, None, 1).run  # a row and the tokens of every call
    first_measured = int(prepared.application.first[10])
    expected = LogHistogram()
    expected.add(itl_gaps_ns(calls.token_client_ns, calls.token_offsets, np.arange(len(calls)) < first_measured))
    monkeypatch.setattr(pipeline, "KEEP_TOKENS_LIMIT", 0)
    histogram = simulate(prepared).run.itl_histogram
    assert first_measured > 10 and expected.counts.sum() > 0
    assert np.array_equal(histogram.counts, expected.counts) and histogram.total_ns == expected.total_ns


def test_fewer_agent_turns_is_a_value_parallel_lever(tmp_path):
    scenario = load_scenario("agent", {"workload.num_requests": 12})
    table = {"application": {"stages": scenario.application.model_dump(mode="json")["stages"]}}
    levers = {lever.name: lever for lever in catalog(scenario, table, tmp_path)}
    lever = levers["fewer agent turns (4 -> 3 calls)"]
    assert lever.group == APPLICATION_GROUP
    fewer = load_scenario("agent", {"workload.num_requests": 12, **lever.overrides})
    assert fewer.application.model.loop.turns == 3
    assert fewer.application.model.loop.between == ["parse", "tool"]
    # a distribution of turns: its mean one lower, the rest of its shape kept
    stages = agent_stages({"kind": "normal", "mean": 3.5, "sd": 1.0, "min": 3})
    lever = next(lever for lever in catalog(agent(**{"application.stages": stages}), {}, tmp_path)
                 if lever.name.startswith("fewer agent turns"))
    turns = lever.overrides["application.stages"][0]["loop"]["turns"]
    assert (turns["mean"], turns["sd"], turns["min"]) == (2.5, 1.0, 2)
    assert lever.name.endswith("(mean 3.5 -> 2.5 calls)")
    assert "one model call already" in next(lever for lever in catalog(agent(**{"application.stages": agent_stages(1)}),
                                                                       {}, tmp_path)
                                            if lever.name == "fewer agent turns").skipped
    assert "no loop" in next(lever for lever in catalog(load_scenario("rag"), {}, tmp_path)
                             if lever.name == "fewer agent turns").skipped


def test_the_agent_scenario_shows_as_toml_that_loads_back(tmp_path):
    scenario = load_scenario("agent")
    path = tmp_path / "shown.toml"
    path.write_text(scenario.to_toml(), encoding="utf-8")
    assert load_scenario(str(path)).application == scenario.application


def _loop(**changes):
    loop = {"turns": 2, "between": ["tool"], "result_tokens": tokens(50), "call_output": tokens(20)}
    return {**loop, **changes}


@pytest.mark.parametrize("stages, fragments", [
    ([{"name": "m", "kind": "model", "loop": _loop(between=["nope"])}], ["'nope', which is no stage"]),
    ([{"name": "m", "kind": "model", "loop": _loop(between=["m"])}], ["names the model call itself"]),
    ([{"name": "m", "kind": "model", "loop": _loop(between=["tool", "tool"])},
      {"name": "tool", "kind": "tool", "latency": fixed_ms(1)}], ["'tool' twice"]),
    ([{"name": "m", "kind": "model", "loop": _loop()}, {"name": "tool", "kind": "tool", "latency": fixed_ms(1)},
      {"name": "x", "kind": "cpu", "after": ["tool"], "latency": fixed_ms(1)}],
     ["stage 'x' waits for 'tool', which runs between the model calls"]),
    ([{"name": "pre", "kind": "cpu", "latency": fixed_ms(1)}, {"name": "m", "kind": "model", "after": ["pre"],
      "loop": _loop()}, {"name": "tool", "kind": "tool", "after": ["pre"], "latency": fixed_ms(1)}],
     ["'tool' runs between the model calls and cannot wait for 'pre'"]),
    ([{"name": "m", "kind": "model", "loop": _loop()},
      {"name": "tool", "kind": "tool", "latency": fixed_ms(1), "start": "ahead", "ahead": "1 ms"}],
     ["cannot start ahead"]),
    ([{"name": "m", "kind": "model"}, {"name": "x", "kind": "cpu", "after": ["m"], "latency": fixed_ms(1),
                                       "loop": _loop(between=[])}], ["only the model stage takes a loop"]),
    ([{"name": "m", "kind": "model", "loop": _loop(between=[], turns=0)}], ["turns 0 must be from 1 to 1000"]),
    ([{"name": "m", "kind": "model", "loop": _loop(between=[], calls=3)}], ["unknown key", "calls"]),
    ([{"name": "m", "kind": "model", "loop": _loop(between=[], call_output={"kind": "empirical", "path": "x.txt"})}],
     ["loop.call_output cannot read a lengths file"]),
    ([{"name": "m", "kind": "model", "loop": {"turns": 2}}], ["result_tokens"]),
    # a table of turns is no count: what is wrong with it as a distribution, not "should be a valid integer"
    ([{"name": "m", "kind": "model", "loop": _loop(between=[], turns={"kind": "normal", "mean": 2})}],
     ["loop.turns: kind 'normal' needs mean and sd; missing sd"]),
])
def test_a_bad_loop_table_is_one_line_exit_2(stages, fragments, tmp_path, monkeypatch, capsys):
    path = tmp_path / "agent.toml"
    path.write_text(tomli_w.dumps({"application": {"stages": stages}}), encoding="utf-8")
    assert_user_error(*run_cli(["simulate", str(path), "--num-requests", "5"], monkeypatch, capsys),
                      "application", *fragments)


@pytest.mark.parametrize("overrides, fragment", [
    ({"workload.max_concurrency": 4}, "does not combine with workload.max_concurrency"),
    ({"deployment.chips": 2, "deployment.tp": 1, "model.name": "llama-3.1-8b", "deployment.prefill_replicas": 1},
     "disaggregated serving is modelled without one"),
    ({"workload.shared_prefix": None, "workload.sessions": {"turns": 2}}, "multi-turn sessions"),
    ({"application.stages": [{"name": "agent", "kind": "model", "loop": _loop(turns=500, between=[],
                                                                             result_tokens=tokens(300))}]},
     "carries every call before it"),
])
def test_what_a_loop_does_not_combine_with_is_one_line(overrides, fragment):
    with pytest.raises(UserError) as caught:
        prepare(load_scenario("agent", {"workload.num_requests": 4, **overrides}))
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=40, deadline=None)
@given(turns=st.one_of(st.integers(-2, 1200), st.text(max_size=3)),
       between=st.lists(st.sampled_from(["tool", "agent", "format", "nope"]), max_size=3),
       extra=st.dictionaries(st.sampled_from(["result_tokens", "call_output", "colour"]),
                             st.sampled_from([tokens(5), tokens(0), {"kind": "uniform", "mean": 9}, 3]), max_size=2))
def test_any_loop_table_parses_or_is_one_line(turns, between, extra):
    stages = agent_stages()
    stages[0]["loop"] = {**_loop(turns=turns, between=between), **extra}
    try:
        scenario = load_scenario("agent", {"application.stages": stages})
    except UserError as error:
        assert "\n" not in str(error) and "application" in str(error)
    else:
        loop = scenario.application.model.loop
        assert 1 <= loop.turns <= 1000 and set(loop.between) <= {"tool"}


def test_the_verdict_names_the_tool_between_the_calls_when_it_holds_ttft():
    from tokenpath.sim.document import result_document

    # three calls with 2 s tools between them and a long last answer: E2E is mostly its decode, TTFT mostly
    # the two tool rounds between the calls (before the model call whose answer the user reads)
    scenario = agent(**{"application.stages": agent_stages(tool_ms=2000), "workload.output": tokens(1500)})
    document, reason = result_document(simulate(scenario))
    assert reason.startswith(f"{document['attribution_s']['compute'] / document['latency_s']['e2e']['mean']:.0%} "
                             "of E2E is engine compute")
    assert "TTFT: " in reason and "of TTFT is the application's stages before the model call, most of it tool (4 s" \
        in reason
