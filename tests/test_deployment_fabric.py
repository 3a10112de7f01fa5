"""The engine's traffic on real topologies: TP, DP, PP and EP groups placed on the fabric."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.config.errors import UserError
from tokenpath.engine.costs import GroupStepCosts, distinct_ranks_per_token
from tokenpath.engine.placement import place
from tokenpath.fabric.collectives import LOW_LATENCY_ALL_TO_ALL_S
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.summary import LAYERS, summarize


def scenario(**overrides):
    base = {"workload.num_requests": 400}
    return load_scenario("typical", {**base, **overrides})


def shares(s) -> dict[str, float]:
    attribution = summarize(simulate(s).run, s.name, "", {})["attribution_s"]
    total = sum(attribution[part] for part in LAYERS)
    return {part: attribution[part] / total for part in LAYERS}


def test_moving_from_an_nvswitch_domain_to_a_2d_torus_raises_the_traffic_share():
    # The same 8 H200s at TP8: one NVSwitch (450 GB/s per chip into the switch, NVLS) versus a 2x4
    # torus whose four ports per chip share the same 450 GB/s (112.5 GB/s per link).
    # docs/model.md quotes these figures: 35% and 39% of E2E in traffic, queueing under 2% on both.
    switch = shares(scenario())
    torus = shares(scenario(**{"deployment.fabric": {"kind": "torus", "dims": [2, 4]}}))
    assert round(switch["traffic"], 2) == 0.35 and round(torus["traffic"], 2) == 0.39
    assert switch["queue"] < 0.02 and torus["queue"] < 0.02
    assert torus["compute"] < switch["compute"]


def test_torus_step_traffic_is_the_bucket_all_reduce_on_its_links():
    dep = build_deployment(scenario(**{"deployment.fabric": {"kind": "torus", "dims": [2, 4]}}))
    tokens = 512
    size = dep.compute.allreduce_bytes(tokens)  # 512 tokens x 8192 x 2 B
    groups = dep.placement.tp_groups()
    assert groups == [list(range(8))]
    per_all_reduce = dep.collectives.time_s("all_reduce", size, groups)
    assert dep.collectives.choose("all_reduce", size, groups) == "bucket"
    assert dep.costs.traffic_s(tokens, False) == pytest.approx(160 * per_all_reduce, rel=1e-12)


def test_spreading_tensor_parallel_groups_over_nodes_moves_their_traffic_onto_the_nics():
    packed = build_deployment(scenario(**{"deployment.chips": 32, "deployment.fabric": "h100-4x8-rail"}))
    spread = build_deployment(scenario(**{"deployment.chips": 32, "deployment.fabric": "h100-4x8-rail",
                                          "deployment.placement": "spread"}))
    assert packed.placement.tp_groups()[1] == list(range(8, 16))
    assert spread.placement.tp_groups()[1] == [1, 5, 9, 13, 17, 21, 25, 29]  # two ranks on each node
    tokens = 4096
    # Packed groups stay inside their NVSwitch node: NVLS, algbw 274 GB/s. Spread groups must cross
    # 50 GB/s NICs (47 GB/s achieved): several times slower per step.
    assert spread.costs.traffic_s(tokens, False) > 4 * packed.costs.traffic_s(tokens, False)


def test_data_parallel_groups_that_share_links_slow_each_other_down():
    # Two TP4 replicas on a line of 8 chips. Packed, each group has its own four chips and links;
    # spread (0,2,4,6 and 1,3,5,7), both rings cross the same links.
    line = {"kind": "mesh", "dims": [8], "link_bw": "100 GB/s"}
    common = {"deployment.tp": 4, "deployment.fabric": line, "deployment.fabric.algorithm": "ring"}
    packed = build_deployment(scenario(**common))
    spread = build_deployment(scenario(**common, **{"deployment.placement": "spread"}))
    alone = spread.collectives.cost("all_reduce", spread.placement.tp_groups()[:1])
    together = spread.collectives.cost("all_reduce", spread.placement.tp_groups())
    assert together.beta_s_per_byte > alone.beta_s_per_byte
    assert spread.costs.traffic_s(1000, False) > packed.costs.traffic_s(1000, False)
    one_packed = packed.collectives.cost("all_reduce", packed.placement.tp_groups()[:1])
    both_packed = packed.collectives.cost("all_reduce", packed.placement.tp_groups())
    assert both_packed.beta_s_per_byte == one_packed.beta_s_per_byte


def test_pipeline_stages_hand_off_the_hidden_state_and_residual_and_divide_the_memory():
    one = build_deployment(scenario(**{"deployment.chips": 8, "deployment.tp": 4}))
    two = build_deployment(scenario(**{"deployment.chips": 8, "deployment.tp": 4, "deployment.pp": 2}))
    assert one.replicas == 2 and two.replicas == 2  # 2 DP replicas, or 1 replica with 2 batches in flight
    assert two.compute.weight_bytes_per_chip == pytest.approx(one.compute.weight_bytes_per_chip / 2)
    # Each in-flight batch gets half of a replica whose chips each hold half the layers' KV.
    assert two.kv_capacity_tokens > one.kv_capacity_tokens
    parts = two.costs.traffic_parts_s(100)
    assert parts["pp_send_recv"] > 0
    # the hidden states and the residual of 100 tokens, each TP rank a quarter (engine/costs.py, PP_HANDOFF_TENSORS)
    handoff = two.collectives.time_s("send_recv", 2 * 100 * 8192 * 2 / 4, two.placement.stage_handoffs(0))
    assert parts["pp_send_recv"] == pytest.approx(handoff, rel=1e-12)
    assert two.placement.stage_handoffs(0)[0] == [0, 4]


def test_a_layer_count_pp_does_not_divide_splits_as_each_engine_splits_it():
    # vLLM gives the remainder to the stages before the last (which holds the LM head), SGLang to the
    # last ones, TensorRT-LLM to the first ones: 126 layers over 4 stages, 31-32-32-31, 31-31-32-32 and
    # 32-32-31-31; 61 over 2, 31-30, 30-31 and 31-30.
    from tokenpath.compute.roofline import pipeline_stage_layers

    assert pipeline_stage_layers(126, 4) == [31, 32, 32, 31]
    assert pipeline_stage_layers(126, 4, "last") == [31, 31, 32, 32]
    assert pipeline_stage_layers(126, 4, "first") == [32, 32, 31, 31]
    assert pipeline_stage_layers(61, 2) == [31, 30] and pipeline_stage_layers(61, 2, "last") == [30, 31]
    assert pipeline_stage_layers(61, 2, "first") == [31, 30]
    assert pipeline_stage_layers(80, 4) == [20] * 4
    # Llama 3.1 8B's 32 layers over 3 chips: the largest stage holds 11 layers' KV, and runs.
    dep = build_deployment(scenario(**{"deployment.tp": 1, "deployment.pp": 3, "deployment.chips": 3,
                                       "model.name": "llama-3.1-8b"}))
    whole = build_deployment(scenario(**{"deployment.tp": 1, "deployment.chips": 1, "model.name": "llama-3.1-8b"}))
    assert dep.compute.kv_bytes_per_token_per_chip == pytest.approx(whole.compute.kv_bytes_per_token_per_chip * 11 / 32)


@pytest.mark.parametrize(("scheduler", "heaviest_layers"), [("vllm-v1", 5), ("trtllm", 6)])
def test_tensorrt_llm_s_first_stage_holds_the_odd_layer_and_the_embedding(scheduler, heaviest_layers):
    # Llama 3.2 1B's 16 layers over 3 stages: vLLM's 5-6-5 leaves the odd layer on a stage without an end
    # of the model, TensorRT-LLM's 6-5-5 puts it beside the embedding: 6 layers and the embedding a chip.
    from tokenpath.compute.roofline import ComputeModel

    overrides = {"model.name": "llama-3.2-1b", "model.precision": "bf16", "deployment.chips": 3, "deployment.tp": 1,
                 "deployment.pp": 3, "engine.scheduler": scheduler}
    staged = build_deployment(scenario(**overrides)).compute
    whole = ComputeModel(staged.model, staged.chip, 1, "bf16", "bf16")
    ends = {op.name: op.resident_bytes for op in whole.ops if op.name in ("embedding", "lm_head")}
    per_layer = (whole.weight_bytes_per_chip - sum(ends.values())) / 16
    assert staged.weight_bytes_per_chip == pytest.approx(heaviest_layers * per_layer + ends["embedding"], rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3.1-70b", "llama-3.2-1b"])
def test_the_largest_pipeline_stage_holds_a_whole_end_of_the_model(model):
    # The first stage holds the embedding, the last the LM head (a tied one as a copy of the embedding):
    # a chip of the largest stage holds a pp-th of the layers and the larger end, not a pp-th of both.
    from tokenpath.compute.chip import load_chip
    from tokenpath.compute.model import load_model
    from tokenpath.compute.roofline import ComputeModel

    spec, chip = load_model(model), load_chip("h100")
    one, four = (ComputeModel(spec, chip, 1, "bf16", "bf16", pp=pp) for pp in (1, 4))
    ends = {op.name: op.resident_bytes for op in one.ops if op.name in ("embedding", "lm_head")}
    table = ends["embedding"]
    assert ends["lm_head"] == (0.0 if spec.tie_word_embeddings else table)
    layers = one.weight_bytes_per_chip - sum(ends.values())
    assert four.weight_bytes_per_chip == pytest.approx(layers / 4 + table)


@pytest.mark.parametrize("scheduler, per_batch", [("vllm-v1", 4), ("trtllm", 4), ("prefill-first", 4),
                                                   ("vllm-v0", 8)])
def test_one_scheduler_caps_the_running_requests_over_its_batches_in_flight(scheduler, per_batch):
    # vLLM V1, SGLang and TensorRT-LLM count every running request against max_num_seqs, those of the
    # other batch in flight too: a pp-th a batch. vLLM V0's virtual engines each take the whole cap.
    overrides = {"deployment.chips": 8, "deployment.tp": 4, "deployment.pp": 2, "engine.scheduler": scheduler,
                 "engine.max_num_seqs": 8}
    if scheduler == "vllm-v0":
        overrides["engine.chunked_prefill"] = False
    assert build_deployment(scenario(**overrides)).engine.max_num_seqs == per_batch


def test_sglang_sets_its_running_requests_from_the_replicas_whole_pool_then_splits_them():
    # SGLang's default from the pool the pp batches share (4,096 for this one), then // pp_size.
    two = build_deployment(scenario(**{"deployment.chips": 8, "deployment.tp": 4, "deployment.pp": 2,
                                       "engine.scheduler": "prefill-first"}))
    assert two.engine.max_num_seqs == 2048


def test_expert_parallel_keeps_each_moe_layers_all_reduce_unless_all_to_all():
    """The engines' default under expert parallel (vLLM's allgather_reducescatter, SGLang's --moe-a2a-backend
    none, TensorRT-LLM on one NVLink domain): each MoE layer gathers the hidden states over the experts' chips
    and reduce-scatters them after, the all-reduce the layer has anyway, decode steps or not."""
    moe = {"model.name": "mixtral-8x7b", "model.precision": "bf16", "deployment.chips": 8}
    one = build_deployment(scenario(**moe, **{"deployment.tp": 8, "deployment.expert_parallel": True}))
    four = build_deployment(scenario(**moe, **{"deployment.tp": 2, "deployment.expert_parallel": True,
                                               "engine.scheduler": "prefill-first"}))
    for dep in (one, four):
        assert (dep.costs.allreduces_per_step, dep.costs.all_to_alls_per_step) == (64, 0)
        assert dep.costs.traffic_s(256, True) == dep.costs.traffic_s(256, False)  # no low-latency kernels


@pytest.mark.parametrize("overrides, message", [
    ({"deployment.moe_all_to_all": True}, "deployment.moe_all_to_all: all-to-all dispatch needs the experts spread "
                                          "over the chips; set deployment.expert_parallel = true"),
    ({"deployment.moe_all_to_all": True, "deployment.expert_parallel": True, "engine.scheduler": "trtllm"},
     "deployment.moe_all_to_all: TensorRT-LLM dispatches with all-to-all only over more expert ranks than a "
     "token's 8 experts (8 here)"),
    # vLLM's data-parallel engines that share their experts step together: attention data-parallel, not replicas
    ({"deployment.expert_parallel": True, "deployment.tp": 1},
     "deployment.expert_parallel: the data-parallel engines of one vLLM V1 server share their experts and step "
     "together, which tokenpath models as attention data-parallel ranks of one chip each: set deployment.tp = 8 "
     "and deployment.attention_dp = true, or expert_parallel = false")])
def test_expert_parallel_is_refused_where_the_engine_would_not_run_it_so(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        build_deployment(scenario(**{"model.name": "deepseek-v3", **overrides}))


@pytest.mark.parametrize("scheduler, engine", [("prefill-first", "SGLang"), ("trtllm", "TensorRT-LLM")])
def test_expert_parallel_over_ranks_that_do_not_divide_the_experts_is_refused_where_the_engine_asserts(
        scheduler, engine, monkeypatch, capsys):
    """SGLang's FusedMoE and TensorRT-LLM's MoE place num_experts // ep_size experts on each rank and assert that
    it divides them: Mixtral's 8 experts over 16 chips would not launch (vLLM gives 8 of them one each)."""
    mixtral = ["--model", "mixtral-8x7b", "--precision", "bf16", "--chip", "h100", "--chips", "16", "--tp", "16",
               "--set", "deployment.expert_parallel=true", "--num-requests", "4"]
    code, out, err = run_cli(["simulate", *mixtral, "--scheduler", scheduler], monkeypatch, capsys)
    assert_user_error(code, out, err, f"deployment.expert_parallel: {engine} places the same number of experts on "
                      "every expert-parallel rank, so the ranks must divide the model's 8 routed experts (16 here); "
                      "set deployment.tp to one that divides them (2, 4 or 8), or expert_parallel = false")
    vllm = build_deployment(scenario(**{"model.name": "mixtral-8x7b", "model.precision": "bf16",
                                        "deployment.chip": "h100", "deployment.chips": 16, "deployment.tp": 16,
                                        "deployment.expert_parallel": True}))
    assert vllm.compute.weight_bytes_per_chip > 0


