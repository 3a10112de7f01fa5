"""MXFP4 routed experts run weight-only (engine/expert_kernels.py): each engine's measured multiple of the
roofline, on the chips a table measured, and nowhere else."""

from __future__ import annotations

import pytest

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel, op_time_s
from tokenpath.config.assumptions import default
from tokenpath.engine.expert_kernels import weight_only_expert_time
from tokenpath.engine.profiles import PROFILES
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import load_scenario

ENGINES = {"vllm-v1": "vllm", "vllm-v0": "vllm", "prefill-first": "sglang", "trtllm": "trtllm"}


def test_each_profile_takes_its_engine_s_figure_on_hopper_alone():
    for name, engine in ENGINES.items():
        work = PROFILES[name].mxfp4_weight_only_experts
        assert work == f"{engine}_mxfp4_weight_only_expert_time"
        assert weight_only_expert_time(work, "Hopper") == default(work)
        for generation in ("Blackwell", "Ampere", "CDNA3"):  # no table measures these
            assert weight_only_expert_time(work, generation) == 1.0
    assert (default("vllm_mxfp4_weight_only_expert_time"), default("sglang_mxfp4_weight_only_expert_time"),
            default("trtllm_mxfp4_weight_only_expert_time")) == (1.73, 4.42, 1.67)


def _experts_s(model: str, chip: str, multiple: float, tokens: int = 64, **precisions) -> tuple[float, float]:
    """(the routed experts' roofline time at `tokens`, the weights a chip holds) under `multiple`."""
    compute = ComputeModel(load_model(model), load_chip(chip), 1, precisions.pop("precision", "bf16"), "bf16",
                           weight_only_expert_time=multiple, **precisions)
    touched = compute.experts_touched(tokens)
    bandwidth = compute.chip.effective_hbm_bw_Bps
    time_s = sum(op_time_s(op.compute_s(tokens, 0, 0, 0), op.bytes(tokens, 0, 0, touched) / bandwidth, op.gemm,
                           compute.gemm_overlap_norm) for op in compute.ops if op.name == "moe_experts")
    return time_s, compute.weight_bytes_per_chip


def test_weight_only_mxfp4_experts_take_the_multiple_and_keep_their_weights():
    """Hand-built: gpt-oss-120b's MXFP4 experts on one H100 (fp4 weight-only there) at 64 and 1,024 tokens."""
    for tokens in (64, 1024):
        base_s, base_bytes = _experts_s("gpt-oss-120b", "h100", 1.0, tokens, expert_precision="fp4")
        slow_s, slow_bytes = _experts_s("gpt-oss-120b", "h100", 2.5, tokens, expert_precision="fp4")
        assert slow_s == pytest.approx(2.5 * base_s) and slow_bytes == base_bytes


def test_native_fp4_and_other_precisions_keep_the_roofline():
    # B200 multiplies FP4 natively; bf16 experts on an H100 are not weight-only.
    assert _experts_s("gpt-oss-120b", "b200", 3.0, expert_precision="fp4") == \
        _experts_s("gpt-oss-120b", "b200", 1.0, expert_precision="fp4")
    assert _experts_s("qwen3-30b-a3b", "h100", 3.0) == _experts_s("qwen3-30b-a3b", "h100", 1.0)


def test_a_deployment_s_engine_picks_the_figure_and_an_override_moves_it():
    base = {"model.name": "gpt-oss-120b", "model.precision": "bf16", "model.expert_precision": "fp4",
            "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1}

    def experts_rate(overrides: dict) -> float:
        compute = build_deployment(load_scenario("typical", {**base, **overrides})).compute
        return next(op.flops_per_s for op in compute.ops if op.name == "moe_experts")

    vllm, sglang = experts_rate({"engine.scheduler": "vllm-v1"}), experts_rate({"engine.scheduler": "prefill-first"})
    assert vllm / sglang == pytest.approx(4.42 / 1.73)
    roofline = experts_rate({"engine.scheduler": "vllm-v1", "assumptions.vllm_mxfp4_weight_only_expert_time": 1})
    assert roofline / vllm == pytest.approx(1.73)
