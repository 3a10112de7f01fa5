"""How many kernels a step of an engine's model code runs, where that code fuses a layer differently from
compute/ops.py's count (which follows vLLM's and SGLang's layers). Graph or not, each carries the GPU's
fixed time of a kernel (ComputeModel.fixed_s); run eagerly, each its launch gap and its host's launch.

TensorRT-LLM's PyTorch backend, the default of `trtllm-serve` since release 1.0, runs a batch that holds
a prompt eagerly: `ScheduledRequests.can_run_cuda_graph` is `not self.context_requests`
(tensorrt_llm/_torch/pyexecutor/scheduler.py), so its Python forward pass launches a context step's
kernels one by one; a decode step replays a graph of the same kernels. Its layers are written around fused
custom ops, so a dense layer runs half the kernels ops.py counts (Llama 3.1 70B's: 9 against 18 at
TP > 1), and an MLA / MoE layer about as many (DeepSeek-V3's: 32 against 35). Its TensorRT engines (NIM's,
and releases before 1.0; `[engine] eager_host = false`) run other, compiled code, whose kernels keep
ops.py's count:

- A dense layer (tensorrt_llm/_torch/models/modeling_llama.py, LlamaDecoderLayer; modules/attention.py,
  modules/gated_mlp.py): the QKV GEMM, the attention op (`thop.attention`: RoPE and the KV-cache append,
  then the fused attention kernel), the output GEMM, the gate-up GEMM, `swiglu` and the down GEMM; the
  all-reduce, residual add, RMSNorm and the next GEMM's fp8 quantization are one fused op before each
  block (AllReduce with RESIDUAL_RMS_NORM_QUANT_FP8), and per-tensor fp8 inputs come quantized from it.
- An MLA attention block (modules/attention.py, MLA.forward_context_default): four block-scaled
  linears (the fused q_a / kv_a projection, q_b, kv_b, o_proj), each a quantization and a GEMM
  (FP8BlockScalesLinearMethod.apply), two RMSNorms, the latent cache's concatenation, the two copies that
  assemble K from its no-RoPE and RoPE parts, and the attention op.
- A MoE block (models/modeling_deepseekv3.py, Deepseekv3MoE): the router GEMM, the fused top-k routing
  (noaux_tc), the fused MoE op (its C++ runMoe: routing sort, expand and permute, quantization, the two
  grouped GEMMs, the activation and the finalizing reduction), the shared expert (two linears and its
  activation) and the sum of the two.
A step adds its embedding, final norm, LM head and sampler. The kernels inside one custom op are
launched from C++ at once; counted alike, every kernel carries the same share of the host's Python.

SGLang launches a layer as compute/ops.py counts it (a dense Llama layer: 14 calls at TP > 1 either way),
but for one block. Serving MXFP4 experts on a chip with FP4 tensor cores (gpt-oss on Blackwell), its
default MoE runner there is `flashinfer_mxfp4` (sglang 0.5.6, python/sglang/srt/server_args.py, the
GptOss defaults), which runs the routed experts as one fused op: the router's linear
(models/gpt_oss.py), top-k handing the logits on without a kernel (layers/moe/topk.py,
BypassedTopKOutput), the input's MXFP8 quantization and flashinfer's `trtllm_fp4_block_scale_moe`
(routing, both grouped GEMMs, the activation and the finalizing reduction, layers/quantization/
mxfp4.py), and a copy slicing the padded output back (layers/moe/fused_moe_triton/layer.py): four calls
where ops.py counts nine (the router and its top-k, and the routed experts' seven).

vLLM V1 compiles its model with torch.compile and Inductor unless told to run eagerly (`--enforce-eager`,
`cuda_graphs = "none"` here; vllm/config/vllm.py sets the compilation mode to none with it). Compiling,
it turns its custom ops off (`custom_ops` "none" under the Inductor backend, vllm/config/vllm.py), so that
Inductor "generates (fused) Triton kernels" for them (vllm/config/compilation.py); whether a fusion pass
must join two ops is decided by "Enable if either RMS norm or quant FP8 custom op is active; otherwise
Inductor handles fusion" (enable_norm_fusion and enable_act_fusion, vllm/config/vllm.py, 0.34.0). Its
per-tensor fp8 quantization became such an op (QuantFP8, a CustomOp with a torch implementation, vLLM
pull request 19830, cited as merged by issue 20711 of 2025-07-09; first in a release by 0.10.0): from
then a per-tensor fp8 linear's input is quantized in the Triton kernel that computes it, the RMSNorm
before the QKV and gate-up linears, the SiLU-and-multiply before the down linear. The attention output's
quantization before the output linear stays a kernel of its own (the attention op is a piece Inductor does
not see; `fuse_attn_quant` is off). Block-scaled fp8 keeps its CUDA quantization op ("+quant_fp8" where
the weights have blocks), which ops.py counts; and the MoE layers' experts quantize inside their fused
op, which ops.py counts as it runs. Only the fused quantizations leave ops.py's count
(`vllm_compiled_fused_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.compute.model_spec import ModelSpec
from tokenpath.engine.release import release_at_least


@dataclass(frozen=True)
class LayerKernels:
    """The kernels an engine's host launches for one eager step, block by block of each layer, as its
    model code runs them: fused ops, with a linear's input quantization where it is a kernel of its own."""

    attention_op: int          # the attention op's kernels (RoPE and the KV append, attention)
    gqa_linears: int           # a GQA block's linears (QKV, output)
    mla_linears: int           # an MLA block's linears
    mla_others: int            # an MLA block's other kernels
    fused_norms: int           # a layer's all-reduce + residual + norm ops
    dense_mlp_others: int      # a dense MLP's kernels besides its two linears
    moe_routing: int           # a MoE block's router and top-k routing
    fused_moe: int             # the routed experts' fused op
    shared_expert_others: int  # a shared expert's kernels besides its two linears, with the sum of outputs
    per_step: int              # embedding, final norm, LM head, sampling

    def per_step_kernels(self, model: ModelSpec, block_scaled: bool) -> float:
        """The kernels of one eager step of `model`; `block_scaled`: its linears take fp8 block scales,
        each quantizing its own input first (a linear is then two kernels; bf16 and per-tensor fp8
        linears, one)."""
        linear = 2 if block_scaled else 1
        attention = self.attention_op + (self.mla_linears * linear + self.mla_others if model.is_mla
                                         else self.gqa_linears * linear)
        dense_mlp = 2 * linear + self.dense_mlp_others
        moe = (self.moe_routing + self.fused_moe
               + (2 * linear + self.shared_expert_others if model.shared_intermediate_size else 0))
        return (model.num_layers * (attention + self.fused_norms) + model.dense_layers * dense_mlp
                + model.moe_layers * moe + self.per_step)


