"""Stages served by a model (docs/application.md, "Stages served by a model"): the roofline of one request
on a CPU core and on a chip by hand, the queues in front of them, a job on the model's GPU lengthening
the step it runs in, the layers still summing exactly, and the one-line errors of a bad table."""

import numpy as np
import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticCustomError

from cli_helpers import assert_user_error, run_cli
from report_helpers import assert_five_layers_sum
from test_engine import NO_NETWORK, FixedCosts
from tokenpath import load_scenario, simulate
from tokenpath.application.queues import batches_end_ns, servers_end_ns
from tokenpath.application.served import _parse_params, shown_params
from tokenpath.application.service import request_tokens
from tokenpath.application.spec import ApplicationSpec
from tokenpath.compute.chip import ChipSpec, load_chip
from tokenpath.compute.served import ChipForward, cpu_forward_s
from tokenpath.config.assumptions import Assumptions
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.loop import run_engine
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.application import model_calls
from tokenpath.sim.simulate import prepare
from tokenpath.whatif.catalog import APPLICATION_GROUP, HOST_CPU_CORES, catalog
from tokenpath.workload import Requests

MS = 10**6
# Round figures: a core runs 100 GFLOP/s and streams 20 GB/s.
ROUND = Assumptions({"cpu_core_encoder_flops": 1e11, "cpu_core_bw_Bps": 2e10})


def test_a_request_on_one_cpu_core_by_hand():
    # 100M parameters over 50 tokens: 2 x 1e8 x 50 = 1e10 FLOPs, 100 ms at 1e11/s; weights 2e8 bytes, 10 ms
    assert cpu_forward_s(1e8, "bf16", np.array([50]), ROUND).tolist() == pytest.approx([0.1])
    # one token: 2 ms of FLOPs, still 10 ms of weights: memory-bound
    assert cpu_forward_s(1e8, "bf16", np.array([1]), ROUND).tolist() == pytest.approx([0.01])
    assert cpu_forward_s(1e8, "fp8", np.array([1]), ROUND).tolist() == pytest.approx([0.005])


def test_a_batch_on_a_chip_by_hand():
    chip = ChipSpec(name="round", peak_flops={"bf16": 1e15}, hbm_bytes=2**37, hbm_bw_Bps=1e12, scaleup_bw_Bps=1e11,
                    matmul_efficiency={"bf16": 0.5}, hbm_bw_efficiency=0.5, gemm_fixed_s=0.0, kernel_fixed_s=0.0,
                    source="test")
    forward = ChipForward(1e9, "bf16", chip)
    # 1,000 tokens: 2e12 FLOPs at 5e14/s = 4 ms; 2e9 bytes of weights at 5e11 B/s = 4 ms; a GEMM's time is
    # their 2-norm (gemm_overlap_norm): 4 x sqrt(2) ms
    assert forward.time_s(1000) == pytest.approx(0.004 * 2**0.5)
    # 100,000 tokens: 400 ms of FLOPs against 4 ms of weights: sqrt(400^2 + 4^2) ms
    assert forward.time_s(100_000) == pytest.approx((0.4**2 + 0.004**2) ** 0.5)


def test_with_two_cores_the_third_of_three_simultaneous_requests_waits_one_service_time():
    assert servers_end_ns(np.zeros(3, np.int64), np.full(3, 100 * MS), 2).tolist() == [100 * MS, 100 * MS, 200 * MS]
    # later arrivals take a free core at once; ties go in row order
    ends = servers_end_ns(np.array([0, 150, 0, 90]) * MS, np.array([100, 10, 100, 20]) * MS, 2)
    assert ends.tolist() == [100 * MS, 160 * MS, 100 * MS, 120 * MS]


def test_a_chip_batches_the_requests_waiting_when_it_frees():
    ten_each = lambda rows: 10 * MS * len(rows)  # noqa: E731
    # two at once, then the other two (the fourth arrived while the first batch ran)
    ends = batches_end_ns(np.array([0, 0, 0, 5]) * MS, 2, ten_each)
    assert ends.tolist() == [20 * MS, 20 * MS, 40 * MS, 40 * MS]
    # an idle chip starts a batch when a request comes
    assert batches_end_ns(np.array([0, 100]) * MS, 8, ten_each).tolist() == [10 * MS, 110 * MS]


