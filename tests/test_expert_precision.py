"""Per-component precision: an MoE's routed experts at a precision of their own (gpt-oss's MXFP4 experts
beside bf16 attention), in the compute model, the scenario and the launch."""

import pytest

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel
from tokenpath.config.errors import UserError
from tokenpath.launch.plan import make_plan
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import load_scenario


def _resident(compute: ComputeModel) -> dict[str, float]:
    return {op.name: op.resident_bytes for op in compute.ops}


def test_only_the_routed_experts_take_the_expert_precision():
    model, chip = load_model("gpt-oss-120b"), load_chip("b200")
    uniform = _resident(ComputeModel(model, chip, 1, "fp4", "bf16"))
    mixed = _resident(ComputeModel(model, chip, 1, "bf16", "bf16", expert_precision="fp4"))
    plain = _resident(ComputeModel(model, chip, 1, "bf16", "bf16"))
    assert mixed["moe_experts"] == uniform["moe_experts"]  # the experts as fp4 weights
    fp4_over_bf16 = (0.5 + 1 / 32) / 2.0  # the checkpoint's MXFP4: a one-byte scale per 32 weights
    assert mixed["moe_experts"] == pytest.approx(plain["moe_experts"] * fp4_over_bf16)
    for name in ("qkv_proj", "o_proj"):  # the attention as bf16 weights
        assert mixed[name] == plain[name] == pytest.approx(uniform[name] / fp4_over_bf16)


def test_a_bf16_attention_beside_fp4_experts_costs_a_decode_step_more_than_fp4_everywhere():
    model, chip = load_model("gpt-oss-120b"), load_chip("h200")
    fp4 = ComputeModel(model, chip, 1, "fp4", "bf16")
    mixed = ComputeModel(model, chip, 1, "bf16", "bf16", expert_precision="fp4")
    attention_bytes = sum(op.bytes_fixed for op in mixed.ops if op.name in ("qkv_proj", "o_proj"))
    assert attention_bytes > 0
    step = (8, 8, 8 * 1000.0, 8 * 1000.0)
    assert mixed.step_time_s(*step) > fp4.step_time_s(*step)


def test_expert_precision_needs_experts_and_the_launch_serves_the_checkpoint_as_stored():
    dense = load_scenario("typical", {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1,
                                      "model.expert_precision": "fp4"})
    with pytest.raises(UserError, match="model.expert_precision: llama-3.1-8b has no experts"):
        build_deployment(dense)
    stored = {"model.name": "gpt-oss-120b", "deployment.tp": 8, "model.precision": "bf16",
              "model.expert_precision": "fp4"}
    assert make_plan(load_scenario("typical", stored)).weights() == "as-stored"
    assert make_plan(load_scenario("typical", {**stored, "model.expert_precision": None,
                                                "model.precision": "fp4"})).weights() == "mismatch"