def test_all_to_alls_replace_the_moe_all_reduces_within_each_replica():
    s = scenario(**{"model.name": "mixtral-8x7b", "model.precision": "bf16", "deployment.chips": 8,
                    "deployment.tp": 2, "deployment.expert_parallel": True, "deployment.moe_all_to_all": True,
                    "engine.scheduler": "prefill-first"})
    dep = build_deployment(s)
    # 32 layers, all MoE: attention all-reduces stay (32), MoE all-reduces become dispatch + combine.
    assert dep.costs.allreduces_per_step == 32
    assert dep.costs.all_to_alls_per_step == 64
    parts = dep.costs.traffic_parts_s(256)
    # Tokens split over 2 TP ranks; a prompt step's kernels send each token once to each rank holding one of
    # its 2 experts: both ranks unless both experts are on one, 1 - 2 x C(4, 2) / C(8, 2) of the time.
    per_token = dep.compute.allreduce_bytes(256) / 2
    ranks = 2 * (1 - 6 / 28)
    replicas = [[0, 1], [2, 3], [4, 5], [6, 7]]  # each replica's experts over its own chips, all at once
    assert parts["ep_all_to_all"] == pytest.approx(
        64 * dep.collectives.time_s("all_to_all", per_token * ranks, replicas), rel=1e-12)
    # A decode-only step runs them with the low-latency kernels: a copy for each expert, and each call pays
    # their fixed cost too.
    decode = dep.costs.traffic_parts_s(256, decode_only=True)
    direct = dep.collectives.costs("all_to_all", replicas, "direct")["Simple"]
    assert decode["ep_all_to_all"] == pytest.approx(
        64 * (direct.time_s(per_token * 2) + LOW_LATENCY_ALL_TO_ALL_S), rel=1e-9)
    assert decode["tp_all_reduce"] == parts["tp_all_reduce"]
    assert dep.costs.traffic_s(256, True) == pytest.approx(sum(decode.values()), rel=1e-12)