def rerank_on(on, **served):
    table = {k: v for k, v in {"params": "100M", "on": on, "documents": 2, "document_tokens": 20, "query_tokens": 5,
                               **served}.items() if v is not None}
    return ApplicationSpec.model_validate({"stages": [
        {"name": "rerank", "kind": "rerank", "served": table},
        {"name": "answer", "kind": "model", "after": ["rerank"]}]})


def test_the_tokens_of_a_request():
    question = np.array([30, 50])
    embed = ApplicationSpec.model_validate({"stages": [
        {"name": "embed", "kind": "embed", "served": {"params": "335M", "on": "cpu", "cores": 1}},
        {"name": "answer", "kind": "model", "after": ["embed"]}]}).stages[0]
    assert request_tokens(embed, question).tolist() == [30, 50]  # the question
    # a reranker scores each document with the query: 2 x (20 + 5); unset, the query is the question
    assert request_tokens(rerank_on("cpu", cores=1).stages[0], question).tolist() == [50, 50]
    unset = rerank_on("cpu", cores=1, query_tokens=None).stages[0]
    assert request_tokens(unset, question).tolist() == [2 * (20 + 30), 2 * (20 + 50)]


def test_the_queue_s_wait_counts_to_the_stage_on_the_critical_path():
    # 2 documents x (20 + 5) tokens = 50 tokens a request: 100 ms on a core (above); three sent at once
    # on two cores: the third waits one service time
    requests = Requests(np.zeros(3), np.full(3, 300, np.int64), np.full(3, 10, np.int64))
    calls, laid = model_calls(rerank_on("cpu", cores=2), requests, np.random.default_rng(0), ROUND)
    assert laid.pre_ns.tolist() == [100 * MS, 100 * MS, 200 * MS]
    assert laid.detail_ns["rerank"].tolist() == [100 * MS, 100 * MS, 200 * MS]
    assert (calls.arrival_s * 1e9).round().tolist() == [100 * MS, 100 * MS, 200 * MS]


@pytest.mark.parametrize("on", ["cpu", "h200"])
def test_a_queue_past_int64_nanoseconds_is_one_line(on):
    from tokenpath.application.service import queued
    from tokenpath.config.errors import UserError

    # 1T parameters on a core: 2 x 1e12 x 2e9 tokens at 1e11 FLOP/s is 4e10 s a request; on a chip, a
    # 2^40-token batch with 10,000 requests behind it
    stage = rerank_on(on, params="1T" if on == "cpu" else "60B", cores=1 if on == "cpu" else None).stages[0]
    n = 3 if on == "cpu" else 10_000
    tokens = np.full(n, 2 * 10**9 if on == "cpu" else 2**40, np.int64)
    with pytest.raises(UserError, match="application stage 'rerank': its requests would take more than 146 years") \
            as error:
        queued(stage, np.zeros(n, np.int64), tokens, ROUND)(np.zeros(n, np.int64))
    assert "\n" not in str(error.value)


class Jobs:
    """One job per request, `kernel_ms` each; a request is sent the moment its job is done."""

    def __init__(self, ready_ms, kernel_ms):
        self.ready_ns, self.kernel = np.array(ready_ms, np.int64) * MS, kernel_ms * MS

    def kernel_ns(self, rows):
        return self.kernel * len(rows)

    def release_ns(self, row, done_ns):
        return done_ns


