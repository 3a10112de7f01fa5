"""The front end as a shared CPU (delivery/frontend.py): API-server processes take requests and each
step's tokens first come first served, laid out per engine as each profile's processes are
(sim/front_end.py), and the time spent there in the attribution, checked against queues worked out by
hand."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.delivery.frontend import FrontEnd, Layout
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.sim import front_end
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.document import result_document
from tokenpath.sim.summary import DELIVERY_DETAIL


def test_requests_and_tokens_share_one_process_in_the_order_they_are_ready():
    front = FrontEnd(Layout("api-server"))
    # Two requests arrive at 0 (1 ms of work each), then a step's tokens are ready at 500 us (2 ms):
    # they wait for both requests; a request at 3.5 ms waits for the tokens.
    assert front.requests([0], 1e-3, [0.0])[0] == (1_000_000, 0, 1_000_000)
    assert front.requests([0], 1e-3, [0.0])[0] == (2_000_000, 1_000_000, 1_000_000)
    assert front.tokens(500_000, 2e-3, 1) == (4_000_000, 1_500_000, 2_000_000)
    assert front.requests([3_500_000], 1e-3, [0.0])[0] == (5_000_000, 500_000, 1_000_000)
    assert front.api_busy_ns == 5_000_000


def test_requests_go_to_the_processes_in_turn_and_a_step_s_tokens_are_shared_out():
    front = FrontEnd(Layout("api-server", api_processes=2))
    waits = [front.requests([0], 1e-3, [0.0])[0] for _ in range(4)]
    assert [done_ns for done_ns, _, _ in waits] == [1_000_000, 1_000_000, 2_000_000, 2_000_000]
    # 2 ms of token work for two tokens, 1 ms on each process, both free at 2 ms.
    assert front.tokens(1_500_000, 2e-3, 2) == (3_000_000, 500_000, 1_000_000)


def test_each_process_takes_its_own_requests_tokens():
    # A request dealt to process 0 (1 ms); its lone token ready at 0.5 ms is process 0's work alone: it
    # waits for the parse and runs its whole 2 ms there (it was split 1 ms a process, gone at 2 ms).
    front = FrontEnd(Layout("api-server", api_processes=2))
    assert front.requests([0], 1e-3, [0.0])[0] == (1_000_000, 0, 1_000_000)
    assert front.tokens(500_000, 2e-3, 1) == (3_000_000, 500_000, 2_000_000)
    assert front._api_busy_ns == [3_000_000, 0]
    # Three tokens over two processes: the one dealt the latest request (process 1, after a second
    # request) takes two of them, 2 ms of the 3 ms; process 0 one, 1 ms.
    front.requests([4_000_000], 1e-3, [0.0])
    assert front.tokens(6_000_000, 3e-3, 3) == (8_000_000, 0, 2_000_000)
    assert front._api_busy_ns == [4_000_000, 3_000_000]


def test_more_api_servers_leave_a_lone_request_s_latency_alone():
    # One request at a time: a second API server takes nothing off its path (it shortened each of its
    # tokens' 27 us of front-end work by half, 13.6 us off TTFT and E2E).
    runs = [simulate(load_scenario(None, {
        "model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "workload.num_requests": 1,
        "workload.input": {"kind": "fixed", "value": 200}, "workload.output": {"kind": "fixed", "value": 8},
        "deployment.api_servers": api_servers})).run for api_servers in (1, 2)]
    assert runs[0].ttft_ns[0] == runs[1].ttft_ns[0]
    assert runs[0].e2e_ns[0] == runs[1].e2e_ns[0]
    assert runs[0].frontend_work_ns[0] == runs[1].frontend_work_ns[0]


def test_a_share_of_a_process_runs_its_work_at_full_speed_and_holds_the_process_for_the_others_share():
    # A quarter of an API server and half of a detokenizer process: 1 ms of work is done in 1 ms, and the
    # process is then busy for the other engines' 3 ms (1 ms) more, so the next piece of work waits.
    front = FrontEnd(Layout("detokenizer", api_cpus=0.25, detokenizer_cpus=0.5))
    assert front.requests([0], 1e-3, [0.0])[0] == (1_000_000, 0, 1_000_000)
    assert front.tokens(0, 1e-3, 1) == (5_000_000, 4_000_000, 1_000_000)
    assert front.api_busy_ns == 8_000_000
    assert front.detokenize(0, 1e-3) == (1_000_000, 0, 1_000_000)
    assert front.detokenize(0, 1e-3) == (3_000_000, 2_000_000, 1_000_000)
    assert front.detokenizer_busy_ns == 4_000_000


@settings(max_examples=40, deadline=None)
@given(share=st.sampled_from([1.0, 0.5, 0.25, 0.125]),
       ready=st.lists(st.integers(0, 10**7), min_size=1, max_size=20), work_ns=st.integers(1, 10**6))
def test_a_run_of_steps_on_a_shared_process_is_taken_as_one_step_at_a_time(share, ready, work_ns):
    ready_ns = np.array(sorted(ready), np.int64)
    one, run = FrontEnd(Layout("api-server", api_cpus=share)), FrontEnd(Layout("api-server", api_cpus=share))
    each = [one.tokens(int(t), work_ns / 1e9, 1) for t in ready_ns]
    done, queue, work = run.tokens_run(ready_ns, work_ns / 1e9)
    assert [tuple(map(int, w)) for w in zip(done, queue, work)] == each
    assert run.api_busy_ns == one.api_busy_ns == len(ready) * round(work_ns / share)


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.booleans(), st.integers(0, 10**7), st.integers(0, 10**6)), min_size=1,
                     max_size=30))
def test_one_process_is_a_first_come_first_served_queue(jobs):
    """free_k = max(free_(k-1), ready_k) + work_k, whatever the kind of work, handed over in ready order."""
    front = FrontEnd(Layout("api-server"))
    free = 0
    for is_request, ready_ns, work_ns in sorted(jobs, key=lambda job: job[1]):
        cost_s = work_ns / 1e9
        wait = front.requests([ready_ns], cost_s, [0.0])[0] if is_request else front.tokens(ready_ns, cost_s, 1)
        done_ns, queue_ns, worked_ns = wait
        start = max(free, ready_ns)
        free = start + work_ns
        assert done_ns == free and queue_ns == start - ready_ns
        assert worked_ns == (work_ns if is_request or free > ready_ns else 0)


def test_the_request_path_costs_parse_template_and_tokens():
    last_mile = LastMile(DeliverySpec(frontend_per_request=50e-6, chat_template_per_request=30e-6,
                                      tokenize_per_token=1e-6))
    assert last_mile.request_stages_s(500) == pytest.approx((50e-6, 530e-6))
    assert last_mile.request_cost_s(500) == pytest.approx(580e-6)
    assert last_mile.requests([1_000], [500]) == [(581_000, 0, 580_000)]


def test_a_burst_is_read_and_parsed_before_any_of_it_is_tokenized():
    # Three requests at once, each 1 ms to read and parse, then 2 ms to template and tokenize: the
    # first stages end at 1, 2, 3 ms, the second stages at 5, 7, 9 ms.
    front = FrontEnd(Layout("api-server"))
    waits = front.requests([0, 0, 0], 1e-3, [2e-3] * 3)
    assert [done_ns for done_ns, _, _ in waits] == [5_000_000, 7_000_000, 9_000_000]
    assert [queue_ns for _, queue_ns, _ in waits] == [2_000_000, 4_000_000, 6_000_000]
    assert all(work_ns == 3_000_000 for _, _, work_ns in waits)
    # One at a time (a moment of the engine loop each), a request's stages run back to back.
    assert front.requests([9_000_000], 1e-3, [2e-3]) == [(12_000_000, 0, 3_000_000)]
    # Handed over together but arriving 10 ms apart, the first is done before the second arrives.
    assert front.requests([20_000_000, 30_000_000], 1e-3, [2e-3] * 2) == [
        (23_000_000, 0, 3_000_000), (33_000_000, 0, 3_000_000)]
    # 1 ms apart, the second's reading comes before the first's tokenizing (ready at 41 and 42 ms).
    assert front.requests([40_000_000, 40_500_000], 1e-3, [2e-3] * 2) == [
        (44_000_000, 1_000_000, 3_000_000), (46_000_000, 500_000 + 2_000_000, 3_000_000)]


@pytest.mark.parametrize(("scheduler", "replicas", "api_servers", "layout"), [
    # vLLM V1: one API server per data-parallel replica, detokenizing there, tokenizing in its thread.
    # Both merge a request's outputs its stream has not yet framed.
    ("vllm-v1", 4, None, Layout("api-server", 1, 1.0, 0.25, tokenizes_in_thread=True, merges_events=True)),
    # SGLang: one tokenizer manager and one detokenizer for the whole server, shared by 4 replicas.
    ("prefill-first", 4, None, Layout("detokenizer", 1, 0.25, 0.25, outputs_per_event=True, merges_events=True)),
    ("vllm-v0", 1, None, Layout("engine", 1, 1.0, 1.0, tokenizes_in_thread=True)),
    # Eight processes for 4 replicas: two each; six: two each at 0.75 CPU (1.5 CPUs an engine), not one
    # process at 1.5 CPUs: a process is one Python interpreter, so runs on one CPU at most.
    ("vllm-v1", 4, 8, Layout("api-server", 2, 1.0, 0.25, tokenizes_in_thread=True, merges_events=True)),
    ("trtllm", 4, 6, Layout("api-server", 2, 0.75, 0.25, outputs_per_event=True)),
    ("vllm-v1", 2, 5, Layout("api-server", 3, 5 / 6, 0.5, tokenizes_in_thread=True, merges_events=True)),
])
def test_each_engine_gets_its_share_of_the_deployment_s_processes(scheduler, replicas, api_servers, layout):
    overrides = {"engine.scheduler": scheduler, "deployment.tp": 8 // replicas}
    if api_servers is not None:
        overrides["deployment.api_servers"] = api_servers
    assert build_deployment(load_scenario(None, overrides)).front_end == layout


@pytest.mark.parametrize(("scheduler", "overrides", "seconds"), [
    ("vllm-v1", {}, 6.45e-6),                    # its API server's output handler, timed with vLLM's code
    ("vllm-v0", {}, 17e-6),                      # V0's detokenizer in the engine (vLLM issue 5206)
    ("vllm-v0", {"assumptions.vllm_v0_detokenize_per_token_s": 2e-6}, 2e-6),
    ("vllm-v0", {"delivery.detokenize_per_token": 1e-6}, 1e-6),  # the scenario's own field wins
    ("trtllm", {}, 6.45e-6),
    ("prefill-first", {}, 11.23e-6),  # SGLang's DetokenizerManager, timed with its own code
    ("prefill-first", {"assumptions.sglang_detokenize_per_token_s": 3e-6}, 3e-6),
])
def test_each_profile_detokenizes_at_its_own_registry_time(scheduler, overrides, seconds):
    scenario = load_scenario(None, {"engine.scheduler": scheduler, **overrides})
    assert scenario.resolved_delivery().detokenize_per_token == pytest.approx(seconds)


@pytest.mark.parametrize(("scheduler", "overrides", "seconds"), [
    ("prefill-first", {}, 5.19e-6),  # SGLang's TokenizerManager taking in the detokenizer's text
    ("prefill-first", {"assumptions.sglang_output_per_token_s": 4e-6}, 4e-6),
    ("prefill-first", {"delivery.output_per_token": 1e-6}, 1e-6),
    ("vllm-v1", {}, 0.0),  # within its API server's detokenizing time
    ("trtllm", {}, 0.0),
])
def test_each_profile_s_api_server_takes_in_outputs_at_its_own_registry_time(scheduler, overrides, seconds):
    scenario = load_scenario(None, {"engine.scheduler": scheduler, **overrides})
    assert scenario.resolved_delivery().output_per_token == pytest.approx(seconds)


@pytest.mark.parametrize(("release", "api_servers"), [("0.14.0", 1), ("0.15.0", 4), (None, 4)])
def test_vllm_runs_an_api_server_per_replica_from_0_15_0(release, api_servers):
    # --api-server-count defaulted to 1 until 0.14.0, to the data-parallel size from 0.15.0.
    overrides = {"engine.scheduler": "vllm-v1", "deployment.tp": 2}
    if release is not None:
        overrides["engine.version"] = release
    assert front_end.api_servers(load_scenario(None, overrides)) == api_servers


@given(total=st.integers(1, 64), engines=st.integers(1, 64))
def test_an_engine_s_share_of_the_api_servers_is_exact_and_no_process_is_faster_than_one_cpu(total, engines):
    overrides = {"engine.scheduler": "vllm-v1", "deployment.api_servers": total}
    layout = front_end.layout(load_scenario(None, overrides), engines)
    assert layout.api_cpus <= 1.0
    assert layout.api_processes * layout.api_cpus == pytest.approx(total / engines)


def test_a_lone_request_on_a_share_of_the_api_servers_takes_its_cpu_time():
    overrides = {"engine.scheduler": "vllm-v1", "deployment.tp": 2, "deployment.api_servers": 6}
    front = FrontEnd(build_deployment(load_scenario(None, overrides)).front_end)  # 4 replicas of 8 chips
    assert front.requests([0], 1e-3, [0.0])[0] == (1_000_000, 0, 1_000_000)
    assert front.api_busy_ns == 1_333_333  # 0.75 of each of 2 processes: held for the other engines' share


def test_sglang_s_replicas_share_one_tokenizer_manager_without_slowing_a_lone_request():
    # Eight replicas of one chip under one TokenizerManager and one DetokenizerManager: a request alone
    # is served at one CPU's speed, as on one chip; the processes' capacity is an eighth each.
    def lone(chips):
        return simulate(load_scenario(None, {
            "model.name": "llama-3.1-8b", "engine.scheduler": "prefill-first", "deployment.chips": chips,
            "deployment.tp": 1, "workload.num_requests": 1, "workload.input": {"kind": "fixed", "value": 2000},
            "workload.output": {"kind": "fixed", "value": 8}})).run
    one, eight = lone(1), lone(8)
    assert eight.frontend_work_ns[0] == one.frontend_work_ns[0]
    assert eight.ttft_ns[0] == one.ttft_ns[0]


@pytest.mark.parametrize("layout", [{"api_cpus": 1.5}, {"detokenizer_cpus": 2.0}])
def test_a_layout_refuses_a_process_faster_than_one_cpu(layout):
    with pytest.raises(ValueError, match="one CPU at most"):
        Layout("api-server", **layout)


# A burst on one replica: 1,000 requests at once, each 1 ms of front-end work as it arrives and nothing
# else there (no template, tokenizing, tokens to detokenize or frame, or network). One process reads
# request k from k to k + 1 ms, then passes it on when it has read them all, at 1,000 ms: it waits
# k + (999 - k) = 999 ms. Four processes take requests in turn, 250 each: 249 ms. Every request's last
# token leaves long after the front end has worked through the burst, so it waits for nothing.
BURST = {
    "workload.num_requests": 1000, "workload.arrival.rate": "inf",
    "workload.input": {"kind": "fixed", "value": 200}, "workload.output": {"kind": "fixed", "value": 150},
    "delivery": {"network_rtt": 0.0, "frontend_per_request": "1 ms", "chat_template_per_request": 0.0,
                 "tokenize_per_token": 0.0, "detokenize_per_token": 0.0, "frame_per_event": 0.0,
                 "host_link_latency": 0.0, "request_overhead_bytes": 0, "event_overhead_bytes": 0,
                 "bytes_per_token": 0.0},
    "deployment.tp": 8,
}


@pytest.mark.parametrize(("api_servers", "mean_wait_ms"), [(1, 999.0), (4, 249.0)])
def test_a_burst_queues_at_the_front_end_and_more_api_servers_shorten_the_queue(api_servers, mean_wait_ms):
    simulation = simulate(load_scenario(None, {**BURST, "deployment.api_servers": api_servers}))
    run = simulation.run
    assert (run.frontend_work_ns == 1_000_000).all()
    assert run.frontend_queue_ns.mean() == pytest.approx(mean_wait_ms * 1e6)
    detail = simulation.summary["attribution_s"]["delivery_detail"]
    assert detail["frontend_queue"] == pytest.approx(mean_wait_ms * 1e-3)
    assert sum(detail[part] for part in DELIVERY_DETAIL) == pytest.approx(
        simulation.summary["attribution_s"]["delivery"], rel=1e-12)


def test_a_saturated_front_end_is_named_in_the_verdict():
    # Llama 3.1 8B on one H200 at 700 requests/s, each 2 ms of front-end work plus 20 tokens to
    # detokenize and frame: its one API server serves under 400 a second, before the engine does.
    document, reason = result_document(simulate(load_scenario(None, {
        "workload.num_requests": 2000, "workload.arrival.rate": 700.0, "delivery.frontend_per_request": "2 ms",
        "model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1,
        "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 20}})))
    assert document["load"]["overloaded"] and document["bottleneck"] == "delivery"
    assert re.search(r"delivery limits capacity: front end saturated \((99|100)% busy\): the front end's busiest "
                     "API-server", reason)
    detail = document["attribution_s"]["delivery_detail"]
    assert detail["frontend_queue"] > 0.9 * document["attribution_s"]["delivery"]


def test_the_default_scenario_offers_front_end_levers_and_not_async_detokenization():
    from tokenpath.whatif.catalog import catalog

    levers = {lever.name: lever for lever in catalog(load_scenario(None), {}, None)}
    assert levers["API servers x2 (2 processes)"].overrides == {"deployment.api_servers": 2}
    # vLLM V1 detokenizes in its API server already: no lever moves it out of the engine.
    assert levers["detokenize in a process of its own"].skipped.endswith("it detokenizes in the api-server")
    assert levers["cached chat template"].overrides == {"delivery.chat_template_per_request": "0 s"}
    assert not any("async" in name for name in levers)


def test_a_request_ready_before_a_step_s_tokens_goes_first_though_handed_in_after():
    """A cluster hands a replica a request once the step under way there has run (engine/cluster.py): the
    request reached the server during the step, before the step's tokens were ready, and its work comes
    first, as the engine loop run alone orders it."""
    front = FrontEnd(Layout("api-server"))
    assert front.tokens(5_000_000, 2e-3, 1) == (7_000_000, 0, 2_000_000)
    assert front.requests([4_000_000], 1e-3, [0.0])[0] == (5_000_000, 0, 1_000_000)
    assert front.requests([6_000_000], 1e-3, [0.0])[0] == (8_000_000, 1_000_000, 1_000_000)  # after: it waits


def _on_one_clock_and_alone(scheduled, inputs, outputs, delivery, replicas=2):
    """Each replica's trace routed round-robin through the cluster's shared clock, beside the trace of the
    replica run alone on its share of the requests."""
    from test_engine import FixedCosts
    from tokenpath.engine.cluster import run_cluster
    from tokenpath.engine.loop import run_engine
    from tokenpath.engine.spec import EngineSpec

    spec, costs = EngineSpec(max_num_seqs=8, max_num_batched_tokens=512), FixedCosts(base_s=3e-3, per_token_s=2e-6)

    def last_mile():
        return LastMile(delivery, Layout("api-server"))

    _, traces, _ = run_cluster(scheduled, inputs, outputs, None, costs, [last_mile() for _ in range(replicas)],
                               spec, 10**6, "round_robin")
    return [(traces[r], run_engine(scheduled[r::replicas], inputs[r::replicas], outputs[r::replicas], costs,
                                   last_mile(), spec, 10**6)) for r in range(replicas)]


def test_replicas_on_one_clock_pass_their_front_ends_as_replicas_run_apart():
    """Round-robin through the cluster's shared clock gives each replica the trace it has alone, its front
    end's request work included (before, a request that reached a replica mid-step waited for that step's
    token work, and joined a step later)."""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 60
    inputs, outputs = rng.integers(1, 400, n), rng.integers(2, 60, n)
    # Requests far enough apart that no two reach a replica in one step (two handed in one at a time can
    # take the front end's two stages in another order than two handed in together).
    scheduled = np.sort(rng.integers(0, 3_000_000_000, n))
    delivery = DeliverySpec(network_rtt=0, frontend_per_request=2e-3, tokenize_per_token=1e-6, detokenize="api-server",
                            detokenize_per_token=20e-6)
    for clocked, alone in _on_one_clock_and_alone(scheduled, inputs, outputs, delivery):
        assert np.array_equal(alone.upload_ns, clocked.upload_ns)
        assert np.array_equal(alone.step_start_ns, clocked.step_start_ns)


def test_a_burst_routed_on_one_clock_passes_each_front_end_as_the_replica_alone_does():
    """A burst sent at once, routed round-robin through the cluster's clock: each replica's front end reads and
    parses its share of the burst before tokenizing any of it, as the replica run alone does. (Before, asking an
    idle replica when it would next step passed the first request it had been handed through its front end
    alone, before the rest of its share, sent in the same instant, had been routed: up to 10.9 ms less
    front-end wait for a request and 11.1 ms more for another.)"""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 24
    inputs, outputs = rng.integers(1, 400, n), rng.integers(2, 60, n)
    delivery = DeliverySpec(network_rtt=0.02, frontend_per_request=1e-3, tokenize_per_token=1e-6,
                            detokenize="api-server", detokenize_per_token=20e-6)
    for clocked, alone in _on_one_clock_and_alone(np.zeros(n, np.int64), inputs, outputs, delivery):
        assert alone.front_queue_ns.tolist() == clocked.front_queue_ns.tolist()
        assert np.array_equal(alone.step_start_ns, clocked.step_start_ns)


def test_vllm_tokenizes_in_a_thread_beside_its_event_loop_from_0_6_5():
    # vLLM's OpenAI server tokenizes in a thread executor of its own from 0.6.5 (0.6.4 on its loop).
    def layout(release):
        return front_end.layout(load_scenario(None, {"engine.scheduler": "vllm-v1", "engine.version": release}), 1)
    assert not layout("0.6.4").tokenizes_in_thread
    assert layout("0.6.5").tokenizes_in_thread and layout("0.8.3").tokenizes_in_thread
    assert not front_end.layout(load_scenario(None, {"engine.scheduler": "prefill-first"}), 1).tokenizes_in_thread


def test_a_prompt_tokenized_in_a_thread_waits_for_the_prompts_before_it_not_for_the_loop_s_token_work():
    # A step's tokens take the loop 5 ms from 0; a request arriving at 1 ms parses after them (5 to 6 ms),
    # then is tokenized in 4 ms. On the loop, a second step's 5 ms of tokens at 7 ms would wait for that
    # tokenizing (10 to 15 ms); with a thread the loop is free again at 6 ms, and they run 7 to 12 ms.
    for thread, tokens_done_ns in ((False, 15_000_000), (True, 12_000_000)):
        front = FrontEnd(Layout("api-server", tokenizes_in_thread=thread))
        front.tokens(0, 5e-3, 1)
        assert front.request(1_000_000, 1e-3, 0.0, 4e-3) == (10_000_000, 4_000_000, 5_000_000)
        assert front.tokens(7_000_000, 5e-3, 1)[0] == tokens_done_ns
    # Two prompts at once: both parsed on the loop first (0-1 and 1-2 ms), then tokenized in turn on the
    # thread (2-6 and 6-10 ms).
    front = FrontEnd(Layout("api-server", tokenizes_in_thread=True))
    assert front.requests([0, 0], 1e-3, [0.0, 0.0], [4e-3, 4e-3]) == [
        (6_000_000, 1_000_000, 5_000_000), (10_000_000, 5_000_000, 5_000_000)]
    assert front.tokenizer_busy_ns == 8_000_000 and front.api_busy_ns == 2_000_000


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1,
                     max_size=20), thread=st.booleans())
def test_a_request_alone_and_in_a_batch_of_one_are_served_alike(jobs, thread):
    one, batch = (FrontEnd(Layout("api-server", tokenizes_in_thread=thread)) for _ in range(2))
    for at_ns, then_ns, tokenize_ns in sorted(jobs):
        alone = one.request(at_ns, 1e-4, then_ns / 1e9, tokenize_ns / 1e9)
        assert alone == batch.requests([at_ns], 1e-4, [then_ns / 1e9], [tokenize_ns / 1e9])[0]
        done_ns, queue_ns, worked_ns = alone
        assert queue_ns >= 0 and done_ns == at_ns + queue_ns + worked_ns


def test_outputs_that_come_before_the_step_before_is_framed_go_out_in_its_events():
    # Each step: 1 ms of detokenizing, then 2 ms of framing. A request's 10 ms of parsing holds the process
    # from 0; steps' outputs come at 1, 2 and 3 ms. Without merging each step takes its 3 ms in turn (done at
    # 13, 16, 19 ms). Merged (vLLM V1, SGLang), the second and third come while the first still waits, so
    # they take only their detokenizing: done at 13, 14, 15 ms.
    for merges, done in ((False, [13, 16, 19]), (True, [13, 14, 15])):
        front = FrontEnd(Layout("api-server", merges_events=merges))
        front.request(0, 10e-3, 0.0)
        assert [front.tokens(t * 1_000_000, 3e-3, 1, 2e-3)[0] for t in (1, 2, 3)] == [d * 1_000_000 for d in done]
        # A step well after the queue has drained frames its own.
        assert front.tokens(100_000_000, 3e-3, 1, 2e-3) == (103_000_000, 0, 3_000_000)


@settings(max_examples=60, deadline=None)
@given(ready=st.lists(st.integers(0, 10**7), min_size=1, max_size=25), work_ns=st.integers(2, 10**6),
       busy_ns=st.integers(0, 10**7), merges=st.booleans())
def test_a_run_of_steps_that_may_merge_is_taken_as_one_step_at_a_time(ready, work_ns, busy_ns, merges):
    ready_ns = np.array(sorted(ready), np.int64)
    one, run = (FrontEnd(Layout("api-server", merges_events=merges)) for _ in range(2))
    for front in (one, run):
        front.request(0, busy_ns / 1e9, 0.0)
    cost_s, frame_s = work_ns / 1e9, work_ns // 2 / 1e9
    each = [one.tokens(int(t), cost_s, 1, frame_s) for t in ready_ns]
    done, queue, work = run.tokens_run(ready_ns, cost_s, frame_s)
    assert [tuple(map(int, w)) for w in zip(done, queue, work)] == each
    assert run.api_busy_ns == one.api_busy_ns


def test_a_front_end_calibrated_on_serve_runs_as_serve_s_own_process(tmp_path):
    # tokenpath serve tokenizes a benchmark's prompt on its loop and writes every event it is due: the
    # scenario that prices serve's process (calibrated_server = "serve") is laid out so, whatever engine
    # it names; one that prices the engine's runs vLLM's thread and merged events.
    calibration = tmp_path / "delivery.toml"
    calibration.write_text("")
    def layout(server):
        return front_end.layout(load_scenario(None, {"delivery.calibration": str(calibration),
                                                     "delivery.calibrated_server": server}), 1)
    assert not layout("serve").tokenizes_in_thread and not layout("serve").merges_events
    assert layout("engine").tokenizes_in_thread and layout("engine").merges_events