def test_a_prompt_step_s_dispatch_sends_a_token_once_to_each_rank_holding_its_experts():
    # DeepSeek-V3's 8 of 256 experts over 8 ranks, 32 on each: a rank is missed with C(224, 8) / C(256, 8).
    missed = math.comb(224, 8) / math.comb(256, 8)
    assert distinct_ranks_per_token(256, 8, 8) == pytest.approx(8 * (1 - missed), rel=1e-12)
    assert distinct_ranks_per_token(256, 8, 8) == pytest.approx(5.29, abs=0.01)
    assert distinct_ranks_per_token(256, 8, 1) == 1.0  # one rank holds them all
    assert distinct_ranks_per_token(8, 8, 4) == pytest.approx(4.0)  # every expert: every rank


def test_wide_expert_parallel_fits_a_model_tensor_parallel_alone_does_not():
    """DeepSeek-V3 on 4 x 8 H100 does not fit as replicas of TP8; as vLLM's 32 data-parallel engines of one chip
    sharing their experts (attention data-parallel over the 32 with expert parallel), each chip holds 1/32 of
    the routed experts and every other layer whole."""
    base = {"model.name": "deepseek-v3", "model.precision": "fp8", "deployment.chip": "h100",
            "deployment.chips": 32, "deployment.tp": 8, "deployment.fabric": "h100-4x8-rail"}
    with pytest.raises(UserError, match=r"79.5 GiB of weights per chip at fp8, tp=8, pp=1\) does not fit"):
        build_deployment(scenario(**base))
    dep = build_deployment(scenario(**{**base, "deployment.tp": 32, "deployment.attention_dp": True,
                                       "deployment.expert_parallel": True}))
    ops = {op.name: op for op in dep.compute.ops}
    from tokenpath.compute.chip import load_chip
    from tokenpath.compute.model import load_model
    from tokenpath.compute.roofline import ComputeModel

    tp8 = {op.name: op for op in ComputeModel(load_model("deepseek-v3"), load_chip("h100"), 8, "fp8", "bf16").ops}
    assert ops["moe_experts"].resident_bytes == pytest.approx(tp8["moe_experts"].resident_bytes / 4)
    # 19.0 GiB of experts, 12.5 of attention (1.9 of it MLA's absorbed weights in bf16), 3.5 of bf16 embedding
    # and LM head, 2.4 of shared experts, 1.1 of dense MLPs and the rest (router, norms)
    assert dep.compute.weight_bytes_per_chip / 2**30 == pytest.approx(38.71, abs=0.01)