# SGLang's host calls for a MoE block's router and routed experts where it runs MXFP4 experts as one
# fused op, as listed above: router, quantization, the fused op, the output's copy.
SGLANG_FUSED_MXFP4_MOE_CALLS = 4


# TensorRT-LLM's PyTorch backend, as listed above (Profile.layer_kernels).
TRTLLM_PYTORCH = LayerKernels(
    attention_op=2,           # thop.attention: RoPE + KV append, then the fused attention kernel
    gqa_linears=2,            # QKV, output
    mla_linears=4,            # the fused q_a / kv_a projection, q_b, kv_b, output
    mla_others=5,             # two RMSNorms, the latent cache's concat, the two copies assembling K
    fused_norms=2,            # before attention and before the MLP
    dense_mlp_others=1,       # swiglu, its output quantized in the same kernel
    moe_routing=2,            # router GEMM, fused top-k routing (noaux_tc)
    fused_moe=7,              # sort, expand + permute, quantize, grouped GEMM, activation, grouped GEMM, finalize
    shared_expert_others=2,   # its activation, and the sum with the routed experts' output
    per_step=4,               # embedding, final norm, LM head, sampling
)


# The first vLLM release whose compiled layers quantize a per-tensor fp8 linear's input in the kernel before
# it, as listed above.
VLLM_FUSED_FP8_QUANT_SINCE = "0.10.0"


def vllm_compiled_fused_kernels(model: ModelSpec, release: str | None, per_tensor_fp8: bool) -> int:
    """The kernels of ops.py's count for one step of `model` that vLLM V1's compiled layers run inside
    others, in `release`: with per-tensor fp8 linears (`per_tensor_fp8`), each layer's QKV input
    quantization, and each dense MLP's gate-up and down input quantizations."""
    if not per_tensor_fp8 or not release_at_least(release, VLLM_FUSED_FP8_QUANT_SINCE):
        return 0
    return model.num_layers + 2 * model.dense_layers
