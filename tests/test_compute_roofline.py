"""Roofline step times, weight and KV bytes, and memory capacity, checked against closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.compute import ComputeModel, efficiency, load_chip, load_model
from tokenpath.compute.efficiency import (
    ACTIVATION_BYTES,
    ATTENTION_PLATEAU_FRACTION,
    ATTENTION_QUERY_OVERHEAD_PAIRS,
    EAGER_KERNEL_LAUNCH_S,
    GEMM_OVERLAP_NORM,
    KERNEL_FIXED_S,
    RESERVED_LOGIT_ROWS,
    RUNTIME_RESERVE_BYTES,
    SERVING_GEMM_FRACTION,
)
from tokenpath.compute.ops import Mxfp4Layout
from tokenpath.compute.roofline import op_time_s
from tokenpath.config.assumptions import DEFAULTS, Assumptions
from tokenpath.config.errors import UserError
from tokenpath.engine.mxfp4_weights import VLLM_MARLIN
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import load_scenario

H200_BW_EFF = 4.105e12  # catalog chips.toml: the H200's measured_stream_bw
H200_GEMM_FIXED_S = 4.34e-6  # and its measured_gemm_fixed


def compute_model(model="llama-3.1-70b", chip="h200", tp=8, weights="fp8", kv="bf16",
                  assumptions=DEFAULTS) -> ComputeModel:
    return ComputeModel(load_model(model), load_chip(chip, assumptions), tp, weights, kv, assumptions=assumptions)


NO_FIXED_COST = Assumptions({"kernel_fixed_s": 0.0, "gemm_fixed_s": 0.0})  # the work alone, no kernel's fixed cost


def decode_step(cm: ComputeModel, batch: int, context: int) -> float:
    return cm.step_time_s(batch, batch, batch * context, batch * context)


# -- bytes -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "qwen2.5-72b", "deepseek-v3", "llama-2-7b"])
def test_bf16_weights_at_tp1_are_two_bytes_per_parameter(name):
    cm = compute_model(name, chip="b200", tp=1, weights="bf16")
    assert cm.weight_bytes_per_chip == 2 * load_model(name).params_total()


@pytest.mark.parametrize(("name", "card_params", "tp"), [
    ("qwen3-8b", 8.2e9, 1), ("qwen3-32b", 32.8e9, 2), ("qwen3-235b-a22b", 235e9, 4), ("qwen3-235b-a22b", 235e9, 8)])
def test_qwen3_weights_per_chip_are_the_model_cards_parameters(name, card_params, tp):
    """bf16 weights split over a TP that divides the query heads: the parameters the model card states
    (huggingface.co/Qwen/<model>: 8.2B, 32.8B, 235B in total), two bytes each, within 2%."""
    model = load_model(name)
    assert model.num_heads % tp == 0
    cm = compute_model(name, chip="b200", tp=tp, weights="bf16")
    assert cm.weight_bytes_per_chip * tp == pytest.approx(2 * card_params, rel=0.02)


def test_fp8_weights_keep_embeddings_bf16_and_split_over_tp():
    model = load_model("llama-3.1-70b")
    embedding_params = 2 * model.vocab_size * model.hidden_size  # embedding + LM head
    norm_params = (2 * 80 + 1) * 8192
    linear_params = model.params_total() - embedding_params - norm_params
    expected = linear_params * 1 / 8 + embedding_params * 2 / 8 + norm_params * 2  # norms replicated
    assert compute_model(tp=8).weight_bytes_per_chip == pytest.approx(expected, rel=1e-12)


def test_kv_bytes_per_token_gqa():
    assert compute_model(tp=1).kv_bytes_per_token_per_chip == 2 * 80 * 8 * 128 * 2 == 327_680
    assert compute_model(tp=8).kv_bytes_per_token_per_chip == 327_680 / 8
    assert compute_model(tp=8, kv="fp8").kv_bytes_per_token_per_chip == 327_680 / 16
    # 16 ranks, 8 KV heads: each rank holds one replicated head, same as tp=8.
    assert compute_model(tp=16).kv_bytes_per_token_per_chip == 327_680 / 8


@pytest.mark.parametrize("tp", [1, 8])
def test_kv_bytes_per_token_mla_is_latent_and_replicated(tp):
    assert compute_model("deepseek-v3", tp=tp).kv_bytes_per_token_per_chip == 61 * (512 + 64) * 2


def test_allreduce_shape():
    cm = compute_model(tp=8)
    assert cm.allreduce_bytes(100) == 100 * 8192 * 2


# -- time --------------------------------------------------------------------------------------------

def test_batch1_decode_is_weight_streaming():
    cm = compute_model(assumptions=NO_FIXED_COST)  # the roofline alone
    model = cm.model
    embedding_table = model.vocab_size / 8 * model.hidden_size * 2  # resident, only one row is read
    step = decode_step(cm, batch=1, context=1)
    assert step == pytest.approx(cm.weight_bytes_per_chip / H200_BW_EFF, rel=0.05)
    assert step == pytest.approx((cm.weight_bytes_per_chip - embedding_table) / H200_BW_EFF, rel=0.01)
    assert all(op.bound == "memory" for op in cm.step_ops(1, 1, 1000, 1000))  # a 1000-token context


def test_every_kernel_adds_its_fixed_cost_to_its_work():
    # 70B fp8 at TP8, batch 1: each layer launches two norms and a residual add (plus the final norm),
    # RoPE, the KV-cache write, split-KV attention and its combine, and each GEMM after quantizing its
    # input; the MLP's activation runs between its GEMMs. A GEMM by weights costs the H200's fixed time
    # of a GEMM, every other kernel KERNEL_FIXED_S.
    ops = {op.name: op for op in compute_model().step_ops(1, 1, 1000, 1000)}
    work = {op.name: op for op in compute_model(assumptions=NO_FIXED_COST).step_ops(1, 1, 1000, 1000)}
    kernels = {"norms": (3 * 80 + 1, 0), "attention": (4 * 80, 0), "qkv_proj": (80, 80), "o_proj": (80, 80),
               "mlp_gate_up": (2 * 80, 80), "mlp_down": (80, 80), "embedding": (1, 0), "lm_head": (0, 1)}
    for name, (others, gemms) in kernels.items():
        fixed_s = others * KERNEL_FIXED_S + gemms * H200_GEMM_FIXED_S
        assert ops[name].time_s == pytest.approx(work[name].time_s + fixed_s, rel=1e-12)
    assert ops["norms"].bound == ops["qkv_proj"].bound == "fixed"  # more launch than work at TP8
    assert ops["mlp_gate_up"].bound == "memory"
    # Every step pays them all once: 16 kernels a layer and three more.
    cm = compute_model()
    assert cm.kernels_per_step == 80 * (16 + 2) + 3  # with the two all-reduces of each layer


def test_decode_time_is_linear_in_kv_read_tokens(monkeypatch):

    cm = compute_model()
    times = [decode_step(cm, batch=8, context=c) for c in (1000, 2000, 3000, 4000)]
    slopes = [(b - a) / (8 * 1000) for a, b in zip(times, times[1:])]
    expected = cm.kv_bytes_per_token_per_chip / H200_BW_EFF
    assert slopes == pytest.approx([expected] * 3, rel=1e-6)


def test_prefill_8192_is_compute_bound():
    cm = compute_model(assumptions=NO_FIXED_COST)
    tokens = 8192
    pairs = tokens * (tokens + 1) / 2
    ops = {op.name: op for op in cm.step_ops(tokens, 1, pairs, tokens)}
    gemms = ["qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"]
    assert all(ops[name].bound == "compute" for name in gemms + ["attention"])
    # GEMMs: 2 FLOPs per linear weight per token at the serving fraction of the measured fp8 rate.
    model = cm.model
    linear_params = model.num_layers * (model.attention_params() + model.mlp_params(model.intermediate_size))
    gemm_s = 2 * linear_params / 8 * tokens / (1453.4e12 * SERVING_GEMM_FRACTION)
    # Past the ridge point a GEMM's memory time adds a little on top (op_time_s): here under 2%.
    assert gemm_s < sum(ops[name].time_s for name in gemms) < 1.02 * gemm_s
    # Attention: 4 * heads per chip * head_dim FLOPs per pair per layer at its plateau's share of the measured
    # bf16 rate, and its fixed work per query token.
    work_pairs = pairs + ATTENTION_QUERY_OVERHEAD_PAIRS * tokens
    attention_s = 4 * 8 * 128 * work_pairs * 80 / (808e12 * ATTENTION_PLATEAU_FRACTION)
    assert ops["attention"].time_s == pytest.approx(attention_s, rel=1e-9)
    assert sum(op.time_s for op in ops.values() if op.bound == "compute") > 0.8 * sum(
        op.time_s for op in ops.values())


def test_a_gemm_blends_compute_and_memory_time_and_other_ops_take_the_larger():
    p = GEMM_OVERLAP_NORM
    assert op_time_s(3.0, 1.0, gemm=False) == op_time_s(1.0, 3.0, gemm=False) == 3.0
    # At the ridge point (equal times) a GEMM costs 2^(1/p) times either; far from it, the larger.
    assert op_time_s(1.0, 1.0, gemm=True) == pytest.approx(2 ** (1 / p), rel=1e-12)
    assert op_time_s(100.0, 1.0, gemm=True) == pytest.approx(100.0 * (1 + 0.01 ** p) ** (1 / p), rel=1e-12)
    assert op_time_s(100.0, 1.0, gemm=True) < 100.0 * 1.001
    assert op_time_s(0.0, 2.0, gemm=True) == 2.0 and op_time_s(0.0, 0.0, gemm=True) == 0.0
    assert op_time_s(1e-300, 1e-300, gemm=True) > 0  # no underflow for tiny times


def test_large_batch_decode_gemms_cost_more_than_the_plain_roofline_near_the_ridge():
    # 70B fp8 TP8 on H200: its GEMMs reach the ridge point at about 200 tokens per step
    cm = compute_model(assumptions=NO_FIXED_COST)
    bw = cm.chip.effective_hbm_bw_Bps
    for batch, low, high in [(1, 1.0, 1.001), (192, 1.3, 1.42), (8192, 1.0, 1.02)]:
        pairs = list(zip(cm.ops, cm.step_ops(batch, batch, batch * 1000, batch * 1000)))
        gemms = [(op, cost) for op, cost in pairs if op.gemm and op.name != "lm_head"]
        assert [op.name for op, _ in gemms] == ["qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"]
        plain = sum(max(cost.flops / op.flops_per_s, cost.bytes / bw) for op, cost in gemms)
        ratio = sum(cost.time_s for _, cost in gemms) / plain
        assert low <= ratio <= high, (batch, ratio)


# FlashAttention-3 forward, H100, bf16, head dim 128 (pytorch/benchmark commit ff65cb67): tokens -> TFLOP/s.
FA3_H100_TFLOPS = {512: 430.32, 1024: 517.10, 2048: 565.54, 4096: 590.23, 8192: 614.23, 16384: 620.73}


@pytest.mark.parametrize("tokens, measured_tflops", FA3_H100_TFLOPS.items())
def test_attention_rate_grows_with_sequence_length_as_flashattention3_measured(tokens, measured_tflops):
    # One sequence attending all of its own tokens (not causal, as measured), 16 heads of 128 on one chip.
    model = load_model("llama-3.1-8b")
    cm = ComputeModel(model, load_chip("h100"), 2, "bf16", "bf16")  # 32 heads / 2 = 16 per chip
    attention = next(op for op in cm.ops if op.name == "attention")
    pairs = tokens * tokens
    flops = attention.flops(tokens, 0, pairs, tokens)
    achieved_tflops = flops / attention.compute_s(tokens, 0, pairs, tokens) / 1e12
    assert flops == 4 * 16 * 128 * pairs * model.num_layers
    assert achieved_tflops == pytest.approx(measured_tflops, rel=0.025)


def test_step_time_equals_sum_of_ops_plus_the_hosts_time():
    for name in ("llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"):
        cm = ComputeModel(load_model(name), load_chip("h200"), 8, "fp8", "bf16", host_step_s=1e-3,
                          host_per_sequence_s=20e-6)
        for args in [(1, 1, 5000, 5000), (300, 20, 2e6, 3e5), (8192, 1, 8192 * 8193 / 2, 8192), (0, 0, 0, 0),
                     (512, 1, 512 * 4096 + 512 * 513 / 2, 4096 + 512, 4096)]:
            ops_s = math.fsum(op.time_s for op in cm.step_ops(*args))
            assert cm.step_time_s(*args) == pytest.approx(ops_s + 1e-3 + args[1] * 20e-6, rel=1e-12)


@pytest.mark.parametrize("tp, all_reduce_kernels", [(1, 0), (8, 2)])
def test_eager_steps_pay_every_layers_kernel_launches(tp, all_reduce_kernels):
    cm = ComputeModel(load_model("llama-3.1-70b"), load_chip("h200"), tp, "fp8", "bf16", cuda_graphs="none")
    graphed = compute_model(tp=tp)
    # Per layer: 2 norms and a residual add, RoPE, the KV-cache write, attention and its combine, 4
    # GEMMs with their fp8 input quantization, the activation; then the embedding, the final norm and
    # the LM head.
    expected = (80 * (16 + all_reduce_kernels) + 3) * EAGER_KERNEL_LAUNCH_S
    for args in [(1, 1, 5000, 5000), (300, 20, 2e6, 3e5)]:
        assert cm.launch_s(*args[:2]) == pytest.approx(expected, rel=1e-12)
        assert graphed.launch_s(*args[:2]) == 0.0
        assert cm.step_time_s(*args) - graphed.step_time_s(*args) == pytest.approx(expected, rel=1e-9)


def test_cuda_graph_policy_decides_which_steps_launch_eagerly():
    model, chip = load_model("llama-3.1-8b"), load_chip("h100")
    decode_only = ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="decode")
    capped = ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="all", cuda_graph_max_tokens=512)
    eager_s = (32 * 16 + 3) * EAGER_KERNEL_LAUNCH_S
    # decode: graphed only when every sequence decodes one token (tokens == sampled logits)
    assert decode_only.launch_s(256, 256) == 0.0
    assert decode_only.launch_s(300, 45) == pytest.approx(eager_s)
    assert decode_only.launch_s(128, 1) == pytest.approx(eager_s)  # a batch-1 prefill
    # all, up to a size: mixed steps too, but not past the largest captured size
    assert capped.launch_s(300, 45) == 0.0 and capped.launch_s(512, 1) == 0.0
    assert capped.launch_s(513, 1) == pytest.approx(eager_s)
    with pytest.raises(UserError, match="cuda_graphs must be all, decode or none"):
        ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="eager")


def test_a_verify_step_replays_the_decode_graph_of_its_sequences():
    # Decode graphs sized in sequences (SGLang's cuda_graph_max_bs, TensorRT-LLM's batch sizes) hold
    # a verify step's drafts: 48 sequences of 4 tokens replay the graph of batch 48 (up to 64 here),
    # though their 192 tokens exceed it; vLLM V1's graphs, sized in tokens, do not take them.
    model, chip = load_model("llama-3.1-8b"), load_chip("h100")
    eager_s = (32 * 16 + 3) * EAGER_KERNEL_LAUNCH_S
    by_sequences = ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="decode", cuda_graph_max_tokens=64)
    assert by_sequences.launch_s(192, 192, sequences=48) == 0.0
    assert by_sequences.launch_s(192, 192) == pytest.approx(eager_s)  # (without speculation: 192 sequences)
    assert by_sequences.launch_s(260, 260, sequences=65) == pytest.approx(eager_s)
    sizes = ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="decode", cuda_graph_sizes=frozenset({16, 32}))
    assert sizes.launch_s(128, 128, sequences=32) == 0.0 and sizes.launch_s(68, 68, sequences=17) > 0
    by_tokens = ComputeModel(model, chip, 1, "fp8", "bf16", cuda_graphs="all", cuda_graph_max_tokens=64)
    assert by_tokens.launch_s(192, 192, sequences=48) == pytest.approx(eager_s)
    # The host's own time counts the sequences too: 48, not 192 verify rows.
    host = ComputeModel(model, chip, 1, "fp8", "bf16", host_per_sequence_s=1e-5)
    assert host.host_busy_s(192, 192, sequences=48) == pytest.approx(48e-5)


def _max_plus_end_s(kernel_s: list[float], launch_s: float, ahead_s: float = 0.0) -> float:
    """When a queue of kernels ends, kernel k (from 1) launched at k * launch_s - ahead_s (the host began
    ahead_s before the GPU was free, at 0): each starts once it is launched and the one before it is done."""
    end_s = 0.0
    for k, g in enumerate(kernel_s, start=1):
        end_s = max(end_s, k * launch_s - ahead_s) + g
    return end_s


@settings(max_examples=200, deadline=None)
@given(layer_s=st.lists(st.floats(0.0, 2e-3), min_size=1, max_size=12),
       layers=st.integers(1, 40), launch_s=st.floats(1e-7, 1e-4))
def test_the_launch_queue_bounds_a_step_of_alike_layers(layer_s, layers, launch_s):
    """A host that launches kernels ahead of the GPU: the step ends no earlier than the longer of the
    kernels and the launches, and no later than that plus one layer of the shorter."""
    from tokenpath.compute.roofline import launch_queue_s

    kernels = layer_s * layers
    exact = _max_plus_end_s(kernels, launch_s)
    gpu_s, launches_s = math.fsum(kernels), len(kernels) * launch_s
    assert max(gpu_s, launches_s) <= exact * (1 + 1e-9)
    assert exact <= launch_queue_s(gpu_s, launches_s, layers) * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(layer_s=st.lists(st.floats(0.0, 2e-3), min_size=1, max_size=12),
       layers=st.integers(1, 40), launch_s=st.floats(1e-7, 1e-4), ahead_share=st.floats(0.0, 2.0))
def test_a_host_that_starts_ahead_of_the_gpu_has_that_much_less_to_launch(layer_s, layers, launch_s, ahead_share):
    """An overlapped host begins launching a step while the GPU still runs the one before: the step ends
    no earlier than the longer of its kernels and the launches left, and no later than the queue's bound
    with those launches left."""
    from tokenpath.compute.roofline import launch_queue_s

    kernels = layer_s * layers
    gpu_s, launches_s = math.fsum(kernels), len(kernels) * launch_s
    ahead_s = ahead_share * launches_s
    exact = _max_plus_end_s(kernels, launch_s, ahead_s)
    left_s = max(launches_s - ahead_s, 0.0)
    assert max(gpu_s, left_s) <= exact * (1 + 1e-9) + 1e-15
    assert exact <= launch_queue_s(gpu_s, left_s, layers) * (1 + 1e-9) + 1e-15


def test_an_overlapped_host_launches_ahead_and_a_graph_step_leaves_it_free():
    """The host's own time in a step is its host_s and, eagerly, its launches; launching a step ahead
    of the GPU takes that much off the launches it waits on, down to none."""
    model, chip = load_model("llama-3.1-70b"), load_chip("h200")
    python = ComputeModel(model, chip, 4, "bf16", "bf16", cuda_graphs="decode", host_step_s=1e-3,
                          host_overlapped=True, host_eager_per_kernel_s=40e-6)
    short = (224, 1, 224 * 225 / 2, 224)      # eager: a prompt
    decode = (32, 32, 0, 32 * 500)            # replays a graph
    assert python.eager(224, 1) and not python.eager(32, 32)
    assert python.host_busy_s(224, 1) == pytest.approx(python.host_s(1) + python.host_launch_s, rel=1e-12)
    assert python.host_busy_s(32, 32) == python.host_s(32)
    kernels_s = math.fsum(op.time_s for op in python.step_ops(*short)) + python.eager_gap_s
    assert kernels_s < python.host_launch_s  # launch-bound alone
    ahead_s = 20e-3
    left_s = python.host_launch_s - ahead_s
    assert python.step_time_s(*short, ahead_s=ahead_s) == pytest.approx(
        max(kernels_s, left_s) + min(kernels_s, left_s) / 80, rel=1e-12)
    assert python.step_time_s(*short, ahead_s=python.host_launch_s) == pytest.approx(kernels_s, rel=1e-12)
    assert python.step_time_s(*short, ahead_s=1.0) == pytest.approx(kernels_s, rel=1e-12)
    assert python.step_time_s(*decode, ahead_s=ahead_s) == python.step_time_s(*decode)


def test_a_python_host_delays_a_small_models_eager_step_and_hides_behind_a_large_ones():
    """One host time per kernel (SGLang's and vLLM V0's Python) for both: an 8B model's prefill of 512
    tokens on an H100 is shorter than its launches and lasts them, a 405B model's at TP8 outlasts its
    own and hides them, so that its step is its kernels with one layer of launches, not the two added."""
    per_kernel_s = 30e-6
    prompt = (512, 1, 512 * 513 / 2, 512)
    for name, tp, launch_bound in (("llama-3.1-8b", 1, True), ("llama-3.1-405b", 8, False)):
        model, chip = load_model(name), load_chip("h100")
        python = ComputeModel(model, chip, tp, "fp8", "bf16", cuda_graphs="decode",
                              host_eager_per_kernel_s=per_kernel_s)
        cpp = ComputeModel(model, chip, tp, "fp8", "bf16", cuda_graphs="decode")
        kernels_s = cpp.step_time_s(*prompt)            # with their launch gaps, no host launching them
        launches_s = python.kernels_per_step * per_kernel_s
        assert python.host_launch_s == pytest.approx(launches_s, rel=1e-12)
        assert (launches_s > kernels_s) == launch_bound
        assert python.step_time_s(*prompt) == pytest.approx(
            max(kernels_s, launches_s) + min(kernels_s, launches_s) / model.num_layers, rel=1e-12)
    # The 405B step: its launches (126 layers of 18 kernels, about 68 ms) are not added to its kernels.
    assert python.step_time_s(*prompt) < kernels_s + launches_s / 10


def test_an_eager_step_waits_on_its_launches_and_its_host():
    """The host's own step time comes on top of an eager step's launch queue, or overlaps it; a replayed
    graph, or no host time per kernel (a C++ runtime), leaves the step its kernels; the collectives
    between its kernels hide launches as kernels do."""
    from tokenpath.compute.efficiency import EAGER_KERNEL_LAUNCH_S

    model, chip = load_model("llama-3.1-70b"), load_chip("h200")
    per_kernel = 40e-6
    python = ComputeModel(model, chip, 4, "bf16", "bf16", cuda_graphs="decode", host_step_s=1e-3,
                          host_eager_per_kernel_s=per_kernel)
    plain = ComputeModel(model, chip, 4, "bf16", "bf16", cuda_graphs="decode", host_step_s=1e-3)
    kernels = 80 * (12 + 2) + 3  # bf16: the fp8 count less 4 input quantizations; two all-reduces a layer at TP4
    assert python.kernels_per_step == kernels
    assert python.eager_gap_s == plain.eager_gap_s == pytest.approx(kernels * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    assert python.host_launch_s == pytest.approx(kernels * per_kernel, rel=1e-12)
    short = (224, 1, 224 * 225 / 2, 224)        # a ShareGPT-sized prefill: its launches are longer
    decode = (32, 32, 0, 32 * 500)              # replays a graph
    gpu_s = plain.step_time_s(*short) - 1e-3
    assert gpu_s < python.host_launch_s
    assert python.step_time_s(*short) == pytest.approx(
        python.host_launch_s + gpu_s / 80 + 1e-3, rel=1e-12)
    traffic_s = 30e-3  # all-reduces that outlast the launches with the kernels
    assert python.step_time_s(*short, traffic_s=traffic_s) + traffic_s == pytest.approx(
        gpu_s + traffic_s + python.host_launch_s / 80 + 1e-3, rel=1e-12)
    assert python.step_time_s(*decode) == plain.step_time_s(*decode)
    overlapped = ComputeModel(model, chip, 4, "bf16", "bf16", cuda_graphs="decode", host_step_s=1e-3,
                              host_overlapped=True, host_eager_per_kernel_s=per_kernel)
    assert overlapped.step_time_s(*short) == pytest.approx(python.step_time_s(*short) - 1e-3, rel=1e-12)


def test_python_hosts_pay_their_eager_host_time_and_the_compiled_or_cpp_engines_do_not():
    from tokenpath.config.assumptions import Assumptions
    from tokenpath.engine.host_time import EAGER_HOST_PER_KERNEL_S, TRTLLM_EAGER_HOST_PER_KERNEL_S, host_step_cost

    assert host_step_cost("prefill-first").eager_per_kernel_s == EAGER_HOST_PER_KERNEL_S
    assert host_step_cost("trtllm").eager_per_kernel_s == TRTLLM_EAGER_HOST_PER_KERNEL_S  # its PyTorch backend
    assert host_step_cost("vllm-v1").eager_per_kernel_s == 0.0
    assert host_step_cost("trtllm", eager_host=False).eager_per_kernel_s == 0.0  # a TensorRT engine
    assert host_step_cost("prefill-first", eager_host=True).eager_per_kernel_s == EAGER_HOST_PER_KERNEL_S
    with Assumptions(values={"eager_host_per_kernel_s": 20e-6, "trtllm_eager_host_per_kernel_s": 30e-6}).active():
        assert host_step_cost("prefill-first").eager_per_kernel_s == 20e-6
        assert host_step_cost("trtllm").eager_per_kernel_s == 30e-6


def test_moe_expected_experts_touched():
    cm = compute_model("deepseek-v3")
    assert cm.experts_touched(0) == 0
    assert cm.experts_touched(1) == pytest.approx(8)
    assert cm.experts_touched(4096) == pytest.approx(256)
    assert cm.experts_touched(10) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 10))
    # Batch-1 decode streams 8 routed experts per MoE layer, not all 256.
    one = {op.name: op for op in cm.step_ops(1, 1, 1, 1)}["moe_experts"]
    expert_bytes = 3 * 7168 * 2048 / 8 * 58  # fp8, intermediate split over tp=8
    assert one.bytes == pytest.approx(8 * expert_bytes, rel=0.01)


@pytest.mark.parametrize("model, chip, weights, expert_parallel, width, ceiling", [
    ("deepseek-v3", "h200", "fp8", False, 2048 / 8, efficiency.BLOCK_SCALED_EXPERT_GEMM_CEILING),  # tp 8, blocks
    ("deepseek-v3", "h200", "fp8", True, 2048, efficiency.BLOCK_SCALED_EXPERT_GEMM_CEILING),       # whole experts
    ("deepseek-v3", "h200", "bf16", False, 2048 / 8, 1.0),                                   # no fp8 blocks in bf16
    ("deepseek-v3", "a100", "fp8", False, 2048 / 8, 1.0),  # fp8 weight-only, multiplied at bf16: no block kernels
    ("mixtral-8x7b", "h200", "fp8", False, 14336 / 8, 1.0),                                  # per-tensor fp8
])
def test_routed_experts_run_at_their_widths_share_of_the_dense_rate(model, chip, weights, expert_parallel, width,
                                                                    ceiling):
    cm = ComputeModel(load_model(model), load_chip(chip), 8, weights, "bf16", expert_parallel=expert_parallel)
    experts = next(op for op in cm.ops if op.name == "moe_experts")
    dense = load_chip(chip).effective_flops(weights)
    fraction = ceiling * width / (width + efficiency.EXPERT_GEMM_HALF_WIDTH)
    assert experts.flops_per_s == pytest.approx(dense * fraction)
    # Where they are compute-bound (a 16k-token prefill) their time is their FLOPs at that rate;
    # at batch-1 decode they stream their weights as before.
    tokens = 16384
    big = {op.name: op for op in cm.step_ops(tokens, 1, 0, 0)}["moe_experts"]
    assert big.bound == "compute"
    assert big.time_s >= big.flops / (dense * fraction)
    dense_rate = Assumptions(values={"expert_gemm_half_width": 0.0, "block_scaled_expert_gemm_ceiling": 1.0})
    full = ComputeModel(load_model(model), load_chip(chip), 8, weights, "bf16", expert_parallel=expert_parallel,
                        assumptions=dense_rate)
    assert next(op for op in full.ops if op.name == "moe_experts").flops_per_s == pytest.approx(dense)
    assert full.step_time_s(1, 1, 1, 1) == pytest.approx(cm.step_time_s(1, 1, 1, 1), rel=1e-3)


def test_deepseek_v3_prefill_experts_at_tp8_take_about_as_long_as_the_measured_grouped_gemms():
    """The engines' MoE kernels on H200 at tp 8, fp8 blocks, 8192 tokens (AIConfigurator's tables: SGLang
    0.5.14, vLLM 0.24.0, TensorRT-LLM 1.3.0rc20): 1.88, 2.37 and 4.98 ms per layer. The model's 58 MoE
    layers come within 30% of the median; without the width's share they took under half of it."""
    cm = compute_model("deepseek-v3")
    per_layer_s = {op.name: op for op in cm.step_ops(8192, 1, 0, 0)}["moe_experts"].time_s / 58
    assert per_layer_s == pytest.approx(2.37e-3, rel=0.3)


