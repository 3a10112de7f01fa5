"""simulate end to end: exact attribution, determinism, and answers we can work out by hand."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.compute.efficiency import EMBEDDING_PRECISION
from tokenpath.compute.precision import PRECISION_BYTES
from tokenpath.sim.document import result_document
from tokenpath.validate.groups import ENGINE_SIDE_DELIVERY


def small(**overrides):
    base = {"workload.num_requests": 60, "workload.arrival.rate": 20.0}
    return load_scenario("typical", {**base, **overrides})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.sampled_from([2.0, 30.0, 300.0, "inf"]),
    tp=st.sampled_from([2, 4, 8]),
    interval=st.integers(1, 4),
    detokenize=st.sampled_from(["engine", "api-server", "detokenizer"]),
    concurrency=st.one_of(st.none(), st.integers(1, 16)),
    seed=st.integers(0, 1000),
)
def test_queue_compute_traffic_delivery_sum_exactly_to_e2e(rate, tp, interval, detokenize, concurrency, seed):
    scenario = small(**{
        "workload.arrival.rate": rate, "deployment.tp": tp, "delivery.stream_interval": interval,
        "delivery.detokenize": detokenize, "workload.max_concurrency": concurrency, "seed": seed,
        "engine.max_num_seqs": 16, "engine.max_num_batched_tokens": 1024,
    })
    run = simulate(scenario).run
    parts = run.queue_ns + run.compute_ns + run.traffic_ns + run.delivery_ns
    assert np.array_equal(parts, run.e2e_ns)
    for part in (run.queue_ns, run.compute_ns, run.traffic_ns, run.delivery_ns):
        assert (part >= 0).all()
    assert (run.ttft_ns <= run.ttfv_ns).all() and (run.ttfv_ns <= run.e2e_ns).all()
    assert (run.compute_ns > 0).all() and (run.traffic_ns > 0).all()


def test_same_scenario_and_seed_give_byte_identical_json():
    texts = [json.dumps(result_document(simulate(small()))[0]) for _ in range(2)]
    assert texts[0] == texts[1]
    other = json.dumps(result_document(simulate(small(seed=1)))[0])
    assert other != texts[0]


def test_data_parallel_replicas_split_the_load():
    one = simulate(small(**{"deployment.chips": 8, "deployment.tp": 4, "workload.arrival.rate": "inf"}))
    assert one.deployment.replicas == 2
    assert len(one.traces) == 2
    assert sorted(len(t.sent_ns) for t in one.traces) == [30, 30]
    assert np.array_equal(one.run.queue_ns + one.run.compute_ns + one.run.traffic_ns + one.run.delivery_ns,
                          one.run.e2e_ns)


def _peak_outstanding(run) -> int:
    """The most requests sent and not yet answered at once."""
    events = sorted([(int(t), 1) for t in run.sent_ns] + [(int(t), -1) for t in run.sent_ns + run.e2e_ns],
                    key=lambda event: (event[0], event[1]))
    return int(np.max(np.cumsum([step for _, step in events])))


@pytest.mark.parametrize("routing", ["round_robin", "least_outstanding"])
@pytest.mark.parametrize("cap", [1, 3])
def test_a_concurrency_cap_holds_over_all_the_replicas(routing, cap):
    # One client's cap: a request is sent as one finishes on any replica, so 4 replicas never hold more
    # than the cap between them (round-robin once gave each replica a share of at least one)
    run = simulate(small(**{"deployment.chips": 16, "deployment.tp": 4, "workload.arrival.rate": "inf",
                            "workload.max_concurrency": cap, "deployment.routing": routing})).run
    assert _peak_outstanding(run) == cap


def test_session_affinity_under_a_cap_lets_one_replica_hold_the_whole_cap():
    """4 replicas, every prompt opening with the same shared prefix, so session affinity hashes all 40
    requests to one replica; the client's cap of 8 is its over every replica (a hash router counts nothing
    per replica), so that replica holds 8 at once, not the 2 of an even share of the cap (and a cap of 2,
    below the replica count, runs too)."""
    for cap in (8, 2):
        run = simulate(small(**{"deployment.chips": 16, "deployment.tp": 4, "workload.arrival.rate": "inf",
                                "workload.num_requests": 40, "workload.max_concurrency": cap,
                                "workload.shared_prefix.count": 1, "workload.shared_prefix.tokens": 64,
                                "deployment.routing": "session_affinity"})).run
        assert len(set(run.replica.tolist())) == 1
        assert _peak_outstanding(run) == cap


def test_the_requests_per_replica_are_the_measured_ones():
    """Round-robin over 4 replicas, requests 50 to 100 measured: 13, 12, 13 and 13 of them (with the
    warm-up, 26, 25, 25, 25)."""
    sim = simulate(small(**{"workload.num_requests": 101, "workload.warmup_requests": 50, "deployment.tp": 2}))
    routing = result_document(sim)[0]["routing"]
    assert routing["requests_per_replica"] == [13, 12, 13, 13]
    assert routing["imbalance"] == pytest.approx(13 / (51 / 4))


def test_the_requests_per_replica_count_a_replica_s_pipeline_batches_together():
    """2 replicas of pp = 2 (4 chips, tp 1), 20 requests round-robin over their 4 batches in flight: 10 for each
    replica, not 5 for each of 4 (it listed the batches as replicas)."""
    sim = simulate(small(**{"workload.num_requests": 20, "model.name": "llama-3.1-8b", "deployment.chips": 4,
                            "deployment.tp": 1, "deployment.pp": 2}))
    assert np.bincount(sim.run.replica).tolist() == [5, 5, 5, 5]  # (each request's engine)
    routing = result_document(sim)[0]["routing"]
    assert routing["requests_per_replica"] == [10, 10]
    assert routing["imbalance"] == 1.0


def _run_fields(run):
    return {name: getattr(run, name) for name in run.__dataclass_fields__ if isinstance(getattr(run, name), np.ndarray)}


@pytest.mark.parametrize("keep_tokens", [True, False])
def test_replicas_in_forked_workers_give_exactly_the_in_process_result(monkeypatch, keep_tokens):
    from tokenpath.sim import simulate as pipeline

    if not keep_tokens:  # per-worker ITL histograms, merged
        monkeypatch.setattr(pipeline, "KEEP_TOKENS_LIMIT", 0)
    scenario = small(**{"deployment.chips": 8, "deployment.tp": 2, "workload.num_requests": 90})
    serial = simulate(scenario, workers=1)
    reported = []
    forked = simulate(scenario, workers=3, progress=reported.append)
    assert forked.deployment.replicas == 4 and sum(reported) == 90
    serial_fields, forked_fields = _run_fields(serial.run), _run_fields(forked.run)
    assert serial_fields.keys() == forked_fields.keys() and "e2e_ns" in serial_fields
    for name, values in serial_fields.items():
        assert np.array_equal(values, forked_fields[name]), name
    if not keep_tokens:
        assert np.array_equal(serial.run.itl_histogram.counts, forked.run.itl_histogram.counts)
        assert serial.run.itl_histogram.counts.sum() > 0
    for a, b in zip(serial.traces, forked.traces):
        assert np.array_equal(a.step_start_ns, b.step_start_ns)


@pytest.mark.parametrize("workers, prefill_replicas", [(1, 0), (3, 0), (1, 1)])
def test_a_run_without_token_times_has_the_same_per_request_figures_and_no_token_data(workers, prefill_replicas):
    """`token_times=False` (validate's rows and calibrate's fit where they read TPOT): every per-request field
    as with token times, neither the tokens' times nor an ITL histogram (a caller asking for ITL is told so);
    served apart, in forked workers, or disaggregated."""
    scenario = small(**{"deployment.chips": 8, "deployment.tp": 2, "workload.num_requests": 90,
                        "deployment.prefill_replicas": prefill_replicas})
    full = simulate(scenario, workers=workers)
    lean = simulate(scenario, workers=workers, token_times=False)
    assert full.run.token_client_ns is not None and full.run.token_client_ns.size == full.run.output_tokens.sum()
    assert lean.run.token_client_ns is None and lean.run.itl_histogram is None
    full_fields, lean_fields = _run_fields(full.run), _run_fields(lean.run)
    del full_fields["token_client_ns"]
    assert full_fields.keys() == lean_fields.keys() and "ttft_ns" in lean_fields
    for name, values in full_fields.items():
        assert np.array_equal(values, lean_fields[name]), name
    with pytest.raises(ValueError, match="token times"):
        lean.run.itl_ns()


def test_an_error_in_a_forked_worker_reaches_the_caller():
    from tokenpath.sim.forked import map_forked

    def work(item, progress):
        if item == 2:
            raise ValueError(f"bad item {item}")
        progress(1)
        return item * 10

    assert map_forked(work, [0, 1, 3], workers=2) == [0, 10, 30]
    with pytest.raises(ValueError, match="bad item 2"):
        map_forked(work, [0, 1, 2, 3], workers=2)


def test_a_worker_killed_mid_run_becomes_a_one_line_error():
    """What the out-of-memory killer does to a worker: the caller gets a UserError naming --workers."""
    import os
    import signal

    from tokenpath.config.errors import UserError
    from tokenpath.sim.forked import map_forked

    def work(item, progress):
        if item == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return item

    with pytest.raises(UserError, match=r"^--workers: a worker process died .* --workers 1 ") as caught:
        map_forked(work, [0, 1, 2], workers=2)
    assert "\n" not in str(caught.value)


def test_batch_one_decode_step_is_the_weight_read_bound():
    scenario = load_scenario("typical", {
        "assumptions.kernel_fixed_s": 0.0, "assumptions.gemm_fixed_s": 0.0,  # the roofline alone, plus the host's time
        "model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1,
        "workload.num_requests": 1, "workload.input": {"kind": "fixed", "value": 16},
        "workload.output": {"kind": "fixed", "value": 101}, "delivery": ENGINE_SIDE_DELIVERY,
    })
    sim = simulate(scenario)
    trace = sim.traces[0]
    decode_s = trace.step_compute_ns[1:] / 1e9
    chip, model = sim.deployment.chip, sim.deployment.model
    # A decode step reads every weight once, except the input embedding table, of which it gathers
    # one row per token (kept at bf16, untied from the LM head in Llama-3.1-8B).
    embedding_bytes = model.vocab_size * model.hidden_size * PRECISION_BYTES[EMBEDDING_PRECISION]
    read_bytes = sim.deployment.compute.weight_bytes_per_chip - embedding_bytes
    bound_s = read_bytes / (chip.hbm_bw_Bps * chip.hbm_bw_efficiency)
    # weights dominate: the 117-token KV cache of one sequence adds well under 1%; vLLM's async scheduling
    # (0.14.0 on) prepares each step while the one before runs, so its host time hides behind the read
    assert sim.deployment.compute.host_overlapped and sim.deployment.compute.host_s(1) < bound_s
    assert np.allclose(decode_s, bound_s, rtol=0.01)
    assert sim.run.e2e_ns[0] / 1e9 == sum(trace.step_compute_ns) / 1e9


def _at_rate(rate):
    return result_document(simulate(load_scenario("typical", {"workload.num_requests": 400,
                                                              "workload.arrival.rate": rate})))[0]


def test_throughput_saturates_and_ttft_grows_with_load():
    low, mid, high, flood = (_at_rate(r) for r in (5.0, 20.0, 200.0, "inf"))
    tput = [d["throughput"]["output_tokens_per_s"] for d in (low, mid, high, flood)]
    ttft = [d["latency_s"]["ttft"]["p50"] for d in (low, mid, high, flood)]
    assert tput[0] < tput[1] < tput[2]
    assert abs(tput[3] / tput[2] - 1) < 0.1  # past saturation more load adds no throughput
    assert ttft[0] < ttft[2] < ttft[3]
    assert flood["attribution_s"]["queue"] > 10 * low["attribution_s"]["queue"]


def test_a_small_batch_limit_under_a_flood_makes_queueing_the_bottleneck():
    scenario = small(**{"workload.arrival.rate": "inf", "engine.max_num_seqs": 8})
    document, reason = result_document(simulate(scenario))
    # Overloaded first, with the layer that limits capacity; the wait for a batch slot after it.
    assert document["bottleneck"] == "compute" and document["load"]["overloaded"]
    assert reason.startswith("overloaded: offered all at once") and "requests wait" in reason


def test_a_recorded_trace_drives_arrivals_and_lengths(tmp_path):
    from tokenpath.workload import Requests, write_trace

    recorded = Requests(
        arrival_s=np.array([0.0, 0.25, 0.5, 2.0]),
        input_tokens=np.array([300, 1200, 80, 512]),
        output_tokens=np.array([20, 5, 64, 1]),
    )
    write_trace(recorded, tmp_path / "trace.csv", "azure")
    (tmp_path / "replay.toml").write_text(
        'name = "replay"\n[workload]\nnum_requests = 10\n[workload.trace]\npath = "trace.csv"\nformat = "azure"\n'
    )
    sim = simulate(load_scenario(str(tmp_path / "replay.toml")))
    assert list(sim.run.input_tokens) == [300, 1200, 80, 512]
    assert list(sim.run.output_tokens) == [20, 5, 64, 1]
    assert list(sim.run.scheduled_ns) == [0, 250_000_000, 500_000_000, 2_000_000_000]
    assert np.array_equal(sim.run.queue_ns + sim.run.compute_ns + sim.run.traffic_ns + sim.run.delivery_ns,
                          sim.run.e2e_ns)


def test_explain_breaks_a_steady_step_into_ops_that_add_up_to_its_compute_time():
    from tokenpath.report.explain import explain

    sim = simulate(small(**{"workload.num_requests": 200}))
    step = explain(sim)
    ops_s = sum(op["time_s"] for op in step["ops"]) + step["engine_host_s"]
    assert step["launch_s"] == 0.0  # the default engine replays CUDA graphs
    assert abs(ops_s - step["compute_s"]) <= 1e-9  # the step's compute time is rounded to whole ns
    assert step["shape"]["tokens"] >= step["shape"]["sequences"] >= step["shape"]["sampled"] > 0
    assert sim.deployment.costs.allreduces_per_step == 2 * sim.deployment.model.num_layers
    assert step["traffic_parts_s"]["tp_all_reduce"] > 0
    assert abs(sum(step["traffic_parts_s"].values()) - step["traffic_s"]) <= 1e-9
    assert {op["bound"] for op in step["ops"]} <= {"compute", "memory", "fixed"}


def test_explain_names_the_low_latency_all_to_alls_of_a_decode_step(capsys):
    from rich.console import Console

    from tokenpath.fabric.collectives import LOW_LATENCY_ALL_TO_ALL_S
    from tokenpath.report.explain import explain, explain_table

    sim = simulate(small(**{"model.name": "mixtral-8x7b", "model.precision": "bf16", "deployment.chips": 8,
                            "deployment.tp": 8, "deployment.expert_parallel": True,
                            "deployment.moe_all_to_all": True, "workload.num_requests": 100,
                            "workload.input": {"kind": "fixed", "value": 50},
                            "workload.output": {"kind": "fixed", "value": 400}}))
    step = explain(sim)
    assert step["decode_only"] and step["shape"]["tokens"] == step["shape"]["sampled"]
    # (the low-latency kernels send a copy of each token for each of its 2 experts)
    dep = sim.deployment
    copies_bytes = dep.compute.allreduce_bytes(step["shape"]["tokens"]) / 8 * 2
    plain = dep.collectives.costs("all_to_all", [list(range(8))], "direct")["Simple"].time_s(copies_bytes)
    assert step["traffic_parts_s"]["ep_all_to_all"] == pytest.approx(64 * (plain + LOW_LATENCY_ALL_TO_ALL_S), rel=1e-9)
    assert abs(sum(step["traffic_parts_s"].values()) - step["traffic_s"]) <= 1e-9
    Console(width=200).print(explain_table(step, "h200"))
    assert "expert all-to-alls (low-latency kernels," in capsys.readouterr().out


def test_explain_shows_a_prompt_chunks_cached_context_and_mla_decompressing_it(capsys):
    """A long DeepSeek prompt in chunks of 512: the typical step is a chunk after earlier ones, whose
    latents kv_b_proj decompresses with the chunk's own tokens."""
    from rich.console import Console

    from tokenpath.report.explain import explain, explain_table

    sim = simulate(small(**{"model.name": "deepseek-v3", "deployment.tp": 8, "workload.num_requests": 2,
                            "workload.input": {"kind": "fixed", "value": 6000},
                            "workload.output": {"kind": "fixed", "value": 2},
                            "engine.max_num_batched_tokens": 512, "engine.max_num_seqs": 8}))
    step = explain(sim)
    shape = step["shape"]
    assert shape["tokens"] == 512 and 0 < shape["chunk_context_tokens"] < 6000
    model = sim.deployment.model
    kv_b_params = model.kv_lora_rank * model.num_heads / 8 * (model.qk_nope_head_dim + model.v_head_dim)
    kv_b = next(op for op in step["ops"] if op["op"] == "kv_b_proj")
    assert kv_b["flops"] == pytest.approx(2 * kv_b_params * model.num_layers
                                          * (shape["tokens"] + shape["chunk_context_tokens"]))
    Console(width=250).print(explain_table(step, "h200"))
    assert f"{shape['chunk_context_tokens']:,} of them cached before its prompt chunks" in capsys.readouterr().out