def test_without_expert_parallel_decode_only_steps_cost_the_same_traffic():
    dep = build_deployment(scenario(**{"deployment.chips": 8, "deployment.tp": 8}))
    assert dep.costs.traffic_s(64, True) == dep.costs.traffic_s(64, False) > 0


@pytest.mark.parametrize("overrides, fragment", [
    ({"deployment.chips": 16, "deployment.fabric": "dgx-h100"}, "16 chips do not fit the fabric's 8 hosts"),
    ({"deployment.placement": [0, 1, 2]}, "deployment.placement: give one host per chip (8)"),
    ({"deployment.placement": [0, 1, 2, 3, 4, 5, 6, 6]}, "a host appears twice"),
    ({"deployment.placement": [0, 1, 2, 3, 4, 5, 6, 9]}, "hosts must be in 0..7, got 9"),
    ({"deployment.pp": 3}, "deployment.tp: tp*pp = 24 is larger than deployment.chips (8)"),
    ({"deployment.tp": 4, "deployment.chips": 12, "deployment.pp": 2},
     "deployment.chips: 12 chips do not split into replicas of tp*pp=8"),
    ({"deployment.expert_parallel": True}, "has no experts"),
    ({"deployment.fabric": {"kind": "fattree", "k": 4}}, "fabric.link_bw: a fattree network needs"),
    ({"deployment.fabric": "dgx-h1000"}, "deployment.fabric: unknown preset 'dgx-h1000'; use one of dgx-h100"),
])
def test_impossible_deployments_are_one_line_errors(overrides, fragment):
    with pytest.raises(UserError) as error:
        build_deployment(scenario(**overrides))
    assert fragment in str(error.value)
    assert "\n" not in str(error.value)


