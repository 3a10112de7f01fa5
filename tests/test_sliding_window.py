"""Sliding-window attention: its layers' attention pairs and KV reads capped at the window, and the KV
cache they hold, against per-sequence sums and closed forms."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.compute import ComputeModel, load_chip, load_model

WINDOW = 4096
LLAMA_8B = load_model("llama-3.1-8b")


def with_window(sliding_layers: int, window: int = WINDOW):
    return dataclasses.replace(LLAMA_8B, sliding_window=window, sliding_layers=sliding_layers)


def compute(model, chip="h100") -> ComputeModel:
    return ComputeModel(model, load_chip(chip), 1, "bf16", "bf16")


def attention_row(cm: ComputeModel, tokens, logits, pairs, reads):
    return next(op for op in cm.step_ops(tokens, logits, pairs, reads) if op.name == "attention")


def test_long_decode_costs_what_the_window_holds():
    """Every query past the window: a sliding model's decode step is the full model's at context W."""
    batch, context = 64, 20_000
    pairs = batch * (context + 1)
    slides, full = compute(with_window(32)), compute(LLAMA_8B)
    assert slides.step_time_s(batch, batch, pairs, pairs) == full.step_time_s(batch, batch, batch * WINDOW,
                                                                             batch * WINDOW)
    assert slides.step_time_s(batch, batch, pairs, pairs) < 0.5 * full.step_time_s(batch, batch, pairs, pairs)


def test_within_the_window_nothing_changes():
    batch, context = 64, 1000
    pairs = batch * (context + 1)
    prefill_pairs = 2000 * 2001 // 2
    for cm_args in ((batch, batch, pairs, pairs), (2000, 0, prefill_pairs, 2000)):
        assert compute(with_window(32)).step_time_s(*cm_args) == compute(LLAMA_8B).step_time_s(*cm_args)


def test_half_the_layers_slide():
    """gpt-oss style: the attention row's FLOPs are half the full pairs and half the capped ones."""
    batch, context = 16, 10_000
    pairs = batch * (context + 1)
    row = attention_row(compute(with_window(16)), batch, batch, pairs, pairs)
    full = attention_row(compute(LLAMA_8B), batch, batch, pairs, pairs)
    assert row.flops == pytest.approx(full.flops * (0.5 + 0.5 * WINDOW / (context + 1)), rel=1e-12)
    assert row.bytes < full.bytes


@settings(max_examples=200, deadline=None)
@given(sequences=st.lists(st.tuples(st.integers(0, 3 * WINDOW), st.integers(1, 2 * WINDOW)), min_size=1, max_size=8),
       decodes=st.lists(st.integers(0, 3 * WINDOW), max_size=30))