@pytest.mark.parametrize("scheduler", ["prefill-first", "vllm-v0", "trtllm"])
def test_an_eager_engine_pays_its_kernel_launches_on_every_step(scheduler):
    """Each step of an eager engine is its kernels with their launch gaps, and it waits on the host's
    launches where they fall behind (engine/host_time.py, ComputeModel.launch_wait_s): SGLang's and vLLM
    V0's Python host launching the kernels ops.py counts, TensorRT-LLM's PyTorch backend its own fused
    ops' kernels (engine/eager_launches.py). A TensorRT engine launches from C++: eager_host = false."""
    from rich.console import Console

    from tokenpath.compute.efficiency import EAGER_KERNEL_LAUNCH_S
    from tokenpath.engine.eager_launches import TRTLLM_PYTORCH
    from tokenpath.engine.host_time import EAGER_HOST_PER_KERNEL_S, TRTLLM_EAGER_HOST_PER_KERNEL_S
    from tokenpath.report.explain import explain, explain_table

    # (no front-end time per request: the burst reaches the engine at once, whatever the steps' tokens cost it)
    same = {"workload.num_requests": 200, "workload.arrival.rate": "inf",
            "workload.input": {"kind": "fixed", "value": 100},
            "workload.output": {"kind": "fixed", "value": 20}, "engine.max_num_seqs": 200,
            "engine.scheduler": scheduler, "engine.host_overlap": False,
            "delivery.frontend_per_request": "0 s", "delivery.chat_template_per_request": "0 s",
            "delivery.tokenize_per_token": "0 s"}
    graphed = simulate(small(**same, **{"engine.cuda_graphs": "all", "engine.cuda_graph_max_tokens": 8192,
                                        "engine.cuda_graph_padding": True}))
    eager = simulate(small(**same, **{"engine.cuda_graphs": "none"}))
    compute = eager.deployment.compute
    kernels = (compute.kernels_per_step if scheduler != "trtllm" else
               TRTLLM_PYTORCH.per_step_kernels(compute.model, False))  # (the kernels its model code runs)
    assert compute.eager_gap_s == pytest.approx(kernels * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    per_kernel_s = TRTLLM_EAGER_HOST_PER_KERNEL_S if scheduler == "trtllm" else EAGER_HOST_PER_KERNEL_S
    assert compute.host_launch_s == pytest.approx(kernels * per_kernel_s, rel=1e-12)
    cpp = simulate(small(**same, **{"engine.cuda_graphs": "none", "engine.eager_host": False}))
    assert cpp.deployment.compute.host_launch_s == 0.0
    step = explain(eager)
    kernels_only_s = sum(op["time_s"] for op in step["ops"])
    gpu_s = kernels_only_s + compute.eager_gap_s + step["traffic_s"]
    waited_s = (max(gpu_s, compute.host_launch_s) + min(gpu_s, compute.host_launch_s) / compute.model.num_layers
                - gpu_s)
    assert step["launch_s"] == pytest.approx(compute.eager_gap_s + waited_s, rel=1e-9)
    assert waited_s > 0
    assert abs(kernels_only_s + step["engine_host_s"] + step["launch_s"] - step["compute_s"]) <= 1e-9
    assert step["launch_includes_host"]
    console = Console(width=250, record=True)
    console.print(explain_table(step, "h100"))
    lines = console.export_text().splitlines()
    launches = next(line for line in lines if "kernel launches" in line).split("│")
    host_row = next(line for line in lines if "engine host time" in line).split("│")
    assert ("vllm_v0_host_step_s" in host_row[7]) == (scheduler == "vllm-v0")
    assert launches[5].strip() == "host"
    assert launches[7].split(",")[-1].strip().rstrip("*") == (
        "trtllm_eager_host_per_kernel_s" if scheduler == "trtllm" else "eager_host_per_kernel_s")
    # Offline, fixed lengths: the same steps, each one's kernels longer by its launches
    g, e = graphed.traces[0], eager.traces[0]
    assert np.array_equal(g.step_tokens, e.step_tokens)
    launches_ns = [compute.launch_s(t, n, c / 1e9 - compute.host_s(n, bool(s)), x / 1e9) * 1e9
                   for t, n, c, x, s in zip(g.step_tokens, g.step_logits, g.step_compute_ns, g.step_traffic_ns,
                                            g.step_scheduled)]
    assert np.allclose(e.step_compute_ns - g.step_compute_ns, launches_ns, atol=4)


def test_an_overlapped_python_host_launches_each_step_while_the_gpu_runs_the_one_before():
    """SGLang's event_loop_overlap launches a busy engine's next batch while the GPU runs the current one:
    a busy engine's step's host is ahead of the GPU by what the step before left it (that step's time
    less its own host work: host_s and, eagerly, its launches), and an idle engine's first step starts
    with nothing launched. Prompts arriving at 5 requests/s into 20-token decodes run both ways (in a
    release whose prompt steps replay no graph)."""
    run = simulate(small(**{"workload.num_requests": 40, "workload.arrival.rate": 5.0,
                            "workload.input": {"kind": "fixed", "value": 300},
                            "workload.output": {"kind": "fixed", "value": 20},
                            "engine.scheduler": "prefill-first", "engine.version": "0.5.9",
                            "engine.cuda_graphs": "decode",
                            "deployment.tp": 4, "deployment.chips": 4}))
    compute, trace = run.deployment.compute, run.traces[0]
    assert compute.host_overlapped and compute.host_launch_s > 0
    steps = zip(trace.step_start_ns, trace.step_compute_ns, trace.step_traffic_ns, trace.step_blocking_ns,
                trace.step_tokens, trace.step_logits, trace.step_attn_pairs, trace.step_kv_read_tokens,
                trace.step_chunk_context_tokens, trace.step_scheduled, trace.step_ahead_ns)
    assert trace.step_ahead_ns[0] == 0
    end_ns, left_s, ahead_prompts = None, 0.0, 0
    for start, c, x, b, t, n, pairs, kv, chunk, scheduled, ahead in steps:
        if ahead:  # a busy engine's step, right after the one before (an idle engine's is 0)
            assert start == end_ns and ahead == round(left_s * 1e9)
        # within a nanosecond: the trace keeps `ahead` rounded to whole nanoseconds
        assert abs(c - compute.step_time_s(t, n, pairs, kv, chunk, bool(scheduled), x / 1e9, ahead / 1e9) * 1e9) <= 1
        if compute.eager(t, n) and ahead:
            ahead_prompts += 1
            assert c < compute.step_time_s(t, n, pairs, kv, chunk, bool(scheduled), x / 1e9) * 1e9
        left_s = max(0.0, (c + x) / 1e9 - compute.host_busy_s(t, n, bool(scheduled)))
        end_ns = start + c + x + b
    assert ahead_prompts > 5  # prompts that arrived while others decoded


def test_validate_predicts_the_published_rows_it_covers():
    from tokenpath.validate.groups import run_validation

    result = run_validation({"trtllm_batch1_ttft", "nccl_allreduce"})
    rows = result["rows"]
    assert len(rows) == 4 + 17
    for row in rows:
        assert row["predicted"] > 0
        assert row["error"] == row["predicted"] / row["published"] - 1
    calibrated = [r for r in rows if r.get("calibration")]
    assert len(calibrated) == 2 and all(abs(r["error"]) < 0.02 for r in calibrated)
    assert result["groups"]["nccl_allreduce"]["rows"] == 15
    # the batch-1 rows fit the launch gap: each is predicted with the value fitted on the other three
    assert all("eager_kernel_launch_s" in r["fitted_on_others"] for r in rows if r["group"] == "trtllm_batch1_ttft")
    assert result["groups"]["trtllm_batch1_ttft"]["fits"] == "eager_kernel_launch_s"
    # a published TTFT is never more than 3x off: a loose guard against a broken compute model
    assert all(abs(r["error"]) < 0.75 for r in rows if r["group"] == "trtllm_batch1_ttft")


@pytest.mark.parametrize("model, chip, tp, isl, osl, expected", [
    # 136 GB of KV cache / 2176 tokens x 64 KiB per token = 955 requests: rounded up to 128s; tokens at least 2048
    ("llama-3.1-8b", "h200", 1, 128, 2048, (1024, 2048)),
    # the same 955 requests at 1 + 2048/128 tokens each, rounded up to 1024s
    ("llama-3.1-8b", "h200", 1, 2048, 128, (1024, 16384)),
    # 214 requests: rounded up to 32s below 256
    ("llama-3.3-70b", "h200", 1, 128, 2048, (224, 2048)),
    # more than 4096 requests fit: capped
    ("llama-3.1-8b", "h100", 1, 128, 128, (4096, 8192)),
])
def test_trtllm_bench_picks_its_batch_limits_from_the_kv_cache_that_fits(model, chip, tp, isl, osl, expected):
    from tokenpath.validate.groups import trtllm_bench_limits

    row = {"model": model, "chip": chip, "tp": tp, "precision": "fp8", "input_tokens": isl, "output_tokens": osl}
    assert trtllm_bench_limits(row, 0.95) == expected


def test_validation_medians_stay_at_or_below_the_goal():
    """Guards the calibration: offline throughput within 10% and batch-1 TTFT within 15% (median
    |error| over the rows that set no constant; each row predicted with its group's constant fitted
    on the others). And the registry holds the fit of the serving GEMM fraction on all 28 offline rows,
    within a step of the fit's grid (its resolution): the fit on every row over the grid the held-out
    fits search, whose simulations the medians ran already."""
    import math

    from tokenpath.config.assumptions import lookup
    from tokenpath.validate.fit import fit
    from tokenpath.validate.groups import _fitted_errors, published_rows, run_validation

    groups = run_validation({"trtllm_offline", "trtllm_batch1_ttft"})["groups"]
    assert groups["trtllm_offline"]["median_abs_error"] <= 0.10
    # The offline rows fit the fraction of their GEMMs' measured shape rates a serving step reaches.
    assert groups["trtllm_offline"]["fits"] == "serving_gemm_fraction"
    assert groups["trtllm_batch1_ttft"]["rows"] == 4
    assert groups["trtllm_batch1_ttft"]["median_abs_error"] <= 0.15

    published, rows = published_rows()
    procedure, errors = _fitted_errors(published["trtllm_offline"],
                                       [r for r in rows if r["group"] == "trtllm_offline"])
    simulated = errors.simulated
    fitted = fit(procedure, range(len(errors.rows)), {}, errors, held_out=True)
    assert errors.simulated == simulated  # (the held-out fits' grid, every point simulated)
    assert fitted.rows == 28 and fitted.loss <= 0.05
    registry = lookup("serving_gemm_fraction").value
    assert abs(math.log(fitted.value / registry)) <= math.log(procedure.step) + 1e-9, (fitted.value, registry)


def test_a_row_of_a_group_that_fits_a_constant_is_predicted_with_the_value_fitted_on_the_others(monkeypatch):
    """Leave one row out: a row's own published figure does not move the value it is predicted with,
    and moves every other row's; the registry's value is the fit on every row."""
    from tokenpath.config.assumptions import lookup
    from tokenpath.validate import groups as module

    def held_out_values(published_rows):
        monkeypatch.setattr(module, "published_rows", published_rows)
        rows = module.run_validation({"trtllm_batch1_ttft"})["rows"]
        return [r["fitted_on_others"]["eager_kernel_launch_s"] for r in rows]

    shipped = module.published_rows
    before = held_out_values(shipped)

    def first_row_twice_as_slow():
        groups, rows = shipped()
        k = next(k for k, r in enumerate(rows) if r["group"] == "trtllm_batch1_ttft")
        rows[k] = {**rows[k], "published": rows[k]["published"] * 2}
        return groups, rows

    after = held_out_values(first_row_twice_as_slow)
    assert after[0] == before[0]
    # the 7B model's 128-token prompt, twice as slow, wants a longer gap on every fit it is part of
    assert all(a > b for a, b in zip(after[1:], before[1:]))
    monkeypatch.setattr(module, "published_rows", shipped)
    group, fitted = module.fit_group_constants({"trtllm_batch1_ttft"})["eager_kernel_launch_s"]
    assert group == "trtllm_batch1_ttft" and fitted.rows == 4
    assert fitted.value == pytest.approx(lookup("eager_kernel_launch_s").value, rel=1e-9)



def test_a_groups_held_out_fits_take_nothing_from_the_registry(monkeypatch):
    """The registry's launch gap is the fit on all four batch-1 rows, each held-out row's among them. The
    fits on the other three run their grid through the middle of the bounds instead (2-12 us: 4.90 us), so
    a registry value a third of a grid step away moves none of them."""
    from dataclasses import replace

    from tokenpath.config.assumptions import lookup
    from tokenpath.validate import groups as module

    shipped = module.GROUP_PROCEDURES["eager_kernel_launch_s"]

    def held_out_values(registry):
        monkeypatch.setitem(module.GROUP_PROCEDURES, "eager_kernel_launch_s", replace(shipped, center=registry))
        monkeypatch.setattr(module, "_FITTED_ERRORS", {})
        rows = module.run_validation({"trtllm_batch1_ttft"})["rows"]
        return [r["fitted_on_others"]["eager_kernel_launch_s"] for r in rows]

    registry = lookup("eager_kernel_launch_s").value
    values = held_out_values(registry)
    assert held_out_values(registry * 1.15 ** (1 / 3)) == values
    assert shipped.held_out_start() == pytest.approx(4.899e-6, rel=1e-3)
    grid = shipped.grid(shipped.held_out_start())
    assert all(any(v == pytest.approx(g, rel=1e-12) for g in grid) for v in values)

def test_validate_predicts_collectives_across_nodes_on_the_measured_topologies():
    from tokenpath.validate.groups import run_validation

    result = run_validation({"nccl_allreduce", "collectives_scaleout"})
    rows = {r.get("what"): r for r in result["rows"] if r["group"] == "collectives_scaleout"}
    assert len(rows) == 10
    # Multi-node all-reduce over RoCE (NCCL issue 1221): NCCL's rings, one channel per NIC, come out 13-15%
    # above what was measured, NVLSTree at its tuner's ceiling (8 channels x 57.7 GB/s of bus bandwidth) 7%
    # above; a single ring across the nodes would be 86% below.
    for what in ("all-reduce 2x8 H100, NVLS off", "all-reduce 4x8 H100, rings"):
        assert 0.10 < rows[what]["error"] < 0.20, what
    assert 0.05 < rows["all-reduce 2x8 H100, NVLS on"]["error"] < 0.10
    assert abs(rows["all-reduce, 2 NICs"]["error"]) < 0.01  # the calibration row
    # Intra-node all-to-all at NVLink efficiency: within 10% of DeepEP's dispatch and combine.
    assert abs(rows["EP8 dispatch (DeepEP)"]["error"]) < 0.10
    assert abs(rows["EP8 combine (DeepEP)"]["error"]) < 0.10
    # Large buffers: 8-GPU ring ~370 and NVLS ~480 GB/s, and NVLS on 2-7 GPUs, within 3%.
    single = [r for r in result["rows"] if r["group"] == "nccl_allreduce"]
    assert all(abs(r["error"]) < 0.03 for r in single if r["size_bytes"] > 1e9)
    # A prompt chunk's 16-64 MiB on 8 GPUs: NCCL's tuner constants bring the model within 10-30% of
    # AIConfigurator's measurements on Hopper and Ampere, short on every one; Blackwell's read 39-41% short.
    mid = {(r["chip"], r["size_bytes"]): r["error"] for r in single if r.get("unit") == "s" and r["size_bytes"] > 1e6}
    assert all(-0.30 < e < -0.10 for (chip, _), e in mid.items() if chip != "b200"), mid
    assert all(-0.45 < e < -0.35 for (chip, _), e in mid.items() if chip == "b200"), mid
    assert result["groups"]["collectives_scaleout"]["median_abs_error"] < 0.15


def test_deepep_low_latency_rows_within_the_latency_goal():
    """The low-latency kernels' fixed cost, set on the EP8 dispatch row, carries to combine and to
    EP256 over 32 nodes: every predicted row within 10%, the median within the 15% latency goal."""
    from tokenpath.validate.groups import run_validation

    result = run_validation({"deepep_low_latency"})
    rows = {r["what"]: r for r in result["rows"]}
    assert abs(rows["EP8 low-latency dispatch (DeepEP)"]["error"]) < 0.005  # the calibration row
    assert all(abs(r["error"]) < 0.10 for r in rows.values())
    assert result["groups"]["deepep_low_latency"]["rows"] == 3
    assert result["groups"]["deepep_low_latency"]["median_abs_error"] <= 0.15


def test_validate_runs_the_groups_asked_for_and_names_the_known_ones(monkeypatch, capsys):
    code, out, err = run_cli(["validate", "--group", "deepep_low_latency", "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    assert {r["group"] for r in document["rows"]} == {"deepep_low_latency"} and len(document["rows"]) == 4
    assert list(document["groups"]) == ["deepep_low_latency"]
    assert_user_error(*run_cli(["validate", "--group", "nccl"], monkeypatch, capsys),
                      "--group: unknown 'nccl'; use one of trtllm_offline,", "deepep_low_latency")


def test_the_2x8_h20_nvls_tree_latency_row_is_nvls_plus_two_network_steps():
    # As NCCL's tuner rates NVLSTree (tuning.cc): NVLS's 25 us and two network steps of 20.9 us, 66.8 us,
    # where a forced NVLSTree measured 47 us on tiny messages (a size the tuner never gives it).
    from tokenpath.validate.groups import run_validation

    rows = {r["what"]: r for r in run_validation({"collectives_scaleout"})["rows"]}
    assert rows["all-reduce 2x8 H20"]["predicted"] == pytest.approx(66.8e-6, rel=1e-4)  # and 512 B of bytes
    assert rows["all-reduce 2x8 H20"]["error"] == pytest.approx(66.8 / 47 - 1, rel=1e-3)


@pytest.mark.parametrize("overrides", [
    {},
    # The warm-up's gaps are left out of the histogram as out of the kept token times: on one replica, on
    # four (each holding some of the warm-up), and with the tokens made on decode replicas.
    {"workload.warmup_requests": 75},
    {"workload.warmup_requests": 75, "deployment.tp": 2},
    {"workload.warmup_requests": 75, "deployment.tp": 4, "deployment.prefill_replicas": 1},
])
def test_large_run_mode_matches_the_full_run_except_itl_within_a_tenth_of_a_percent(monkeypatch, overrides):
    from tokenpath.sim import served
    from tokenpath.sim import simulate as pipeline

    scenario = small(**{"workload.num_requests": 150, "delivery.stream_interval": 2, **overrides})
    full = result_document(simulate(scenario))[0]
    monkeypatch.setattr(pipeline, "KEEP_TOKENS_LIMIT", 0)
    monkeypatch.setattr(served, "CHUNK_TOKENS", 1000)  # many chunks
    sim = simulate(scenario)
    assert sim.run.token_client_ns is None
    bounded = result_document(sim)[0]
    itl_full, itl_bounded = full["latency_s"].pop("itl"), bounded["latency_s"].pop("itl")
    assert bounded == full
    assert itl_bounded["mean"] == pytest.approx(itl_full["mean"], rel=1e-12)
    for key in ("p50", "p90", "p99", "p999"):
        assert itl_bounded[key] == pytest.approx(itl_full[key], rel=1.5e-3)


def test_ttft_ends_at_the_client_so_tpot_matches_the_gaps_between_tokens():
    # One request at a time, a client a second away: TTFT holds the upload and the trip back (half a
    # round trip each), so TPOT is the steady gap between tokens, as a client measures it.
    scenario = load_scenario("typical", {
        "model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
        "workload.num_requests": 5, "workload.max_concurrency": 1, "delivery.network_rtt": "1000 ms",
    })
    run = simulate(scenario).run
    ttft_s, engine_s = run.ttft_ns / 1e9, run.ttft_engine_ns / 1e9
    assert ttft_s - engine_s == pytest.approx(np.full(5, 0.5), abs=2e-3)   # the trip back to the client
    assert (engine_s > 0.5).all() and (engine_s < 0.55).all()               # the upload, then the prefill
    tpot = (run.e2e_ns - run.ttft_ns) / (run.output_tokens - 1)
    gaps = np.diff(run.token_client_ns[run.token_offsets[0]:run.token_offsets[1]])
    assert tpot[0] == pytest.approx(gaps.mean(), rel=1e-6)
    assert tpot[0] < 10e6  # a few ms per token, not a share of the round trip


@pytest.mark.parametrize("engine", [
    {"engine.scheduler": "prefill-first"},
    {"engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 8, "delivery.stream_interval": 3},
    {"engine.scheduler": "trtllm"},
    {"engine.scheduler": "trtllm", "engine.kv_admission": "on_demand", "engine.chunked_prefill": False},
])
def test_every_scheduler_profile_keeps_the_attribution_exact(engine):
    scenario = small(**{"workload.arrival.rate": 300.0, "engine.max_num_seqs": 16,
                        "engine.max_num_batched_tokens": 2048, "delivery.detokenize": "detokenizer", **engine})
    run = simulate(scenario).run
    assert np.array_equal(run.queue_ns + run.compute_ns + run.traffic_ns + run.delivery_ns, run.e2e_ns)
    for part in (run.queue_ns, run.compute_ns, run.traffic_ns, run.delivery_ns):
        assert (part >= 0).all()


def test_multi_step_tokens_reach_the_client_in_bursts():
    # Tokens that leave together arrive together, as one text arrival: with windows of 8 a client sees
    # about one gap per 8 tokens (plus each request's first); with vLLM V1, a gap per token.
    def arrivals_per_token(**engine):
        run = simulate(small(**{"workload.num_requests": 20, **engine})).run
        return len(run.itl_ns()) / int((run.output_tokens - 1).sum())

    assert arrivals_per_token(**{"engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 8}) < 0.2
    assert arrivals_per_token() > 0.95


def test_explain_of_a_run_of_two_steps_takes_one_of_them():
    from tokenpath.report.explain import steady_step

    # Two requests of one output token each: two steps, and the middle half (25th to 75th percentile)
    # of two start times holds neither of them.
    sim = simulate(small(**{"workload.num_requests": 2, "workload.arrival.rate": "inf",
                            "workload.output": {"kind": "fixed", "value": 1}}))
    assert len(sim.traces[0].step_start_ns) == 2
    assert steady_step(sim) in range(len(sim.traces[0].step_start_ns))


def test_without_chunked_prefill_a_step_must_hold_a_whole_prompt_or_recompute():
    """Without chunked prefill a prompt runs in one step; where a sequence can be preempted (on-demand
    KV) its recompute of prompt and output does too, and with reserved KV (TensorRT-LLM's
    GUARANTEED_NO_EVICT) nothing is preempted, so the prompt alone must fit."""
    from tokenpath.config.errors import UserError
    from tokenpath.sim.simulate import prepare

    lengths = {"workload.num_requests": 4, "workload.input": {"kind": "fixed", "value": 1024},
               "workload.output": {"kind": "fixed", "value": 1024}, "engine.chunked_prefill": False,
               "engine.max_num_batched_tokens": 1664, "engine.max_num_seqs": 128}
    prepare(load_scenario("typical", {**lengths, "engine.scheduler": "trtllm"}))  # 1,024 <= 1,664
    with pytest.raises(UserError, match=r"^engine\.max_num_batched_tokens: request 0 needs 2048 tokens in one step "
                                        r"without chunked prefill; enable engine\.chunked_prefill"):
        prepare(load_scenario("typical", {**lengths, "engine.scheduler": "trtllm", "engine.kv_admission": "on_demand"}))
    with pytest.raises(UserError, match=r"needs 1024 tokens in one step"):
        prepare(load_scenario("typical", {**lengths, "engine.scheduler": "trtllm",
                                          "engine.max_num_batched_tokens": 1000}))
    # SGLang runs a prompt above its cap alone, as its step's first (Profile.long_prompt_alone)
    prepare(load_scenario("typical", {**lengths, "engine.scheduler": "prefill-first",
                                      "engine.max_num_batched_tokens": 1000}))


def test_a_request_whose_reserved_blocks_exceed_the_cache_is_a_one_line_error():
    from tokenpath.config.errors import UserError
    from tokenpath.sim.simulate import prepare

    # Llama-3.1-8B at bf16 on one H100, under TensorRT-LLM at 10% of the memory the weights and a step leave,
    # holds 51,021 tokens of KV cache: 3,188 whole blocks of 16. A request of all 51,021 tokens would fit token
    # by token, but TensorRT-LLM reserves whole blocks for its whole cache: 3,189 of them, where 3,188 hold
    # 51,008 tokens.
    base = {"model.name": "llama-3.1-8b", "model.precision": "bf16", "deployment.chip": "h100",
            "deployment.chips": 1, "deployment.tp": 1, "engine.gpu_memory_utilization": 0.1,
            "engine.scheduler": "trtllm", "workload.num_requests": 2,
            "workload.input": {"kind": "fixed", "value": 50_546}, "workload.output": {"kind": "fixed", "value": 475}}
    short = {**base, "workload.input": {"kind": "fixed", "value": 1_000}}
    assert prepare(load_scenario("typical", short)).deployment.kv_capacity_tokens == 51_021
    with pytest.raises(UserError, match=r"^workload: request 0 needs 51021 tokens of KV cache but one replica holds "
                                        r"requests of at most 51008;"):
        prepare(load_scenario("typical", base))