def test_mla_decode_attends_in_the_latent_space_and_prompts_as_multi_head_attention():
    cm = compute_model("deepseek-v3", tp=8)
    heads = 128 / 8
    # One decode token over 1000 cached positions: 1000 pairs, 1000 reads, latent widths.
    decode = {op.name: op for op in cm.step_ops(1, 1, 1000, 1000)}["attention"]
    assert decode.flops == pytest.approx(1000 * 61 * 2 * heads * ((512 + 64) + 512))
    # A 4096-token prompt: its pairs at the multi-head widths (192 + 128), its 4096 reads at the excess.
    pairs = 4096 * 4097 / 2
    prompt = {op.name: op for op in cm.step_ops(4096, 1, pairs, 4096)}["attention"]
    assert prompt.flops == pytest.approx(61 * 2 * heads * (pairs * (192 + 128) + 4096 * (576 + 512 - 192 - 128)))
    assert prompt.flops < 0.31 * pairs * 61 * 2 * heads * (576 + 512)
    # GQA models have one form: reads add nothing.
    llama = {op.name: op for op in compute_model("llama-3.1-70b").step_ops(4096, 1, pairs, 4096)}["attention"]
    assert llama.flops == pytest.approx(pairs * 80 * 2 * (64 / 8) * (128 + 128))