def test_a_step_with_a_job_pending_is_longer_by_its_kernel_time_and_the_job_ends_with_it():
    # steps of 1 ms; jobs of 7 ms. Job 0 is ready at 0 on an idle GPU: it runs alone, 0-7 ms, and request
    # 0 goes at 7 ms. Job 1 is ready at 7.5 ms, during request 0's prefill (7-8 ms): it runs in the next
    # step, 8-16 ms, which is 7 ms longer, and request 1 goes when it ends.
    jobs = Jobs([0, 7.5], 7)
    jobs.ready_ns = np.array([0, 7_500_000], np.int64)
    trace = run_engine(np.zeros(2, np.int64), np.array([100, 100]), np.array([3, 2]), FixedCosts(),
                       LastMile(NO_NETWORK), EngineSpec(), 10**9, side=jobs)
    assert trace.step_start_ns[:4].tolist() == [7 * MS, 8 * MS, 16 * MS, 17 * MS]
    assert trace.step_compute_ns[:4].tolist() == [MS, 8 * MS, MS, MS]
    assert trace.sent_ns.tolist() == [7 * MS, 16 * MS]
    # the job's kernels count as compute to the request in the step: request 0's three steps
    assert trace.compute_ns[0] == 10 * MS


@pytest.mark.parametrize("replicas", [
    {},  # one replica
    {"deployment.chips": 16},  # two, round-robin in the order of the users' sends
    {"deployment.chips": 16, "deployment.routing": "least_outstanding"},  # two, routed when each job is ready
])
def test_with_the_reranker_on_the_gpu_the_layers_sum_exactly_and_the_sends_are_the_users(replicas):
    scenario = load_scenario("rag", {"workload.num_requests": 60, "workload.arrival.rate": 30.0, **replicas})
    prepared = prepare(scenario)
    run = simulate(prepared).run
    assert_five_layers_sum(run)
    assert np.array_equal(run.scheduled_ns, np.rint(prepared.requests.arrival_s * 1e9).astype(np.int64))
    jobs = prepared.shared
    # each job ends no earlier than it was ready plus its own kernels: its time on the critical path is that
    single = np.array([jobs.kernel_ns([row]) for row in range(60)])
    assert (jobs.done_ns - jobs.ready_ns >= single).all() and (run.application_detail_ns["rerank"] > 0).any()


def test_on_an_idle_gpu_the_reranker_takes_its_kernel_time_and_the_call_goes_after_the_last_stage():
    """The shipped `rag` at a light, even load (one request in the engine at a time): each reranker job
    finds the GPU idle and runs at once, so the model call goes at the hand-computed time."""
    from tokenpath.application.timeline import draw_latencies_ns
    from tokenpath.sim.simulate import _APPLICATION_STREAM, _rng

    scenario = load_scenario("rag", {"workload.num_requests": 12, "workload.arrival.rate": 0.2,
                                     "workload.arrival.pattern": "constant"})
    prepared = prepare(scenario)
    drawn = draw_latencies_ns(scenario.application, 12, _rng(scenario, _APPLICATION_STREAM))
    e, r, h, t = (drawn[name] for name in ("embed", "retrieve", "history", "tools"))
    k = np.array([prepared.shared.kernel_ns([row]) for row in range(12)])  # one job alone
    # the H200's roofline over 20 pairs of the question (the prompt less the 840 tokens the answer adds) and a
    # 128-token chunk, at 560M parameters
    h200 = ChipForward(560e6, "bf16", load_chip("h200"))
    question = prepared.requests.input_tokens - 840
    assert k.tolist() == [round(h200.time_s(20 * (128 + q)) * 1e9) for q in question.tolist()]
    run = simulate(prepared).run
    # rerank and history both start when retrieve ends; the tools stage started 300 ms before the send
    pre = np.maximum.reduce([np.zeros(12, np.int64), e + r + np.maximum(k, h), t - 300 * MS])
    assert np.array_equal(run.application_before_ns, pre)
    assert np.array_equal(run.model_sent_ns, run.sent_ns + pre)
    assert np.array_equal(prepared.shared.done_ns - prepared.shared.ready_ns, k)