def test_spread_placement_interleaves_groups():
    placement = place("spread", replicas=2, pp=1, tp=4, fabric_hosts=8)
    assert placement.tp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    explicit = place([7, 6, 5, 4, 3, 2, 1, 0], replicas=2, pp=1, tp=4, fabric_hosts=8)
    assert explicit.tp_groups() == [[7, 6, 5, 4], [3, 2, 1, 0]]


# -- disaggregated serving: prefill replicas hand the KV cache to decode replicas ----------------------

def pd_scenario(**overrides):
    return scenario(**{"deployment.chips": 16, "deployment.prefill_replicas": 1, **overrides})


def test_disaggregated_requests_split_exactly_into_queue_compute_traffic_delivery():
    sim = simulate(pd_scenario())
    run = sim.run
    parts = run.queue_ns + run.compute_ns + run.traffic_ns + run.delivery_ns
    assert np.array_equal(parts, run.e2e_ns)
    assert (run.queue_ns >= 0).all()
    assert len(sim.traces) == 2  # one prefill engine, one decode engine
    # The prefill engine ran one token per request (dropped); the decode engine made every token the client got.
    assert sim.traces[0].token_offsets[-1] == len(run.e2e_ns)
    assert sim.traces[1].token_offsets[-1] == int(run.output_tokens.sum())
    # Delivery splits as a single engine's does: the network both ways, the front end's queue and work (the
    # request's at the prefill replica, its tokens' at the decode one) and the engine's host time.
    detail = run.network_ns + run.frontend_queue_ns + run.frontend_work_ns + run.engine_host_ns
    assert np.array_equal(detail, run.delivery_ns) and (run.engine_host_ns >= 0).all()
    assert (run.network_ns > 0).all() and (run.frontend_work_ns > 0).all()