def test_mla_prompt_chunks_decompress_their_cached_context():
    """A prompt chunk after p cached positions (an earlier chunk, a prefix-cache hit) runs kv_b_proj over
    those p latents too, 2 FLOPs per weight each, writing their K_nope and V: a 100-token prompt after a
    4096-token cached prefix costs DeepSeek-V3 that much more than one with no context to decompress."""
    cm = compute_model("deepseek-v3", tp=8)
    heads, layers, rank = 128 / 8, 61, 512
    q, p = 100, 4096
    step = (q, 1, q * p + q * (q + 1) / 2, p + q)
    without = {op.name: op for op in cm.step_ops(*step)}
    with_context = {op.name: op for op in cm.step_ops(*step, p)}
    params = rank * heads * (128 + 128)
    assert with_context["kv_b_proj"].flops - without["kv_b_proj"].flops == pytest.approx(2 * params * layers * p)
    assert with_context["kv_b_proj"].bytes - without["kv_b_proj"].bytes == pytest.approx(
        (rank + heads * 256) * 2 * layers * p)
    assert {name: op.flops for name, op in with_context.items() if name != "kv_b_proj"} == {
        name: op.flops for name, op in without.items() if name != "kv_b_proj"}
    # 1.05 TFLOP on one H200: about a millisecond more than the prompt's own 100 tokens cost in kv_b_proj.
    assert cm.step_time_s(*step, p) - cm.step_time_s(*step) > 0.9e-3
    # Models without MLA keep their K/V whole: the context costs nothing beyond its reads.
    llama = compute_model("llama-3.1-70b")
    assert llama.step_time_s(*step, p) == llama.step_time_s(*step)