def test_aggregates_bound_the_per_sequence_sums(sequences, decodes):
    """At most one chunk is part-way through its prompt: that one samples no token."""
    chunks = [(p, q) for p, q in sequences]
    tokens = sum(q for _, q in chunks) + len(decodes)
    logits = len(decodes) + len(chunks) - 1
    pairs = sum(q * p + q * (q + 1) // 2 for p, q in chunks) + sum(c + 1 for c in decodes)
    reads = sum(p + q for p, q in chunks) + sum(c + 1 for c in decodes)
    exact_pairs = sum(min(p + j, WINDOW) for p, q in chunks for j in range(1, q + 1)) + sum(
        min(c + 1, WINDOW) for c in decodes)
    exact_reads = sum(min(p + q, WINDOW - 1 + q) for p, q in chunks) + sum(min(c + 1, WINDOW) for c in decodes)
    capped_pairs, capped_reads = compute(with_window(32)).attention_aggregates(tokens, logits, pairs, reads)
    assert exact_pairs <= capped_pairs <= pairs
    assert exact_reads <= capped_reads <= reads
    if all(p >= WINDOW for p, _ in chunks) and all(c + 1 >= WINDOW for c in decodes):
        assert capped_pairs == exact_pairs  # every query past its window: exact
    if all(p + q <= WINDOW for p, q in chunks) and all(c + 1 <= WINDOW for c in decodes):
        assert (capped_pairs, capped_reads) == (exact_pairs, exact_reads)  # all within: exact


def test_kv_cache_bytes_of_one_sequence():
    cm = compute(with_window(16))
    per_layer = 2 * 8 * 128 * 2
    assert cm.kv_cache_bytes_per_chip(1000) == 32 * per_layer * 1000
    assert cm.kv_cache_bytes_per_chip(10_000) == 16 * per_layer * 10_000 + 16 * per_layer * WINDOW


def test_kv_capacity_never_overcommits_and_beats_charging_every_layer():
    half, full = compute(with_window(16)), compute(LLAMA_8B)
    seqs = 64
    free = full.kv_capacity_tokens(0.9, 8192, max_num_seqs=seqs) * full.kv_bytes_per_token_per_chip
    assert half.kv_capacity_tokens(0.9, 8192) == full.kv_capacity_tokens(0.9, 8192)  # no bound on sequences
    tokens = half.kv_capacity_tokens(0.9, 8192, max_num_seqs=seqs)
    per_layer = 2 * 8 * 128 * 2
    assert tokens == pytest.approx((free - seqs * WINDOW * 16 * per_layer) / (16 * per_layer), abs=2)
    # The worst case it allows: every sequence holds its window in the sliding layers.
    assert seqs * half.kv_cache_bytes_per_chip(tokens // seqs) <= free + per_layer * 32
    assert tokens > 1.4 * full.kv_capacity_tokens(0.9, 8192)


@pytest.mark.parametrize(("block", "held"), [(16, 144), (64, 192), (128, 256), (1, 128)])
def test_a_window_past_is_held_in_whole_blocks(block, held):
    """vLLM V1 frees the blocks wholly before the last window - 1 tokens (SlidingWindowManager.
    remove_skipped_blocks): a sequence past the window may hold ceil((window - 1) / block) + 1 blocks."""
    gpt_oss = ComputeModel(load_model("gpt-oss-120b"), load_chip("h200"), 1, "bf16", "bf16", expert_precision="fp4")
    assert gpt_oss.sliding_kv_bytes_per_token_per_chip == 18 * 2 * 8 * 64 * 2  # 18 sliding layers, 8 KV heads of 64
    exact = gpt_oss.kv_capacity_tokens(0.9, 8192, 1024)
    # the window bound: (free - 1024 sequences x held tokens x sliding bytes) / the full layers' bytes, these equal
    assert exact - gpt_oss.kv_capacity_tokens(0.9, 8192, 1024, block_size=block) == 1024 * (held - 128)


def test_gpt_oss_on_an_h200_under_vllm_0_10_2_holds_its_windows_in_16_token_blocks():
    from tokenpath.sim.deployment import build_deployment
    deployment = build_deployment(load_scenario(None, {
        "model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4",
        "deployment.chip": "h200", "deployment.chips": 1, "deployment.tp": 1, "engine.version": "0.10.2"}))
    assert deployment.engine.block_size == 16
    assert deployment.kv_capacity_tokens == 1_594_680  # 1,611,064 with each window held as exactly 128 tokens


@pytest.mark.parametrize("ratio", [None, 0.8])
def test_attention_data_parallel_ranks_hold_their_own_windows(ratio):
    """Each attention rank holds its own sequences' KV, sliding layers as one chip alone holds them: the replica
    holds tp times what a tp=1 chip of the same memory holds for a rank's sequences."""
    def gpt_oss(tp, dp):
        return ComputeModel(load_model("gpt-oss-120b"), load_chip("h200"), tp, "bf16", "bf16",
                            expert_precision="fp4", attention_dp=dp)
    ranks = gpt_oss(2, True).kv_capacity_tokens(0.9, 8192, 128, sliding_pool_ratio=ratio, block_size=16)
    every_layer = gpt_oss(2, True).kv_capacity_tokens(0.9, 8192, 128, sliding_pool_ratio=1.0, block_size=16)
    assert ranks > 1.1 * every_layer  # the windows' blocks freed (or SGLang's 0.8 pool), not every layer charged
    # one rank's memory: a chip of its weights (half the experts, every attention layer) and its 128 sequences
    one = gpt_oss(2, True)
    per_token, sliding = one.kv_bytes_per_token_per_chip, one.sliding_kv_bytes_per_token_per_chip
    assert per_token == gpt_oss(1, False).kv_bytes_per_token_per_chip  # a rank's token: every KV head
    free = every_layer // 2 * per_token
    if ratio is None:
        expected = (free - 128 * 144 * sliding) // (per_token - sliding)  # 144: a 128-token window in 16-token blocks
    else:
        expected = free // (per_token - sliding + ratio * sliding)
    assert ranks == pytest.approx(2 * expected, abs=2 * 2)


def test_a_pool_sized_at_a_ratio_of_the_full_layers_tokens_holds_that_many():
    half, full = compute(with_window(16)), compute(LLAMA_8B)
    free = full.kv_capacity_tokens(0.9, 8192, max_num_seqs=64) * full.kv_bytes_per_token_per_chip
    per_layer = 2 * 8 * 128 * 2
    # SGLang's hybrid pool: each token costs the 16 full layers' bytes and 0.8 of the 16 sliding layers'.
    assert half.kv_capacity_tokens(0.9, 8192, max_num_seqs=64, sliding_pool_ratio=0.8) == pytest.approx(
        free / (16 * per_layer + 0.8 * 16 * per_layer), abs=2)
    # With hybrid memory off every layer holds every token, however few the sequences.
    assert half.kv_capacity_tokens(0.9, 8192, max_num_seqs=64, sliding_pool_ratio=1.0) == full.kv_capacity_tokens(
        0.9, 8192, max_num_seqs=64)


@pytest.mark.parametrize(("release", "generation", "speculative", "ratio"), [
    ("0.5.6", "Hopper", False, 1.0),      # hybrid memory off for gpt-oss up to 0.5.7
    ("0.5.8", "Hopper", False, 0.8),      # on from 0.5.8 ...
    ("0.5.9", "Blackwell", False, 1.0),   # ... but off with trtllm_mha, Blackwell's default backend
    ("0.5.9", "Hopper", True, 1.0),       # ... and with a drafter
    ("0.5.10", "Blackwell", True, 0.8),   # on from 0.5.10
    (None, "Hopper", False, 0.8),         # no release stated: the newest
])
def test_sglang_holds_gpt_oss_sliding_layers_by_release(release, generation, speculative, ratio):
    from tokenpath.engine.sliding_pool import sglang_sliding_pool_ratio
    assert sglang_sliding_pool_ratio(release, generation, speculative, "GptOssForCausalLM") == ratio


@pytest.mark.parametrize("architecture", ["MistralForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM",
                                          "Phi3ForCausalLM", ""])
def test_sglang_gives_a_hybrid_pool_only_to_the_architectures_it_lists(architecture):
    # SGLang's is_hybrid_swa_model lists gpt-oss, Llama 4, Gemma 4 and a few others; every other sliding-window
    # model (Mistral 7B v0.1's every layer, Gemma 3's five of six) holds every token in every layer.
    from tokenpath.engine.sliding_pool import sglang_sliding_pool_ratio
    assert sglang_sliding_pool_ratio(None, "Hopper", False, architecture) == 1.0
    assert sglang_sliding_pool_ratio(None, "Hopper", False, "Llama4ForConditionalGeneration") == 0.8


def test_sglang_0_5_6_charges_gpt_oss_every_layer_where_vllm_frees_the_window():
    from tokenpath.sim.deployment import build_deployment
    base = {"model.name": "gpt-oss-120b", "deployment.chip": "h200", "deployment.chips": 1, "deployment.tp": 1,
            "model.precision": "bf16", "model.expert_precision": "fp4", "engine.gpu_memory_utilization": 0.9}
    sglang = build_deployment(load_scenario("typical", {**base, "engine.scheduler": "prefill-first",
                                                         "engine.version": "0.5.6"}))
    vllm = build_deployment(load_scenario("typical", base))
    every_layer = dataclasses.replace(sglang.compute.model, sliding_window=0, sliding_layers=0)
    assert sglang.kv_capacity_tokens == ComputeModel(every_layer, load_chip("h200"), 1, "bf16", "bf16",
                                                     expert_precision="fp4").kv_capacity_tokens(
        0.9, 8192, share_covers="weights_and_kv")
    assert vllm.kv_capacity_tokens > 1.5 * sglang.kv_capacity_tokens


def test_kv_capacity_when_every_layer_slides():
    cm = compute(with_window(32))
    assert cm.kv_capacity_tokens(0.9, 8192, max_num_seqs=8) == 8 * LLAMA_8B.max_context
    # Too many sequences for their windows to fit: every token charged to every layer.
    assert cm.kv_capacity_tokens(0.9, 8192, max_num_seqs=10_000) == compute(LLAMA_8B).kv_capacity_tokens(
        0.9, 8192, max_num_seqs=10_000)


def test_mistral_7b_decodes_long_contexts_faster_than_without_its_window(tmp_path):
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
              "tie_word_embeddings": False, "vocab_size": 32000}
    tpot, capacity = {}, {}
    for name, window in (("sliding", 4096), ("full", None)):
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**config, "sliding_window": window}))
        scenario = load_scenario(None, {
            "model.name": str(path), "model.precision": "bf16", "deployment.chip": "h100",
            "deployment.chips": 1, "deployment.tp": 1, "engine.max_num_seqs": 16, "workload.num_requests": 16,
            "workload.input": {"kind": "fixed", "value": 16_000}, "workload.output": {"kind": "fixed", "value": 64},
            "workload.arrival": {"rate": "inf"}})
        sim = simulate(scenario)
        run = sim.run
        tpot[name] = float(((run.e2e_ns - run.ttft_ns) / (run.output_tokens - 1)).mean())
        capacity[name] = sim.deployment.kv_capacity_tokens
    assert tpot["sliding"] < 0.9 * tpot["full"]
    # 16 sequences' windows fit beside the weights: each may reach the model's whole context.
    assert capacity["sliding"] == 16 * 32768 > capacity["full"]