def test_the_first_token_reaches_the_client_from_the_decode_replica_after_the_kv_transfer(monkeypatch):
    # As vLLM's and SGLang's disaggregated servers stream it: a transfer of 0.5 s delays every first token
    # by at least that, one-token requests included (their KV moves too, and their token leaves from decode).
    workload = {"workload.num_requests": 60, "workload.output": {"kind": "uniform", "mean": 2, "range_ratio": 0.5}}
    fast = simulate(pd_scenario(**workload)).run
    assert (fast.ttft_ns < 0.2e9).all()
    monkeypatch.setattr(GroupStepCosts, "kv_transfer_s", lambda self, tokens, src, dst: 0.5)
    sim = simulate(pd_scenario(**workload))
    run = sim.run
    assert (run.output_tokens == 1).any()
    assert (run.ttft_ns >= 0.5e9).all()
    assert np.array_equal(run.queue_ns + run.compute_ns + run.traffic_ns + run.delivery_ns, run.e2e_ns)
    prefill = sim.traces[0]
    assert (run.traffic_ns - prefill.traffic_ns >= 0.5e9).all()  # every request's KV crossed


def test_kv_cache_crosses_the_fabric_between_the_pools():
    # 2 x TP8 on the 4-node rail cluster: the prefill replica on node 0, the decode replica on node 1,
    # so each rank's KV share crosses its NIC: 1000 tokens x 80 layers x 1 KV head x 128 x 2 (K, V)
    # x 1 B (fp8) = 20.48 MB per rank, at 50 GB/s x 0.94.
    dep = build_deployment(pd_scenario(**{"deployment.fabric": "h100-4x8-rail", "model.kv_cache_precision": "fp8"}))
    per_rank = 1000 * dep.compute.kv_bytes_per_token_per_chip
    assert per_rank == 1000 * 80 * 2 * 128 * 1
    seconds = dep.costs.kv_transfer_s(1000, 0, 1)
    # Rank t of node 0 to rank t of node 1: the same rail, so NIC -> leaf -> NIC (2 links of 0.675 us),
    # after NCCL's 6.6 us launch.
    assert seconds == pytest.approx(6.6e-6 + 2 * 0.675e-6 + per_rank / (50e9 * 0.94), rel=1e-9)
    # Inside one NVSwitch domain the same transfer is an order of magnitude faster.
    local = build_deployment(pd_scenario(**{"deployment.fabric": {"kind": "switch", "hosts": 16},
                                            "model.kv_cache_precision": "fp8"}))
    assert local.costs.kv_transfer_s(1000, 0, 1) < seconds / 5


def test_kv_paths_are_cached_per_deployment_and_die_with_it():
    import gc
    import weakref

    dep = build_deployment(pd_scenario(**{"deployment.fabric": "h100-4x8-rail"}))
    other = build_deployment(pd_scenario(**{"deployment.fabric": {"kind": "switch", "hosts": 16}}))
    assert other.costs.kv_transfer_s(1000, 0, 1) < dep.costs.kv_transfer_s(1000, 0, 1) / 5
    assert dep.costs._kv_path.cache_info().currsize == other.costs._kv_path.cache_info().currsize == 1
    costs = weakref.ref(dep.costs)
    del dep
    gc.collect()
    assert costs() is None


def test_decode_replicas_free_of_prefills_give_steadier_tokens():
    colocated = summarize(simulate(scenario(**{"deployment.chips": 16})).run, "a", "", {})
    split = summarize(simulate(pd_scenario()).run, "b", "", {})
    assert split["latency_s"]["tpot"]["p90"] < colocated["latency_s"]["tpot"]["p90"]


@pytest.mark.parametrize("overrides, fragment", [
    ({"deployment.prefill_replicas": 2}, "leaves none to decode"),
    ({"deployment.tp": 4, "deployment.pp": 2}, "pp = 1 only"),
    ({"workload.max_concurrency": 8}, "needs open-loop arrivals"),
])
def test_impossible_disaggregations_are_one_line_errors(overrides, fragment):
    with pytest.raises(UserError) as error:
        build_deployment(pd_scenario(**overrides))
    assert fragment in str(error.value)


def test_the_result_document_describes_the_fabric_and_explain_names_the_algorithm():
    from tokenpath.report.explain import explain
    from tokenpath.sim.document import result_document

    sim = simulate(scenario(**{"workload.num_requests": 100, "deployment.fabric": {"kind": "torus", "dims": [2, 4]}}))
    fabric = result_document(sim)[0]["fabric"]
    # A 2x4 torus: the size-2 dimension has two cables per pair (8), the two 4-rings wrap (8).
    assert fabric == {"name": "torus given in deployment.fabric", "kind": "torus", "hosts": 8, "switches": 0,
                      "links": 16, "diameter": 3, "avg_hops": pytest.approx((1 / 2 + 1) * 8 / 7),
                      "bisection_bw_Bps": pytest.approx(4 * 112.5e9), "placement": [[list(range(8))]]}
    assert explain(sim)["tp_all_reduce_algorithm"] == "bucket"


