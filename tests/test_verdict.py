"""The bottleneck line names what limits and what users feel: every serial resource enters the capacity
verdict, and a metric that misses its SLO is explained by the layer that holds it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tokenpath import load_scenario, simulate
from tokenpath.diagnose.bottleneck import Evidence, bottleneck
from tokenpath.diagnose.felt import PARTS, felt_parts_s
from tokenpath.sim.document import result_document


def _verdict(**changes) -> tuple[dict, str]:
    return result_document(simulate(load_scenario(None, {"workload.num_requests": 600, **changes})))


def test_a_saturated_detokenizer_process_limits_capacity_and_the_verdict_says_the_front_end_is_saturated():
    # 1 ms a token in one detokenizer process: 1,000 tokens/s, about 6.4 requests/s of 156 tokens.
    document, reason = _verdict(**{"delivery.detokenize": "detokenizer", "delivery.detokenize_per_token": "1 ms"})
    assert document["load"]["overloaded"] is True
    assert document["bottleneck"] == "delivery"
    assert "delivery limits capacity: front end saturated (" in reason and "busy): the detokenizer process" in reason
    tokens_per_s = document["throughput"]["output_tokens_per_s"]
    assert tokens_per_s == pytest.approx(1000, rel=0.1)


def test_a_two_second_round_trip_is_what_users_feel_and_the_verdict_names_the_network():
    document, reason = _verdict(**{"delivery.network_rtt": "2 s"})
    assert document["bottleneck"] == "delivery"
    assert "of TTFT is the last mile" in reason and "the network" in reason and "TTFT SLO of 2 s" in reason


def test_without_a_missed_slo_the_verdict_is_e2e_s_layer_and_names_ttft_s_when_it_differs():
    document, reason = _verdict(**{"delivery.network_rtt": "1 s"})
    assert document["bottleneck"] == "compute" and "of E2E is engine compute" in reason
    assert "; TTFT: " in reason and "of TTFT is the last mile" in reason


def test_felt_parts_sum_to_each_metric():
    rng = np.random.default_rng(0)
    n = 50
    sent = np.sort(rng.integers(0, 10**9, n))
    upload = rng.integers(1, 10**6, n)
    start = sent + upload + rng.integers(0, 10**8, n)
    engine = rng.integers(1, 10**8, n)
    after = rng.integers(1, 10**7, n)
    ttft_engine = start + engine - sent
    ttft = ttft_engine + after
    ttfv = ttft + rng.integers(0, 10**7, n)
    out = rng.integers(1, 100, n)
    e2e = {part: rng.integers(10**8, 10**9, n) for part in PARTS}
    mix = {"compute": 0.6, "traffic": 0.3, "delivery": 0.1}
    parts = felt_parts_s(sent, upload, start, ttft_engine, ttft, ttfv, e2e, out, mix)
    assert sum(parts["ttft"].values()) == pytest.approx(ttft.mean() / 1e9)
    assert sum(parts["ttfv"].values()) == pytest.approx(ttfv.mean() / 1e9)
    assert parts["ttft"]["queue"] == pytest.approx((start - sent - upload).mean() / 1e9)
    assert parts["ttft"]["traffic"] == pytest.approx(0.3 * engine.mean() / 1e9)


def test_kv_caches_queueing_for_slow_links_to_the_decode_pool_are_overload_that_names_the_links():
    # One prefill and one decode replica whose nodes talk over 50 MB/s: every KV cache waits for the
    # one before it, so TTFT and E2E both grow through the run (the first token the client gets comes
    # from the decode replica, after the transfer).
    fabric = {"kind": "hierarchy", "nodes": 2, "node": {"kind": "switch", "hosts": 8, "link_bw": "450 GB/s"},
              "network": {"kind": "switch", "hosts": 16, "link_bw": "50 MB/s"}}
    document, reason = _verdict(**{"workload.num_requests": 300, "deployment.chips": 16,
                                   "deployment.prefill_replicas": 1, "deployment.fabric": fabric})
    load = document["load"]
    assert load["overloaded"] is True and load["e2e_trend"] > 2 and load["ttft_trend"] > 2
    assert document["bottleneck"] == "traffic"
    assert "the KV-transfer port of the busiest replica is busy" in reason


def _evidence(memory: float, fixed: float, launch: float = 0.0, host: float = 0.0) -> Evidence:
    return Evidence(busy_fraction=1.0, mean_batch_seqs=4, preemptions=0, memory_bound_fraction=memory,
                    traffic_detail="", network_rtt_s=0.02, detokenize="api-server", host_share_of_step=0.0,
                    fixed_bound_fraction=fixed, launch_bound_fraction=launch, host_bound_fraction=host)


def test_ops_bound_by_their_fixed_kernel_cost_are_not_flop_bound():
    assert _evidence(memory=0.02, fixed=0.89).bound == "kernel-overhead"  # 9% of the time in FLOP-bound ops
    assert _evidence(memory=0.49, fixed=0.40).bound == "HBM-bandwidth"
    assert _evidence(memory=0.29, fixed=0.11).bound == "FLOP"


def test_time_the_gpu_waits_on_its_host_is_no_flop_bound_time():
    assert _evidence(memory=0.31, fixed=0.05, launch=0.56).bound == "kernel-launch"  # 8% FLOP-bound
    assert _evidence(memory=0.30, fixed=0.0, host=0.36).bound == "host"  # 34% FLOP-bound: the host holds more
    assert _evidence(memory=0.30, fixed=0.0, host=0.30, launch=0.05).bound == "FLOP"  # 35%


# SGLang's newest release replays DeepSeek-V3's prompt steps as graphs on Hopper and not on Blackwell, where its
# trtllm_mla backend would leave the graph (engine/cuda_graphs.py): there each prompt step launches its kernels
# from Python, and its host's launches outlast the B200's kernels.
SGLANG_DEEPSEEK = {"model.name": "deepseek-v3", "engine.scheduler": "prefill-first", "workload.arrival.rate": 8,
                   "workload.num_requests": 300}
PARTS_SCENARIOS = {
    "sglang deepseek-v3 b200 (eager prompt steps)": {**SGLANG_DEEPSEEK, "deployment.chip": "b200"},
    "vllm-v0 8b h100 (its host in every step)": {"model.name": "llama-3.1-8b", "deployment.chip": "h100",
                                                 "deployment.chips": 1, "deployment.tp": 1,
                                                 "engine.scheduler": "vllm-v0", "workload.num_requests": 200},
    "default (graphs, overlapped host)": {"workload.num_requests": 200},
}


@pytest.mark.parametrize("name", PARTS_SCENARIOS)
def test_a_steps_parts_add_up_to_the_compute_time_its_trace_recorded(name):
    # What the verdict's shares are made of: every step's kernels, launches and host time, as step_parts_s
    # reads them back from the step's trace row, make the compute time the engine gave the step.
    sim = simulate(load_scenario(None, PARTS_SCENARIOS[name]))
    compute, trace = sim.deployment.compute, sim.traces[0]
    launched = host = 0.0
    for k in range(len(trace.step_tokens)):
        ops, launch_s, host_s = compute.step_parts_s(
            int(trace.step_tokens[k]), int(trace.step_logits[k]), int(trace.step_attn_pairs[k]),
            int(trace.step_kv_read_tokens[k]), int(trace.step_chunk_context_tokens[k]),
            trace.step_traffic_ns[k] / 1e9, trace.step_ahead_ns[k] / 1e9, bool(trace.step_scheduled[k]))
        parts_s = sum(op.time_s for op in ops) + launch_s + host_s
        assert parts_s == pytest.approx(trace.step_compute_ns[k] / 1e9, rel=1e-6, abs=1e-9), k
        launched, host = launched + launch_s, host + host_s
    if "eager" in name:
        assert launched > 0.1 * trace.step_compute_ns.sum() / 1e9
    if "host in every step" in name:
        assert host > 0.1 * trace.step_compute_ns.sum() / 1e9
    if "graphs" in name:
        assert launched == 0.0 and host == 0.0


def _share_before(text: str, reason: str) -> int:
    """The whole percent just before `text` in the verdict."""
    return int(reason.split(text)[0].rsplit(" ", 1)[1].rstrip("%"))


LAUNCHES = "waiting on the host to launch eager steps' kernels one by one"


def test_steps_that_wait_on_their_hosts_launches_are_called_launch_bound_not_flop_bound():
    # trtllm-serve's defaults capture decode batches of 1-32, 64 and 128 sequences and pad none: at 20 req/s
    # most steps launch their kernels from Python, and over half of the compute time is the GPU waiting for
    # them (the verdict read "21% of compute time is in memory-bound ops, so steps are FLOP-bound"). Padded,
    # the decode steps replay graphs and the rest is the ops'.
    trtllm = {"engine.scheduler": "trtllm", "workload.arrival.rate": 20}
    _, reason = _verdict(**trtllm)
    e2e = reason.split("; TTFT: ")[0]
    assert f"{LAUNCHES}, so steps are kernel-launch-bound" in e2e
    assert 40 <= _share_before(f" {LAUNCHES}", e2e) <= 80
    _, reason = _verdict(**trtllm, **{"engine.cuda_graph_padding": True})
    assert "launch" not in reason and "so steps are FLOP-bound" in reason


def test_a_first_token_whose_prompt_steps_wait_on_launches_says_so_beside_a_bandwidth_bound_decode():
    # SGLang on B200 runs DeepSeek-V3's prompt steps eagerly and its decode steps as graphs: a first token's
    # compute is its prompt's steps, three quarters of their time the launches (the TTFT line read "66% of
    # compute time is in memory-bound ops, so steps are HBM-bandwidth-bound", over every step). On H200 the
    # prompts replay graphs too, and the TTFT line names no launches.
    _, reason = _verdict(**SGLANG_DEEPSEEK, **{"deployment.chip": "b200"})
    ttft = reason.split("; TTFT: ")[1]
    assert "of TTFT is engine compute in steps that hold prompts" in ttft
    assert f"{LAUNCHES}, so they are kernel-launch-bound" in ttft
    assert 60 <= _share_before(f" {LAUNCHES}", ttft) <= 90
    _, reason = _verdict(**SGLANG_DEEPSEEK, **{"deployment.chip": "h200"})
    assert "launch" not in reason and "HBM-bandwidth-bound" in reason


def test_an_agents_first_token_compute_of_earlier_calls_is_named_with_every_steps_bound():
    """In an agent loop's last call, TTFT holds the earlier calls whole, their decodes too: the line says so and
    takes its bound from every step, not from the prompt steps (which held 0.5% of that TTFT's compute)."""
    from tokenpath.diagnose.bottleneck import _explain

    evidence = replace(_evidence(memory=0.41, fixed=0.0), mean_batch_seqs=25,
                       prompt_step_shares={"memory": 0.17, "fixed": 0.0, "launch": 0.0, "host": 0.0},
                       earlier_calls_compute_s=1.895)
    parts = {"queue": 1.0, "compute": 1.917, "traffic": 0.5, "delivery": 0.6}
    line = _explain("compute", "ttft", parts, evidence)
    assert line.startswith("48% of TTFT is engine compute, 99% of it the earlier model calls of each request's loop, "
                           "decoding included, at a mean batch of 25 sequences; 41% of compute time is in "
                           "memory-bound ops")
    assert "steps that hold prompts" in _explain("compute", "ttft", parts, replace(evidence, earlier_calls_compute_s=0))


def test_a_light_fp4_run_on_hopper_is_not_called_flop_bound():
    # 70B at 3 req/s, fp4 weights on H200 (weight-only): ~89% of compute time is fixed per-kernel cost,
    # 2% memory-bound, 9% FLOP-bound; the verdict read "2% ... memory-bound ops, so steps are FLOP-bound".
    summary = simulate(load_scenario(None, {"workload.num_requests": 300, "workload.arrival.rate": 3,
                                            "model.precision": "fp4"})).summary
    reason = summary["bottleneck_reason"]
    assert "FLOP-bound" not in reason
    assert "kernel-overhead-bound" in reason


def test_a_first_token_held_by_a_busy_front_end_names_the_front_end_not_the_round_trip():
    # One API-server process at 40 ms a request, 20 req/s: ~80% busy; the first token's last mile is its
    # queue (api_servers = 2 cuts mean TTFT from ~326 ms to ~102 ms; RTT / 4 cuts 15 ms).
    summary = simulate(load_scenario(None, {
        "workload.num_requests": 500, "model.name": "llama-3.1-8b", "deployment.chip": "h100",
        "deployment.chips": 1, "deployment.tp": 1, "workload.arrival.rate": 20,
        "delivery.frontend_per_request": "40 ms", "deployment.api_servers": 1})).summary
    ttft = summary["bottleneck_reason"].split("TTFT: ", 1)[1]
    assert "of TTFT is the last mile" in ttft
    assert "the front end's processes" in ttft
    assert "and detokenizing in the" not in ttft


def test_an_overload_whose_batch_the_kv_cache_holds_names_the_cache():
    # 8B on one H100 with 18% of its memory: a KV cache of about 10,000 tokens holds a mean batch of 14 at
    # 30 req/s (0.22 of the memory serves the same load without overload).
    summary = simulate(load_scenario(None, {
        "model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
        "workload.arrival.rate": 30, "workload.num_requests": 500, "engine.gpu_memory_utilization": 0.18})).summary
    reason = summary["bottleneck_reason"]
    assert reason.startswith("overloaded")
    assert "its batch held by its KV cache of 10,040 tokens, 89% full on average, 120 preemptions" in reason
    assert "requests wait 86% of E2E for KV cache, the cache 89% full over the engine's time" in reason


def _queued(queue_ttft_s: float, slots: float = 0.5, kv: float = 0.5, pause: str = "") -> str:
    """The verdict on a run whose E2E is 10 s, 6 s of it queue, `queue_ttft_s` of that before the first step."""
    attribution = {"queue": 6.0, "compute": 3.0, "traffic": 0.5, "delivery": 0.5}
    evidence = replace(_evidence(memory=0.3, fixed=0.0), max_num_seqs=64, slots_held_fraction=slots,
                       kv_full_fraction=kv, prompts_pause_decodes=pause,
                       parts_s={"ttft": {"queue": queue_ttft_s, "compute": 0.1, "traffic": 0.0, "delivery": 0.05}})
    layer, reason = bottleneck(attribution, evidence)
    assert layer == "distribution"
    return reason


def test_a_queue_says_what_requests_wait_for():
    """Before the first step: a batch slot where the batch holds nearly every one, KV cache where it is
    nearly full, else the step in progress (not a slot: the default scenario's batch holds 16% of its
    slots); after it, the steps a running request sits out, as the prompt steps SGLang runs without the
    decodes."""
    assert _queued(6.0, slots=0.95).startswith("requests wait 60% of E2E for a batch slot, 95% of the engine's "
                                               "64 held over its time: the engine was busy 100%")
    assert _queued(6.0, kv=0.9).startswith("requests wait 60% of E2E for KV cache, the cache 90% full over the "
                                           "engine's time: ")
    assert _queued(4.5).startswith("requests wait 60% of E2E, 75% of it for their first step, behind the step in "
                                   "progress and the prompts ahead: ")
    pause = "SGLang's prompt steps run without the decodes (mixed_chunk off)"
    assert _queued(0.12, slots=0.95, pause=pause).startswith(
        f"requests wait 60% of E2E, 98% of it sitting out steps after their first token: {pause}, the engine was ")


def test_sglang_s_decodes_sit_out_its_prompt_steps_and_mixed_chunks_keep_them_in():
    sglang = {"engine.scheduler": "prefill-first", "workload.num_requests": 300}
    apart = simulate(load_scenario(None, sglang)).summary["bottleneck_reason"]
    assert apart.startswith("requests wait 53% of E2E, 98% of it sitting out steps after their first token: SGLang's "
                            "prompt steps run without the decodes (mixed_chunk off)")
    mixed = simulate(load_scenario(None, {**sglang, "engine.chunked_prefill": True, "engine.mixed_chunk": True}))
    assert "TTFT: requests wait 43% of TTFT for their first step, behind the step in progress" in \
        mixed.summary["bottleneck_reason"]