@pytest.mark.parametrize("served, fragments", [
    ({"on": "h1000"}, ["on: unknown chip 'h1000'", "did you mean 'h100'"]),
    ({"on": "cpu", "cores": 0}, ["cores", "greater than or equal to 1"]),
    ({"on": "cpu"}, ["needs cores"]),
    ({"on": "h200", "latency": {"kind": "fixed", "value": "5 ms"}}, ["has a latency and a served model"]),
    ({"on": "h200", "max_batch": 65536, "documents": 10000, "document_tokens": 2147483647},
     ["documents x document_tokens is 21,474,836,470,000 tokens a request", "lower documents"]),
    ({"on": "h200", "documents": 100, "document_tokens": 20_000_000, "query_tokens": 2_000_000},
     ["documents x (document_tokens + query_tokens)"]),
    ({"params": None, "model": "llama-3.1-405b", "on": "a100-40gb"},
     ["on: the model's weights (756.0 GiB at bf16) do not fit in one a100-40gb's 40 GiB"]),
    ({"params": "100B", "precision": "fp8", "on": "h100"}, ["(93.1 GiB at fp8) do not fit in one h100's 80 GiB"]),
])
def test_a_bad_served_stage_is_one_line_exit_2(served, fragments, tmp_path, monkeypatch, capsys):
    latency = served.pop("latency", None)
    table = {"params": "560M", "documents": 20, "document_tokens": 128, **served}
    stage = {"name": "rerank", "kind": "rerank", "served": {k: v for k, v in table.items() if v is not None}}
    stages = [{**stage, **({"latency": latency} if latency else {})},
              {"name": "answer", "kind": "model", "after": ["rerank"]}]
    path = tmp_path / "app.toml"
    path.write_text(tomli_w.dumps({"application": {"stages": stages}}), encoding="utf-8")
    assert_user_error(*run_cli(["simulate", str(path), "--num-requests", "5"], monkeypatch, capsys),
                      "application", *fragments)


@pytest.mark.parametrize("overrides, fragment", [
    ({"deployment.prefill_replicas": 1, "deployment.chips": 16}, "with disaggregated prefill is not modelled"),
    ({"deployment.pp": 2, "deployment.tp": 4}, "with pipeline parallelism is not modelled"),
    ({"workload.max_concurrency": 8}, "with workload.max_concurrency is not modelled"),
    ({"loop": {"turns": 3, "between": [], "result_tokens": {"kind": "fixed", "value": 50},
               "call_output": {"kind": "fixed", "value": 20}}}, "with an agent loop is not modelled"),
])
def test_what_a_stage_on_the_shared_gpu_does_not_combine_with_is_one_line(overrides, fragment):
    from tokenpath.config.errors import UserError

    stages = load_scenario("rag").application.model_dump(mode="json", exclude_none=True)["stages"]
    loop = overrides.pop("loop", None)
    if loop is not None:
        stages = [{**stage, "loop": loop} if stage["kind"] == "model" else stage for stage in stages]
    with pytest.raises(UserError, match=fragment) as error:
        prepare(load_scenario("rag", {"workload.num_requests": 5, "application.stages": stages, **overrides}))
    assert "\n" not in str(error.value) and "serve the stage on \"cpu\" or a chip" in str(error.value)


@given(st.one_of(st.integers(1, 10**12), st.floats(1, 1e12)))
def test_a_parameter_count_reads_back_as_it_is_shown(params):
    assert _parse_params(shown_params(float(params))) == float(params)


@given(st.integers(1, 999), st.sampled_from(["", "k", "M", "B"]))
def test_a_parameter_count_with_a_suffix(number, unit):
    assert _parse_params(f"{number}{unit}") == number * {"": 1, "k": 1e3, "M": 1e6, "B": 1e9}[unit]


@settings(max_examples=40)
@given(st.one_of(st.text(max_size=12), st.floats(allow_nan=True), st.booleans(), st.none()))
def test_any_other_parameter_count_is_read_or_refused_with_a_reason(value):
    try:
        assert 1 <= _parse_params(value) <= 1e12
    except PydanticCustomError as error:
        assert str(error).startswith("params: ")