def test_the_engine_block_counts_replicas_and_engines_apart():
    from tokenpath.sim.document import result_document

    sim = simulate(scenario(**{"workload.num_requests": 50, "deployment.tp": 4, "deployment.pp": 2}))
    engine = result_document(sim)[0]["engine"]
    assert (engine["replicas"], engine["engines"]) == (1, 2)  # one replica, two batches in flight
    assert engine["kv_capacity_tokens_per_engine"] == sim.deployment.kv_capacity_tokens


def test_kv_transfers_queue_for_the_replicas_links():
    from tokenpath.sim.disaggregated import kv_transfers

    dep = build_deployment(pd_scenario(**{"deployment.chips": 24}))  # 1 prefill, 2 decode replicas
    one = round(dep.costs.kv_transfer_s(1000, 0, 1) * 1e9)
    ready = np.array([0, 0, 0, 10 * one])
    done, busy_ns = kv_transfers(ready, np.full(4, 1000), np.zeros(4, int), np.array([1, 2, 1, 2]), dep.costs, 3)
    # All leave the one prefill replica: the second and third wait for the first, the fourth is late
    # enough to find the links free.
    assert done.tolist() == [one, 2 * one, 3 * one, 11 * one]
    assert busy_ns.tolist() == [4 * one, 2 * one, 2 * one]  # the prefill replica's links carried all four
    # Under attention data-parallel each rank sends its own requests' caches over its own link: with two lanes
    # the first two go at once, the third waits for one of them, and each lane was busy half as long.
    done, busy_ns = kv_transfers(ready, np.full(4, 1000), np.zeros(4, int), np.array([1, 2, 1, 2]), dep.costs, 3,
                                 lanes=2)
    assert done.tolist() == [one, one, 2 * one, 11 * one]
    assert busy_ns.tolist() == [2 * one, one, one]


@pytest.mark.parametrize("value, fragment", [
    ("bogus", "deployment.placement: use 'packed', 'spread' or a list of host ids (got 'bogus')"),
    ([0, "x"], "deployment.placement: every host in the list must be a whole number"),
    (3, "deployment.placement: use 'packed', 'spread' or a list of host ids (got 3)"),
])
def test_a_bad_placement_is_one_line_naming_the_field(value, fragment):
    with pytest.raises(UserError) as error:
        scenario(**{"deployment.placement": value})
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_whole_experts_run_gemms_a_whole_expert_wide_within_one_replica():
    """Expert parallel within one replica holds whole experts, as many bytes as their tensor-parallel slices,
    and runs their GEMMs a whole expert wide, at the wider GEMM's rate."""
    base = {"model.name": "deepseek-v3", "deployment.chips": 8, "deployment.tp": 8, "engine.scheduler": "trtllm"}
    tp = {op.name: op for op in build_deployment(scenario(**base)).compute.ops}
    ep = {op.name: op for op in build_deployment(scenario(**base, **{"deployment.expert_parallel": True})).compute.ops}
    assert ep["moe_experts"].resident_bytes == pytest.approx(tp["moe_experts"].resident_bytes)
    assert ep["moe_experts"].flops_per_token == pytest.approx(tp["moe_experts"].flops_per_token)
    assert ep["moe_experts"].flops_per_s > tp["moe_experts"].flops_per_s  # 2,048 columns wide, not 256


def test_the_report_says_the_experts_are_spread_and_how_their_tokens_reach_them():
    from tokenpath.report.simulation import describe

    def line(**overrides):
        sim = simulate(scenario(**{"model.name": "mixtral-8x7b", "model.precision": "bf16", "deployment.chips": 8,
                                   "deployment.tp": 2, "deployment.expert_parallel": True,
                                   "engine.scheduler": "prefill-first", "workload.num_requests": 20, **overrides}))
        return dict(describe(sim))["deployment"]

    assert "TP=2, PP=1, EP, 4 replicas" in line()
    assert "TP=2, PP=1, EP (all-to-all), 4 replicas" in line(**{"deployment.moe_all_to_all": True})


