"""The kernels TensorRT-LLM's PyTorch backend launches for an eager step (engine/eager_launches.py), and
what its host's launches add to a step that holds a prompt."""

import pytest

from tokenpath.compute.model import load_model
from tokenpath.compute.roofline import ComputeModel, launch_queue_s
from tokenpath.engine.eager_launches import TRTLLM_PYTORCH
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import build_scenario, load_scenario


def test_a_dense_layer_launches_its_fused_ops_and_an_mla_moe_layer_three_and_a_half_times_as_many():
    llama, deepseek = load_model("llama-3.1-70b"), load_model("deepseek-v3")
    # Llama: QKV, RoPE + append, attention, output; two fused all-reduce + norms; gate-up, swiglu, down.
    assert TRTLLM_PYTORCH.per_step_kernels(llama, block_scaled=False) == 80 * 9 + 4
    # Block-scaled linears quantize their own input: a kernel more each (4 linears a layer).
    assert TRTLLM_PYTORCH.per_step_kernels(llama, block_scaled=True) == 80 * 13 + 4
    # DeepSeek-V3: MLA (4 block-scaled linears, 2 norms, the latent concat, 2 copies, RoPE + append,
    # attention) and 2 fused norms in each of 61 layers; 3 dense MLPs (5) and 58 MoE blocks (router,
    # routing, 7 fused-MoE kernels, a shared expert's 2 linears and activation, and the sum).
    assert TRTLLM_PYTORCH.per_step_kernels(deepseek, block_scaled=True) == 61 * (15 + 2) + 3 * 5 + 58 * 15 + 4
    per_layer_llama = (TRTLLM_PYTORCH.per_step_kernels(llama, False) - 4) / llama.num_layers
    per_layer_deepseek = (TRTLLM_PYTORCH.per_step_kernels(deepseek, True) - 4) / deepseek.num_layers
    assert per_layer_deepseek / per_layer_llama == pytest.approx(31.5 / 9, rel=0.01)


def _compute(model: str, precision: str, eager_host: bool | None) -> ComputeModel:
    scenario = build_scenario({"model": {"name": model, "precision": precision},
                               "deployment": {"chip": "h200", "chips": 8, "tp": 8},
                               "engine": {"scheduler": "trtllm", "cuda_graphs": "decode",
                                          **({} if eager_host is None else {"eager_host": eager_host})}}, "test")
    return build_deployment(scenario).compute


def test_a_pytorch_backend_prompt_waits_on_its_launches_and_a_tensorrt_engines_does_not():
    """A 1,024-token prompt of DeepSeek-V3 at TP8 on H200: its kernels are shorter than the host's
    launches of its 1,926 kernels, so the step lasts the launches plus one layer of kernels
    (launch_queue_s); Llama 3.1 70B's 724 launches take less than half as long. A TensorRT engine
    (eager_host = false) launches from C++: its step is its kernels and their gaps."""
    from tokenpath.engine.host_time import TRTLLM_EAGER_HOST_PER_KERNEL_S

    waits = {}
    for model, precision in (("deepseek-v3", "fp8"), ("llama-3.1-70b", "fp8")):
        python, cpp = _compute(model, precision, None), _compute(model, precision, False)
        kernels = TRTLLM_PYTORCH.per_step_kernels(python.model, model == "deepseek-v3")
        assert python.host_launch_s == pytest.approx(kernels * TRTLLM_EAGER_HOST_PER_KERNEL_S, rel=1e-12)
        assert cpp.host_launch_s == 0.0 and cpp.launch_wait_s(0.010) == 0.0
        gpu_s = 0.030  # kernels shorter than the launches
        assert python.launch_wait_s(gpu_s) == pytest.approx(
            launch_queue_s(gpu_s, python.host_launch_s, python.model.num_layers) - gpu_s, rel=1e-12)
        waits[model] = python.launch_wait_s(gpu_s)
        # A prompt's step (no decodes, its 1,024 x 1,024 / 2 attention pairs): its kernels and their gaps,
        # longer by the wait on the launches under the PyTorch backend (the host overlapped, unless longer).
        prompt = (1024, 1, 1024 * 1025 / 2, 0)
        for compute in (python, cpp):
            kernels_s = sum(op.time_s for op in compute.step_ops(*prompt))
            gpu_s = kernels_s + compute.eager_gap_s
            assert compute.step_time_s(*prompt) == pytest.approx(
                max(gpu_s + compute.launch_wait_s(gpu_s), compute.host_s(1)), rel=1e-9)
    assert waits["deepseek-v3"] > 2 * waits["llama-3.1-70b"] > 0