def test_the_levers_move_the_reranker_off_the_gpu_and_on_it(tmp_path):
    scenario = load_scenario("rag")
    levers = {lever.name: lever for lever in catalog(scenario, {}, tmp_path) if lever.group == APPLICATION_GROUP}
    assert "runs there already" in levers["rerank on the model's GPU"].skipped
    chip = next(s for s in levers["rerank on a h200 of its own"].overrides["application.stages"]
                if s["name"] == "rerank")
    assert chip["served"] == {"params": "560M", "precision": "bf16", "on": "h200", "max_batch": 8, "documents": 20,
                              "document_tokens": 128}
    cpu = next(s for s in levers[f"rerank on {HOST_CPU_CORES} CPU cores"].overrides["application.stages"]
               if s["name"] == "rerank")
    assert cpu["served"]["on"] == "cpu" and cpu["served"]["cores"] == HOST_CPU_CORES
    assert "max_batch" not in cpu["served"]  # a core serves one request at a time
    moved = load_scenario("rag", {"workload.num_requests": 20, **levers["rerank on a h200 of its own"].overrides})
    assert prepare(moved).application is not None  # off the GPU: laid out before the run


def _embed_on_cpu(**workload):
    """100-token questions, each embedded by a 335M model on one of 64 CPU cores (no queue)."""
    return load_scenario(None, {
        "workload.num_requests": 40, "workload.arrival.rate": 2.0, "workload.input": {"kind": "fixed", "value": 100},
        "workload.output": {"kind": "fixed", "value": 8}, **workload,
        "application": {"stages": [
            {"name": "embed", "kind": "embed", "served": {"params": "335M", "on": "cpu", "cores": 64}},
            {"name": "answer", "kind": "model", "after": ["embed"]}]}})


@pytest.mark.parametrize("workload", [{"workload.chat_template_tokens": 2000},
                                      {"workload.shared_prefix": {"tokens": 3000, "fraction": 0.5}}])
def test_an_embedder_reads_the_question_not_the_template_or_the_shared_prefix(workload):
    # The LLM server's chat template and the system prompt in front of the model's prompt never reach the
    # embedder: its time is the 100-token question's, request by request
    alone = simulate(_embed_on_cpu()).run.application_detail_ns["embed"]
    one_request_ns = round(cpu_forward_s(335e6, "bf16", np.array([100]))[0] * 1e9)
    assert alone.tolist() == [one_request_ns] * 40
    assert simulate(_embed_on_cpu(**workload)).run.application_detail_ns["embed"].tolist() == alone.tolist()


def test_a_reranker_on_the_model_s_gpu_reads_the_question_not_the_template():
    def rerank_job_ns(**workload):
        scenario = load_scenario(None, {
            "workload.num_requests": 10, "workload.input": {"kind": "fixed", "value": 100}, **workload,
            "application": {"stages": [
                {"name": "rerank", "kind": "rerank", "served": {"params": "560M", "on": "shared", "documents": 20,
                                                                "document_tokens": 128}},
                {"name": "answer", "kind": "model", "after": ["rerank"]}]}})
        return prepare(scenario).shared.kernel_ns([0])

    assert rerank_job_ns(**{"workload.chat_template_tokens": 2000}) == rerank_job_ns()


def test_a_client_further_away_moves_every_request_of_a_shared_gpu_stage_by_its_round_trip():
    # The stages run beside the server from when a request reaches it, so 80 ms more of round trip moves
    # every server-side event by 40 ms, the reranker's jobs on the model's GPU with the model calls, and
    # each request's TTFT and E2E by 80 ms exactly. (The client's half round trip had lain between the
    # stages and the model call: the jobs moved against the calls, TTFT by -105 to +248 ms.)
    def run(rtt):
        run = simulate(load_scenario("rag", {"workload.num_requests": 300, "delivery.network_rtt": rtt})).run
        order = np.argsort(run.request_index)
        return run.ttft_ns[order], run.e2e_ns[order]
    (ttft_near, e2e_near), (ttft_far, e2e_far) = run("20 ms"), run("100 ms")
    assert set((ttft_far - ttft_near).tolist()) == {80_000_000}
    assert set((e2e_far - e2e_near).tolist()) == {80_000_000}