def test_the_verdicts_traffic_names_the_all_to_alls_over_each_replicas_chips():
    """Two TP8 replicas of DeepSeek-V3 under SGLang, experts over each replica's 8 chips by DeepEP: each of
    its 58 MoE layers an all-to-all dispatch and combine over those 8 chips, not all 16."""
    from tokenpath.sim.document import traffic_detail

    sim = simulate(load_scenario("typical", {
        "model.name": "deepseek-v3", "model.precision": "fp8", "deployment.chip": "h200", "deployment.chips": 16,
        "deployment.tp": 8, "deployment.expert_parallel": True, "deployment.moe_all_to_all": True,
        "engine.scheduler": "prefill-first", "workload.num_requests": 20}))
    assert "116 expert-parallel all-to-alls per step across 8 chips" in traffic_detail(sim)


def test_a_decode_replica_is_sent_only_the_blocks_it_lacks():
    """vLLM's decode instance looks a request up in its own prefix cache and reads only the blocks it did not find
    (NixlConnector): a shared 2,000-token prompt is sent to a decode replica once, then each request's own part,
    from the last whole block of the segments it holds."""
    from tokenpath.prefixes import chain
    from tokenpath.sim.disaggregated import DecodeHeld

    prompts = np.array([2100, 2100, 2100])
    system, other = ["s0", "s1", "s2", "s3"], ["o0", "o1", "o2", "o3"]  # 512-token segments of 2,000 tokens
    prefixes = chain([system, system, other], [2000, 2000, 2000])
    held = DecodeHeld(prefixes, prompts, block_tokens=16)
    assert held.lacking(0, 1, 0) == 2100  # the replica holds nothing yet
    held.arrived(0, 1, 100)
    assert held.lacking(1, 1, 99) == 2100  # not there yet when this one starts
    assert held.lacking(1, 1, 100) == 2100 - 2000  # 2,000 held, whole 16-token blocks (2000 = 125 x 16)
    assert held.lacking(1, 2, 200) == 2100  # another replica's cache is its own
    assert held.lacking(2, 1, 200) == 2100  # another prompt
    # a prompt no longer than what is held still sends its last token's block
    whole = DecodeHeld(prefixes, np.array([2000, 2000, 2000]), block_tokens=16)
    whole.arrived(0, 1, 0)
    assert whole.lacking(1, 1, 0) == 2000 - 1984


def test_disaggregated_requests_sharing_a_prompt_share_it_on_the_decode_replica():
    """200 requests at once sharing a 20,000-token prompt, Llama-3.1-8B on one H100 prefilling and one decoding:
    the decode replica holds the shared prompt once, as one chip does, rather than each request a copy of its own
    (which held 23 at a time and read TTFT 33 s against one chip's 4.5 s)."""
    base = {"model.name": "llama-3.1-8b", "model.precision": "bf16", "deployment.chip": "h100", "deployment.tp": 1,
            "workload.num_requests": 200, "workload.arrival.rate": "inf",
            "workload.input": {"kind": "fixed", "value": 200}, "workload.output": {"kind": "fixed", "value": 300},
            "workload.shared_prefix": {"tokens": 20000}}
    split = simulate(load_scenario(None, {**base, "deployment.chips": 2, "deployment.prefill_replicas": 1}))
    alone = simulate(load_scenario(None, {**base, "deployment.chips": 1}))
    decode = split.traces[-1]
    assert decode.step_seqs.max() == 200  # every request decodes at once, as on one chip
    assert split.summary["latency_s"]["ttft"]["mean"] < alone.summary["latency_s"]["ttft"]["mean"]
    # the shared prompt crosses once; each other request sends its own 200 tokens and the last block
    assert split.summary["attribution_s"]["traffic"] < 0.05 * 18.9e-3


def test_a_fabric_table_setting_only_its_algorithm_runs_it_on_the_chip_s_own_fabric():
    # 16 H100s are two 8-GPU nodes on NIC rails by default; naming the algorithm alone keeps them so (it had
    # swapped them for one 16-port switch with no network, a decode step 39% faster than on the nodes).
    base = {"model.name": "llama-3.1-70b", "deployment.chip": "h100", "deployment.chips": 16, "deployment.tp": 16}
    default = build_deployment(scenario(**base))
    ring = build_deployment(scenario(**base, **{"deployment.fabric": {"algorithm": "ring"}}))
    assert ring.topology.kind == default.topology.kind and ring.topology.hosts == default.topology.hosts
    assert ring.fabric_name == default.fabric_name + ", algorithm ring"
    assert ring.collectives.costs("all_reduce", [list(range(16))]) == default.collectives.costs(
        "all_reduce", [list(range(16))], "ring")