def test_mla_run_expanded_caches_k_and_v_per_head_and_attends_at_the_padded_width():
    """vLLM before 0.7.1 ran DeepSeek's attention as multi-head attention: K and V of every head cached,
    V padded to the 192-wide query-key head. At tp 8 a token takes 2 x 16 heads x 192 per layer, 10.7x
    the latent's 576 (Neural Magic measured 9.4x the tokens on 8 x H200 from v0.7.0 to v0.7.1: 54,560
    to 512,000), and a decode token's pairs cost 192 + 192 per head where the latent form's cost 576 +
    512; nothing cached is decompressed again."""
    model, chip = load_model("deepseek-v3"), load_chip("h200")
    latent = compute_model("deepseek-v3", tp=8)
    expanded = ComputeModel(model, chip, 8, "fp8", "bf16", latent_attention=False)
    heads, layers = 128 / 8, 61
    assert expanded.kv_bytes_per_token_per_chip == layers * 2 * heads * 192 * 2 == 749_568
    assert expanded.kv_bytes_per_token_per_chip / latent.kv_bytes_per_token_per_chip == pytest.approx(10.67, abs=0.01)
    decode = {op.name: op for op in expanded.step_ops(1, 1, 1000, 1000)}
    assert decode["attention"].flops == pytest.approx(1000 * layers * 2 * heads * (192 + 192))
    assert decode["attention"].bytes > 1000 * 749_568
    # kv_b expands each new token (2 FLOPs per weight) and never the cached context.
    step = (100, 1, 100 * 4096 + 5050, 4196)
    kv_b = {op.name: op for op in expanded.step_ops(*step, 4096)}["kv_b_proj"]
    assert kv_b.flops == pytest.approx(2 * 512 * heads * (128 + 128) * layers * 100)
    assert expanded.step_time_s(*step, 4096) == expanded.step_time_s(*step)
    # The weights are the checkpoint's either way; models without MLA have one form.
    assert expanded.weight_bytes_per_chip == latent.weight_bytes_per_chip
    llama = ComputeModel(load_model("llama-3.1-70b"), chip, 8, "fp8", "bf16", latent_attention=False)
    assert llama.step_time_s(*step) == compute_model().step_time_s(*step)