def test_pipeline_batches_under_one_running_cap_set_aside_its_windows_once():
    """gpt-oss-120b over pp = 2 stages of 18 layers (9 sliding, 9 full): with 1024 sequences at most in flight,
    the window bound sets aside 1024 windows of 144 tokens (16-token blocks) in the sliding layers, not 2048 as
    two batches capped apart would; the sliding and full layers weigh the same, so 147,456 tokens more."""
    staged = ComputeModel(load_model("gpt-oss-120b"), load_chip("h200"), 1, "bf16", "bf16", pp=2,
                          expert_precision="fp4")
    assert staged.sliding_kv_bytes_per_token_per_chip * 2 == staged.kv_bytes_per_token_per_chip
    apart = staged.kv_capacity_tokens(0.9, 8192, 1024, block_size=16)
    shared = staged.kv_capacity_tokens(0.9, 8192, 1024, block_size=16, batches_share_running_cap=True)
    assert shared - apart == 1024 * 144


def test_vllm_v1_s_pipeline_holds_gpt_oss_s_windows_for_its_one_running_cap():
    """vLLM V1, pp = 2 on two H200s: 1024 requests run at most over both batches in flight, so the pool sets aside
    1024 windows of 192 tokens (its 64-token blocks), each batch half of it: 2,770,163 tokens a batch, not the
    2,671,859 that 2048 windows leave (98,304 = 1024 x 192 / 2). (Beside a stage's weights and the copy of its
    experts' scales, engine/mxfp4_weights.py.)"""
    from tokenpath.sim.deployment import build_deployment
    deployment = build_deployment(load_scenario(None, {
        "model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4",
        "deployment.chip": "h200", "deployment.chips": 2, "deployment.tp": 1, "deployment.pp": 2}))
    assert deployment.engine.max_num_seqs == 512 and deployment.engine.block_size == 64
    assert deployment.kv_capacity_tokens == 2_770_163