def test_the_pytorch_backends_steps_run_its_fused_kernels_and_a_tensorrt_engines_the_ops_count():
    """Graph or not, a step of the PyTorch backend runs the kernels its model code launches (its fused
    ops): each GEMM the ops' own, the others as many as engine/eager_launches.py counts, each with the
    GPU's fixed time of a kernel, and eagerly each with a launch gap. Llama 3.1 70B at fp8, TP8: 80 x 9 + 4
    kernels, 321 of them weight GEMMs (four a layer and the LM head), against the ops' count. A TensorRT
    engine's kernels are not that code's (eager_host = false): the ops' count."""
    from tokenpath.compute.efficiency import EAGER_KERNEL_LAUNCH_S

    python, cpp = _compute("llama-3.1-70b", "fp8", None), _compute("llama-3.1-70b", "fp8", False)
    kernels = TRTLLM_PYTORCH.per_step_kernels(python.model, False)
    gemms = sum(op.gemm_kernels for op in python.ops)
    assert (kernels, gemms) == (80 * 9 + 4, 80 * 4 + 1)
    assert sum(python.fixed_s(op) for op in python.ops) == pytest.approx(
        gemms * python.gemm_fixed_s + (kernels - gemms) * python.kernel_fixed_s, rel=1e-12)
    assert sum(cpp.fixed_s(op) for op in cpp.ops) == pytest.approx(
        gemms * cpp.gemm_fixed_s + sum(op.kernels - op.gemm_kernels for op in cpp.ops) * cpp.kernel_fixed_s, rel=1e-12)
    assert python.eager_gap_s == pytest.approx(kernels * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    assert cpp.eager_gap_s == pytest.approx(cpp.kernels_per_step * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    # A decode step of 16 sequences replays a graph: shorter by the fixed time of the kernels it fuses.
    decode = (16, 16, 16 * 2048, 16 * 2048)
    fused_s = sum(cpp.fixed_s(op) - python.fixed_s(op) for op in cpp.ops)
    assert fused_s > 1e-3  # a millisecond of a ~9 ms step
    assert cpp.step_time_s(*decode) - python.step_time_s(*decode) == pytest.approx(fused_s, rel=1e-9)


def test_eager_host_is_refused_where_the_engine_compiles_its_model_and_off_pays_nothing_per_kernel():
    with pytest.raises(ValueError, match="eager_host = true: vLLM V1 compiles its model"):
        EngineSpec(scheduler="vllm-v1", eager_host=True)
    per_kernel = ("eager_host_per_kernel_s", "trtllm_eager_host_per_kernel_s")
    # what calibrate engine screens and validate's fits read: a host time the engine does not pay
    assert [EngineSpec(scheduler="trtllm").pays(n) for n in per_kernel] == [False, True]
    assert [EngineSpec(scheduler="trtllm", eager_host=False).pays(n) for n in per_kernel] == [False, False]
    assert [EngineSpec(scheduler="prefill-first", eager_host=False).pays(n) for n in per_kernel] == [False, False]
    assert EngineSpec(scheduler="trtllm", eager_host=False).pays("host_step_s")


@pytest.mark.parametrize(("eager_host", "expected_s"), [(None, "trtllm"), (False, 0.0)])
def test_the_resolved_scenario_says_what_the_host_pays_per_eager_kernel(eager_host, expected_s):
    from tokenpath.engine.host_time import TRTLLM_EAGER_HOST_PER_KERNEL_S
    from tokenpath.sim.document import result_document
    from tokenpath.sim.simulate import simulate

    overrides = {"engine.scheduler": "trtllm", "workload.num_requests": 20,
                 **({} if eager_host is None else {"engine.eager_host": eager_host})}
    (document, *_) = result_document(simulate(load_scenario("typical", overrides)))
    expected = TRTLLM_EAGER_HOST_PER_KERNEL_S if expected_s == "trtllm" else expected_s
    assert document["resolved"]["engine"]["eager_host_per_kernel_s"] == expected


def _sglang_compute(model: str, chip: str, **model_fields) -> ComputeModel:
    scenario = build_scenario({"model": {"name": model, **model_fields},
                               "deployment": {"chip": chip, "chips": 8, "tp": 8},
                               "engine": {"scheduler": "prefill-first"}}, "test")
    return build_deployment(scenario).compute


def test_sglang_launches_a_blackwell_mxfp4_moe_block_as_four_calls_and_other_experts_as_the_ops_count():
    """gpt-oss-120b's MoE blocks on B200 (MXFP4 experts on FP4 tensor cores): the router, the input's
    quantization, the fused experts op and the output's copy, where the ops count the router, its top-k
    and the routed experts' seven kernels; on H100 (weight-only MXFP4) and with bf16 experts, the ops'."""
    from tokenpath.engine.eager_launches import SGLANG_FUSED_MXFP4_MOE_CALLS
    from tokenpath.engine.host_time import EAGER_HOST_PER_KERNEL_S

    fused = _sglang_compute("gpt-oss-120b", "b200", precision="bf16", expert_precision="fp4")
    gpt_oss = fused.model
    moe_ops = sum(op.kernels for op in fused.ops if op.name in ("moe_router", "moe_experts"))
    assert moe_ops == gpt_oss.moe_layers * (2 + 7) and SGLANG_FUSED_MXFP4_MOE_CALLS == 4
    assert fused.native_mxfp4_experts
    assert fused.host_launch_s == pytest.approx(
        (fused.kernels_per_step - gpt_oss.moe_layers * 5) * EAGER_HOST_PER_KERNEL_S, rel=1e-12)
    # the GPU still runs every kernel: only the host's launches are fewer
    weight_only = _sglang_compute("gpt-oss-120b", "h100", precision="bf16", expert_precision="fp4")
    bf16_experts = _sglang_compute("gpt-oss-120b", "b200", precision="bf16")
    for compute in (weight_only, bf16_experts):
        assert not compute.native_mxfp4_experts
        assert compute.host_launch_s == pytest.approx(compute.kernels_per_step * EAGER_HOST_PER_KERNEL_S, rel=1e-12)
    # weight-only experts take the bf16 input unquantized: two kernels a MoE layer fewer than on FP4 tensor cores
    assert fused.kernels_per_step == weight_only.kernels_per_step + 2 * gpt_oss.moe_layers
    assert fused.eager_gap_s == pytest.approx(weight_only.eager_gap_s * fused.kernels_per_step
                                              / weight_only.kernels_per_step, rel=1e-12)


def _vllm_compute(model: str, precision: str, chip: str = "h100", **engine) -> ComputeModel:
    scenario = build_scenario({"model": {"name": model, "precision": precision},
                               "deployment": {"chip": chip, "chips": 8, "tp": 8},
                               "engine": {"scheduler": "vllm-v1", **engine}}, "test")
    return build_deployment(scenario).compute


def test_vllm_v1s_compiled_layers_fuse_a_per_tensor_fp8_linears_input_quantization_from_0_10():
    """Llama 3.1 70B: each layer's QKV, gate-up and down inputs quantized inside the norm or activation
    kernel before them (80 x 3); an MoE model's layers only their QKV input (Mixtral: 32 layers, no dense
    MLP); none before 0.10.0, nor without per-tensor fp8 linears."""
    from tokenpath.engine.eager_launches import vllm_compiled_fused_kernels

    llama, mixtral = load_model("llama-3.1-70b"), load_model("mixtral-8x7b")
    assert vllm_compiled_fused_kernels(llama, None, per_tensor_fp8=True) == 80 * 3
    assert vllm_compiled_fused_kernels(llama, "0.10.0", per_tensor_fp8=True) == 80 * 3
    assert vllm_compiled_fused_kernels(mixtral, "0.11.2", per_tensor_fp8=True) == 32
    assert vllm_compiled_fused_kernels(llama, "0.9.2", per_tensor_fp8=True) == 0
    assert vllm_compiled_fused_kernels(llama, "0.10.0rc1", per_tensor_fp8=True) == 0
    assert vllm_compiled_fused_kernels(llama, None, per_tensor_fp8=False) == 0


def test_a_vllm_v1_step_leaves_out_the_fixed_time_and_gaps_of_the_kernels_its_compiled_code_fuses():
    """Llama 3.1 70B fp8 at TP8 on H100: the 240 fused quantizations leave the step's kernels, each with
    the GPU's fixed time of a kernel (a decode step 240 x KERNEL_FIXED_S shorter) and, run without a graph,
    its launch gap; --enforce-eager (cuda_graphs = "none") runs the custom ops the ops count, as bf16
    linears, block-scaled fp8 (DeepSeek-V3) and releases before 0.10.0 do."""
    from tokenpath.compute.efficiency import EAGER_KERNEL_LAUNCH_S, KERNEL_FIXED_S

    compiled = _vllm_compute("llama-3.1-70b", "fp8", version="0.10.0")
    old = _vllm_compute("llama-3.1-70b", "fp8", version="0.9.2")
    eager = _vllm_compute("llama-3.1-70b", "fp8", cuda_graphs="none")
    assert compiled.kernels_per_step == old.kernels_per_step == eager.kernels_per_step
    others = sum(op.kernels - op.gemm_kernels for op in old.ops)
    fixed = {name: sum(c.fixed_s(op) for op in c.ops) for name, c in (("compiled", compiled), ("old", old))}
    assert fixed["old"] - fixed["compiled"] == pytest.approx(240 * KERNEL_FIXED_S, rel=1e-9)
    assert compiled.eager_gap_s == pytest.approx((compiled.kernels_per_step - 240) * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    assert old.eager_gap_s == pytest.approx(old.kernels_per_step * EAGER_KERNEL_LAUNCH_S, rel=1e-12)
    assert others > 240
    # A decode step of 16 sequences replays a graph in both: shorter by the fused kernels' fixed time alone
    # (0.9.2 and 0.10.0 differ in nothing else the step's time reads).
    decode = (16, 16, 16 * 2048, 16 * 2048)
    assert old.step_time_s(*decode) - compiled.step_time_s(*decode) == pytest.approx(240 * KERNEL_FIXED_S, rel=1e-9)
    for unfused in (eager, _vllm_compute("llama-3.1-70b", "bf16"), _vllm_compute("deepseek-v3", "fp8", chip="h200")):
        assert sum(unfused.fixed_s(op) for op in unfused.ops) == pytest.approx(
            sum(op.gemm_kernels * unfused.gemm_fixed_s + (op.kernels - op.gemm_kernels) * unfused.kernel_fixed_s
                for op in unfused.ops), rel=1e-12)