def test_mla_absorbed_weights_held_and_streamed_as_bf16_copies_of_a_quantized_kv_b_proj():
    """vLLM dequantizes DeepSeek-V3's fp8 kv_b_proj into bf16 W_UK / W_UV at load and decodes with those
    (engine/mla_weights.py): at tp 8 a chip holds 512 x 16 heads x (128 + 128) x 61 layers = 127,926,272
    weights more, at 2 bytes each beside kv_b_proj's fp8 (255.9 MB), and a decode step streams them at 2 bytes
    where the fp8 weights took 1 (127.9 MB more). A bf16 checkpoint's W_UK / W_UV are views of kv_b_proj."""
    model, chip = load_model("deepseek-v3"), load_chip("h200")
    params = 512 * (128 // 8) * (128 + 128) * 61
    assert params == 127_926_272
    step = (64, 64, 64 * 4096, 64 * 4096)

    def kv_b_bytes(cm: ComputeModel) -> float:
        return {op.name: op for op in cm.step_ops(*step)}["kv_b_proj"].bytes

    fp8 = ComputeModel(model, chip, 8, "fp8", "bf16")
    copies = ComputeModel(model, chip, 8, "fp8", "bf16", mla_absorbed_bf16=True)
    assert copies.weight_bytes_per_chip - fp8.weight_bytes_per_chip == 2 * params
    assert kv_b_bytes(copies) - kv_b_bytes(fp8) == pytest.approx(params)
    assert copies.step_time_s(*step) > fp8.step_time_s(*step)
    bf16 = ComputeModel(model, chip, 8, "bf16", "bf16")
    views = ComputeModel(model, chip, 8, "bf16", "bf16", mla_absorbed_bf16=True)
    assert views.weight_bytes_per_chip == bf16.weight_bytes_per_chip
    assert views.step_time_s(*step) == bf16.step_time_s(*step)


def test_each_engine_keeps_mla_absorbed_weights_as_its_code_does():
    """vLLM's bf16 copies on every chip; SGLang's on CUDA (fp8 copies on ROCm, the same bytes as the checkpoint's);
    TensorRT-LLM's on Blackwell only (fp8 BMMs on Hopper) (engine/mla_weights.py)."""
    def extra_bytes(scheduler: str, chip: str) -> float:
        deployment = build_deployment(load_scenario("typical", {
            "model.name": "deepseek-v3", "model.precision": "fp8", "deployment.chip": chip, "deployment.chips": 8,
            "deployment.tp": 8, "engine.scheduler": scheduler}))
        fp8 = ComputeModel(load_model("deepseek-v3"), load_chip(chip), 8, "fp8", "bf16")
        return deployment.compute.weight_bytes_per_chip - fp8.weight_bytes_per_chip

    copies = 2 * 512 * (128 // 8) * (128 + 128) * 61
    assert extra_bytes("vllm-v1", "h200") == copies
    assert extra_bytes("trtllm", "h200") == 0
    assert extra_bytes("trtllm", "b200") == copies
    assert extra_bytes("prefill-first", "h200") == copies
    assert extra_bytes("prefill-first", "mi300x") == 0


def test_mxfp4_expert_scales_held_twice_with_the_copys_outputs_padded():
    """vLLM's Triton MXFP4 experts on Hopper keep the loaded scales and a copy padded to 256 outputs a GEMM
    (engine/mxfp4_weights.py). gpt-oss-120b (hidden 2,880, expert intermediate 2,880, 128 experts, 36 layers),
    one byte a scale per 32 inputs: on one chip the gate-and-up GEMM's 5,760 outputs pad to 5,888 and the down
    GEMM's 2,880 to 3,072, (5,888 + 3,072) x 2,880 / 32 bytes an expert and layer; at tp 2, 2 x 1,440 and
    2,880 outputs both pad to 3,072, of 2,880 and 1,440 inputs. Held, not streamed: a step's time is the same."""
    model, step = load_model("gpt-oss-120b"), (64, 64, 64 * 4096, 64 * 4096)
    for tp, chip_name, bytes_per_expert_layer in ((1, "h100", (5888 + 3072) * 2880 / 32),
                                                  (2, "h200", (3072 * 2880 + 3072 * 1440) / 32)):
        chip = load_chip(chip_name)
        once = ComputeModel(model, chip, tp, "bf16", "bf16", expert_precision="fp4")
        twice = ComputeModel(model, chip, tp, "bf16", "bf16", expert_precision="fp4",
                             mxfp4_layout=Mxfp4Layout(scale_copy_align=256))
        assert twice.weight_bytes_per_chip - once.weight_bytes_per_chip == pytest.approx(
            128 * 36 * bytes_per_expert_layer, rel=1e-12)
        assert twice.step_time_s(*step) == once.step_time_s(*step)
    # (on one chip 3,715,891,200 bytes, 3.46 GiB: vLLM 0.14.1 logs 3.7 beyond the checkpoint's 60.7)
    # an fp8 model's experts have no MXFP4 scales to copy
    mixtral = load_model("mixtral-8x7b")
    assert (ComputeModel(mixtral, chip, 2, "fp8", "bf16", mxfp4_layout=VLLM_MARLIN).weight_bytes_per_chip
            == ComputeModel(mixtral, chip, 2, "fp8", "bf16").weight_bytes_per_chip)


def test_mxfp4_experts_padded_hold_and_run_the_padded_shapes():
    """Marlin's layout (hidden to a multiple of 256, intermediate to 128): gpt-oss-120b's experts at 2,880 x
    2,880 become 3,072 x 2,944 on one chip, values and scales alike, 9.0% more bytes held; where no measured
    multiple stands for the kernels' time they also stream and multiply the padded shapes, and where one does
    (Hopper's, engine/expert_kernels.py) the padding is memory alone."""
    model, step = load_model("gpt-oss-120b"), (64, 64, 64 * 4096, 64 * 4096)
    grown = 3072 * 2944 / (2880 * 2880)
    experts_bytes = 128 * 36 * 3 * 2880 * 2880 * (0.5 + 1 / 32)  # values and a scale byte per 32

    def experts(cm: ComputeModel):
        return {op.name: op for op in cm.ops}["moe_experts"]

    for multiple in (1.0, 1.73):
        args = (model, load_chip("h100"), 1, "bf16", "bf16")
        kwargs = {"expert_precision": "fp4", "weight_only_expert_time": multiple}
        loaded, padded = ComputeModel(*args, **kwargs), ComputeModel(*args, mxfp4_layout=VLLM_MARLIN, **kwargs)
        assert padded.weight_bytes_per_chip - loaded.weight_bytes_per_chip == pytest.approx(
            experts_bytes * (grown - 1), rel=1e-12)
        ratio = experts(padded).bytes_per_expert / experts(loaded).bytes_per_expert
        assert ratio == pytest.approx(grown if multiple == 1.0 else 1.0, rel=1e-12)
        assert experts(padded).flops_per_token / experts(loaded).flops_per_token == pytest.approx(ratio, rel=1e-12)
        assert (padded.step_time_s(*step) > loaded.step_time_s(*step)) == (multiple == 1.0)


@pytest.mark.parametrize(("scheduler", "chip", "version", "hidden", "intermediate", "copied"), [
    ("vllm-v1", "h100", None, 2880, 2880, True),  # the newest release; 2,880 is a multiple of 64
    ("vllm-v1", "h100", "0.11.1", 2880, 2880, True),
    ("vllm-v1", "h200", "0.14.1", 2880, 2880, True),
    ("vllm-v1", "h100", "0.11.0", 2880, 2880, False),  # built on torch 2.8.0: no swizzle on Hopper
    ("vllm-v1", "h100", "0.10.2", 2880, 2880, False),
    ("vllm-v1", "a100", None, 3072, 2944, False),  # Marlin
    ("vllm-v1", "b200", None, 3072, 3072, False),  # FlashInfer's TRT-LLM-gen MoE
    ("prefill-first", "h100", None, 2880, 2880, False),
    ("trtllm", "h100", None, 2880, 2880, False),
])
def test_each_engine_lays_out_mxfp4_experts_as_its_code_does(scheduler, chip, version, hidden, intermediate, copied):
    settings = {"model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4",
                "deployment.chip": chip, "deployment.chips": 1, "deployment.tp": 1, "engine.scheduler": scheduler}
    if version is not None:
        settings["engine.version"] = version
    deployment = build_deployment(load_scenario("typical", settings))
    loaded = ComputeModel(load_model("gpt-oss-120b"), load_chip(chip), 1, "bf16", "bf16", expert_precision="fp4")
    padding = 128 * 36 * 3 * (hidden * intermediate - 2880 * 2880) * (0.5 + 1 / 32)
    assert deployment.compute.weight_bytes_per_chip - loaded.weight_bytes_per_chip == pytest.approx(
        padding + (3_715_891_200 if copied else 0), rel=1e-12)


_MODELS = {name: compute_model(name) for name in ("llama-3.1-70b", "mixtral-8x7b", "deepseek-v3")}


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(_MODELS)),
    base=st.tuples(st.integers(0, 20_000), st.integers(0, 2_000), st.floats(0, 1e9), st.floats(0, 1e7),
                   st.floats(0, 1e6)),
    which=st.integers(0, 4),
    delta=st.floats(0, 1e6),
)
def test_step_time_is_monotone_in_each_argument(name, base, which, delta):
    cm = _MODELS[name]
    bigger = list(base)
    bigger[which] += int(delta) if which < 2 else delta
    assert cm.step_time_s(*bigger) >= cm.step_time_s(*base)


