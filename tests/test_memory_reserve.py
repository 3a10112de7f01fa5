"""What a chip's memory holds besides the KV cache: fp4 weights with their block scales (NVFP4's one byte
per 16 weights, MXFP4's one per 32, also streamed each step), and the sampler's share of the engine's
memory profile."""

import pytest

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.precision import stored_bytes
from tokenpath.compute.roofline import ComputeModel


@pytest.mark.parametrize(("precision", "fp4_format", "expected"), [
    ("fp4", "nvfp4", 0.5625), ("fp4", "mxfp4", 0.53125), ("fp8", "nvfp4", 1.0), ("bf16", "mxfp4", 2.0),
    ("fp16", "nvfp4", 2.0)])
def test_stored_bytes_add_a_one_byte_scale_per_block_to_fp4_only(precision, fp4_format, expected):
    assert stored_bytes(precision, fp4_format) == expected


def _weights(model: str, chip: str, precision: str, **kwargs) -> dict[str, float]:
    compute = ComputeModel(load_model(model), load_chip(chip), 1, precision, "bf16", **kwargs)
    return {op.name: op.resident_bytes for op in compute.ops}


def test_fp4_weights_take_the_chips_own_format_where_the_checkpoint_names_none():
    bf16 = _weights("llama-3.1-8b", "b200", "bf16")
    nvfp4 = _weights("llama-3.1-8b", "b200", "fp4")           # NVIDIA: NVFP4
    mxfp4 = _weights("llama-3.1-8b", "mi300x", "fp4")         # AMD: MXFP4 (weight-only there)
    for name in ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"):
        assert nvfp4[name] == pytest.approx(bf16[name] * 0.5625 / 2)
        assert mxfp4[name] == pytest.approx(bf16[name] * 0.53125 / 2)


def test_a_checkpoints_own_format_holds_on_every_chip():
    bf16 = _weights("gpt-oss-120b", "b200", "bf16")
    for chip in ("b200", "h100", "mi300x"):  # gpt-oss ships MXFP4 experts, which NVIDIA chips run as they are
        experts = _weights("gpt-oss-120b", chip, "bf16", expert_precision="fp4")["moe_experts"]
        assert experts == pytest.approx(bf16["moe_experts"] * 0.53125 / 2)


def test_gpt_oss_120b_on_one_h100_holds_its_checkpoints_bytes_and_the_kv_cache_what_is_left():
    """The checkpoint: 36 layers of 128 experts of 3 x 2880 x 2880 MXFP4 weights (60.9 GB with their
    scales), beside bf16 attention (qkv 2880 x 5120, o 4096 x 2880), router and untied embeddings."""
    model, chip = load_model("gpt-oss-120b"), load_chip("h100")
    compute = ComputeModel(model, chip, 1, "bf16", "bf16", expert_precision="fp4")
    experts = 36 * 128 * 3 * 2880 * 2880 * (0.5 + 1 / 32)
    bf16 = 2 * (36 * (2880 * 5120 + 4096 * 2880 + 2880 * 128) + 2 * 201088 * 2880)
    assert compute.weight_bytes_per_chip == pytest.approx(experts + bf16, rel=0.002)  # norms left out
    free = chip.hbm_bytes * 0.9 - compute.weight_bytes_per_chip - compute.activation_reserve_bytes(8192)
    # Every layer's K and V (8 heads of 64, bf16) for each token: the bound that holds while sequences are short.
    assert compute.kv_capacity_tokens(0.9, 8192) == int(free // (36 * 2 * 8 * 64 * 2))


def _deployment(scheduler: str, **more):
    from tokenpath.sim.deployment import build_deployment
    from tokenpath.sim.scenario import load_scenario

    overrides = {"model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4",
                 "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1, "engine.scheduler": scheduler,
                 "engine.max_num_seqs": 1024, "engine.max_num_batched_tokens": 8192,
                 "engine.gpu_memory_utilization": 0.9, **more}
    return build_deployment(load_scenario("typical", overrides))


def test_vllms_memory_profile_runs_its_sampler_and_the_kv_cache_gives_up_its_temporaries():
    """vLLM samples a logit row per sequence with top-k and top-p in its memory profile, where the fp32
    logits alone would take 4 bytes a logit. gpt-oss-120b on one H100 (201,088 logits a row): 1,024 rows
    x 20 bytes more, 4.1 GB, out of a KV cache of 73.7 KB a token."""
    vllm = _deployment("vllm-v1")
    logits_alone = _deployment("vllm-v1", **{"assumptions.sampler_profile_bytes_per_logit": 4})
    compute = vllm.compute
    assert compute.activation_reserve_bytes(8192, 1024, 24) / 2**30 == pytest.approx(6.40, abs=0.01)
    per_token = 36 * 2 * 8 * 64 * 2
    assert logits_alone.kv_capacity_tokens - vllm.kv_capacity_tokens == pytest.approx(
        1024 * 201088 * 20 / per_token, abs=1)


def test_vllms_sampler_holds_the_whole_vocabulary_on_every_chip():
    """The LM head splits the vocabulary over the tensor-parallel chips, but vLLM V1 all-gathers the
    logits and every rank samples: at TP8 its reserve is the whole vocabulary's, the fp32 logits an
    eighth of it."""
    compute = ComputeModel(load_model("llama-3.1-70b"), load_chip("h200"), 8, "fp8", "bf16")
    without = compute.activation_reserve_bytes(8192, 1024) - 1024 * 128256 / 8 * 4
    assert compute.activation_reserve_bytes(8192, 1024, 24) - without == pytest.approx(1024 * 128256 * 24)