# -- memory ------------------------------------------------------------------------------------------

def test_activation_reserve_closed_form():
    cm = compute_model()
    tokens = 8192
    per_token = (2 * 8192 + 3 * 28672 / 8) * ACTIVATION_BYTES
    logits = RESERVED_LOGIT_ROWS * 128256 / 8 * 4
    assert cm.activation_reserve_bytes(tokens) == pytest.approx(tokens * per_token + logits + RUNTIME_RESERVE_BYTES)


def test_the_logits_reserved_are_a_row_per_sequence_up_to_the_engines_cap():
    cm = compute_model()
    row = 128256 / 8 * 4  # fp32 logits of the vocabulary's share on one of 8 chips
    assert cm.activation_reserve_bytes(8192, 1024) - cm.activation_reserve_bytes(8192) == pytest.approx(
        (1024 - RESERVED_LOGIT_ROWS) * row)
    assert cm.activation_reserve_bytes(512, 1024) - cm.activation_reserve_bytes(512, 64) == pytest.approx(
        (512 - 64) * row)  # no more rows than the step's tokens


def test_kv_capacity_closed_form():
    cm = compute_model()
    free = 141 * 2**30 * 0.9 - cm.weight_bytes_per_chip - cm.activation_reserve_bytes(8192)
    assert cm.kv_capacity_tokens(0.9, 8192) == int(free // (327_680 / 8))


def test_405b_fp8_on_one_h100_does_not_fit():
    cm = compute_model("llama-3.1-405b", chip="h100", tp=1, weights="fp8")
    with pytest.raises(UserError, match=r"model llama-3.1-405b \(\d+\.\d GiB of weights per chip at fp8, tp=1, pp=1\) "
                                        r"does not fit in h100's 80 GiB HBM; raise --tp or use a lower precision"):
        cm.kv_capacity_tokens(0.9, 8192)


def test_weights_that_fit_the_chip_but_not_the_engine_s_share_name_the_share():
    """70B fp8 at TP8: 8.5 GiB a chip, more than 5% of an H200's 141 GiB, far less than all of it."""
    cm = compute_model(tp=8)
    with pytest.raises(UserError, match=r"does not fit in the 7\.05 GiB the engine takes of h200's 141 GiB HBM "
                                        r"\(gpu_memory_utilization=0\.05\); raise "
                                        r"engine\.gpu_memory_utilization"):
        cm.kv_capacity_tokens(0.05, 8192)


def test_weights_larger_than_the_chip_are_refused_whatever_the_share_covers():
    """SGLang's share covers the weights and the pool alone: no share of an H100 holds 70B at bf16, so the
    error says raise --tp, not the share."""
    cm = compute_model("llama-3.1-70b", chip="h100", tp=1, weights="bf16")
    for covers in ("all", "weights_and_kv", "free_memory"):
        with pytest.raises(UserError, match=r"does not fit in h100's 80 GiB HBM; raise --tp or use a lower "
                                            r"precision$"):
            cm.kv_capacity_tokens(0.9, 8192, share_covers=covers)


def test_activations_crowding_out_kv_is_reported():
    cm = compute_model("llama-3.1-8b", chip="tpu-v6e", tp=1, weights="bf16")
    with pytest.raises(UserError, match="leaves no room for KV cache .* lower max_batched_tokens"):
        cm.kv_capacity_tokens(0.9, 1_000_000)


def test_bad_arguments_are_user_errors():
    with pytest.raises(UserError, match="tp=3 does not divide the 64 attention heads"):
        compute_model(tp=3)
    with pytest.raises(UserError, match="weight_precision: unknown precision 'int4'"):
        compute_model(weights="int4")
    with pytest.raises(UserError, match="kv_precision"):
        compute_model(kv="fp6")
    with pytest.raises(UserError, match="gpu_memory_utilization"):
        compute_model().kv_capacity_tokens(1.5, 8192)


def test_an_overlapped_host_costs_only_what_the_gpu_does_not_hide():
    model, chip = load_model("llama-3.1-8b"), load_chip("h100")
    gpu = ComputeModel(model, chip, 1, "fp8", "bf16")
    for host_s, per_seq_s in ((1e-3, 10e-6), (20e-3, 0.0)):
        hidden = ComputeModel(model, chip, 1, "fp8", "bf16", host_step_s=host_s, host_per_sequence_s=per_seq_s,
                              host_overlapped=True)
        in_path = ComputeModel(model, chip, 1, "fp8", "bf16", host_step_s=host_s, host_per_sequence_s=per_seq_s)
        for args in [(1, 1, 500, 500), (64, 64, 64_000, 64_000), (4096, 4, 4096 * 2048, 4096)]:
            gpu_s, host = gpu.step_time_s(*args), host_s + per_seq_s * args[1]
            assert hidden.step_time_s(*args) == pytest.approx(max(gpu_s, host), rel=1e-12)
            assert in_path.step_time_s(*args) == pytest.approx(gpu_s + host, rel=1e-12)


def test_deepseek_v3s_heaviest_pipeline_stage_holds_expert_layers_only():
    """Its first 3 layers have a dense MLP instead of experts (first_k_dense_replace): the first stage holds
    them, so the last stage's 30 expert layers and LM head are the heaviest, worked out here by hand (TP8,
    fp8 weights; the router, latent norms, norms and head bf16)."""
    h, layers = 7168, 30
    attention = h * 1536 + 1536 * 128 * 192 / 8 + h * 576 + 512 * 128 * 256 / 8 + 128 * 128 * h / 8
    latent_norms = (1536 + 512) * 2.0
    experts = 256 * 3 * h * 2048 / 8 + 3 * h * 2048 / 8 + h * 256 * 2.0  # routed, shared, router
    norms = 2 * h * 2.0
    head = 129_280 / 8 * h * 2.0
    staged = ComputeModel(load_model("deepseek-v3"), load_chip("h100"), 8, "fp8", "bf16", pp=2)
    # (the final norm, h bf16 weights, is spread over the layers)
    assert staged.weight_bytes_per_chip == pytest.approx(layers * (attention + latent_norms + experts + norms) + head,
                                                         rel=1e-4)
    assert staged.weight_bytes_per_chip / 2**30 == pytest.approx(40.87, abs=0.01)  # 40.28 with an average layer


def test_a_dense_models_pipeline_stage_holds_its_share_of_layers_and_the_head():
    whole = ComputeModel(load_model("llama-3.1-70b"), load_chip("h100"), 4, "fp8", "bf16")
    staged = ComputeModel(load_model("llama-3.1-70b"), load_chip("h100"), 4, "fp8", "bf16", pp=2)
    resident = {op.name: op.resident_bytes for op in whole.ops}
    per_layer = (sum(resident.values()) - resident["embedding"] - resident["lm_head"]) / 80
    assert staged.weight_bytes_per_chip == pytest.approx(40 * per_layer + resident["lm_head"], rel=1e-12)


def test_weight_only_gemms_launch_no_input_quantization():
    """A weight-only precision (fp8 on A100, MXFP4 experts on H100) multiplies the bf16 input as it is, so its
    GEMMs launch the kernels bf16 weights do; fp8 on H100 quantizes each GEMM's input first."""
    def kernels(chip, weights):
        return compute_model("llama-3.1-8b", chip, 1, weights).kernels_per_step
    assert kernels("a100", "fp8") == kernels("a100", "bf16")
    # On H100 each layer's four GEMMs (qkv, o, gate_up, down) add their input's quantization: 32 x 4 more.
    assert kernels("h100", "fp8") == kernels("h100", "bf16") + 32 * 4
    model = load_model("gpt-oss-120b")
    experts = {chip: {op.name: op for op in ComputeModel(model, load_chip(chip), 1, "bf16", "bf16",
                                                         expert_precision="fp4").ops}["moe_experts"]
               for chip in ("h100", "b200")}
    assert experts["h100"].kernels == 5 * 36  # routed experts' kernels, no quantization
    assert experts["b200"].kernels == 7 * 36  # and on FP4 tensor cores the two inputs' quantization


def test_expert_parallel_over_more_chips_than_divide_the_experts_takes_the_busiest_chips_experts():
    """Mixtral's 8 experts placed whole over 16 chips: one on each of 8 chips (vLLM's determine_expert_map),
    so the busiest chip holds a whole expert a layer, not half of one, and runs a quarter of the routed tokens
    (top-2 of 8)."""
    model, chip = load_model("mixtral-8x7b"), load_chip("h100")
    tp, ep = (ComputeModel(model, chip, 16, "bf16", "bf16", expert_parallel=ep) for ep in (False, True))
    expert_bytes = 3 * 4096 * 14336 * 32 * 2  # one expert in every layer, bf16
    assert ep.weight_bytes_per_chip == pytest.approx(tp.weight_bytes_per_chip + expert_bytes - 8 * expert_bytes / 16,
                                                     rel=1e-12)
    experts = {cm: {op.name: op for op in cm.step_ops(1, 1, 1000, 1000)}["moe_experts"] for cm in (tp, ep)}
    assert experts[ep].flops == pytest.approx(2 * experts[tp].flops, rel=1e-12)
    # A token reaches the busiest chip's one expert with probability 2/8: a quarter of an expert's weights read.
    assert experts[ep].bytes == pytest.approx(2 * experts[tp].bytes, rel=1e-12)
    assert experts[ep].bytes > expert_bytes / 4
    # Where tp divides the experts the placement is even: DeepSeek-V3's 256 over 8.
    deepseek = load_model("deepseek-v3")
    even = [ComputeModel(deepseek, chip, 8, "fp8", "fp8", expert_parallel=ep).weight_bytes_per_chip for ep in (0, 1)]
    assert even[0] == even[1]


def test_experts_dispatched_by_all_to_all_move_only_their_own_copies_activations():
    """DeepEP sends a chip the token copies routed to its experts: DeepSeek-V3's top-8 of 256 over 8 chips reach
    one copy a token on average, a whole expert wide (gather h, 2I out, 2I + I through the activation, I in,
    h out), where a chip that holds every token (tensor parallelism, or an expert map after a gather) handles
    all eight copies, at its share of the width or writing them."""
    model, chip = load_model("deepseek-v3"), load_chip("h200")
    h, inter, layers = 7168, 2048, 58
    def experts(**kw):
        ops = ComputeModel(model, chip, 8, "fp8", "bf16", **kw).ops
        return next(op for op in ops if op.name == "moe_experts")
    dispatched = experts(expert_parallel=True, expert_dispatch=True)
    assert dispatched.bytes_per_token == pytest.approx(1 * (2 * h + 6 * inter) * 2 * layers, rel=1e-12)
    gathered = experts(expert_parallel=True)
    assert gathered.bytes_per_token == experts().bytes_per_token == pytest.approx(
        8 * (2 * h + 6 * inter / 8) * 2 * layers, rel=1e-12)
    # the FLOPs and the weights read are the same either way
    assert dispatched.flops_per_token == gathered.flops_per_token
    assert dispatched.bytes_per_expert == gathered.bytes_per_expert
