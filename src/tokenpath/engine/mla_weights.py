"""Where each engine keeps MLA's absorbed decode weights as bf16 copies (Profile.mla_absorbed_bf16).

An MLA model's decode form multiplies by W_UK and W_UV, kv_b_proj's weights split per head
(compute/ops.py, _mla_projections), in batched matmuls of their own; its prompt tokens still run kv_b_proj.
Where the checkpoint quantizes kv_b_proj (DeepSeek-V3's 128 x 128 block fp8), an engine whose batched
matmuls take no quantized weights dequantizes the two once, at load, into copies in the activations' dtype:
it holds them beside kv_b_proj and its decode steps stream them, twice fp8's bytes. Each rule takes the
chip's generation (catalog/chips.toml).
"""

from __future__ import annotations

from tokenpath.engine.platforms import runs_cuda


def vllm_mla_absorbed_bf16(generation: str) -> bool:
    """vLLM: bf16 copies on every chip. MLAAttention.process_weights_after_loading
    (vllm/model_executor/layers/attention/mla_attention.py; MLACommonImpl's in vllm/v1/attention/backends/mla/
    common.py before): "we currently do not have quantized bmm's which are needed for `W_UV` and `W_UK_T`, we
    just store fp16/bf16 copies" (get_and_maybe_dequant_weights to act_dtype); W_UK_T and W_UV are views of an
    unquantized kv_b_proj's weight. Its ROCm AITER fp8 / fp4 BMMs, which keep them quantized, are off unless
    VLLM_ROCM_USE_AITER=1 (vllm/envs.py). So since PR 14770 ("MLA get rid of materialization", March 2025); the
    0.7 releases before it materialized W_Q_UK and W_UV_O requantized to fp8, not modelled (they take the copies)."""
    return True


def sglang_mla_absorbed_bf16(generation: str) -> bool:
    """SGLang: bf16 copies on CUDA. Its post_load_weights (python/sglang/srt/models/deepseek_common/
    deepseek_weight_loader.py, DeepseekV2WeightLoaderMixin; models/deepseek_v2.py's before) dequantizes a
    128 x 128 block-fp8 kv_b_proj to bf16 w_kc / w_vc on CUDA (block_quant_dequant; SGL_USE_DEEPGEMM_BMM, off
    by default, keeps them fp8 on Hopper) and requantizes it to per-tensor fp8 elsewhere (block_quant_to_tensor_quant,
    for bmm_fp8). Releases that requantized on CUDA too, before the dequantizing path, are not told apart."""
    return runs_cuda(generation)


def trtllm_mla_absorbed_bf16(generation: str) -> bool:
    """TensorRT-LLM: bf16 copies on Blackwell only. MLA.create_weights (tensorrt_llm/_torch/modules/attention.py):
    a block-fp8 kv_b_proj gives an fp8 k_b_proj_trans, multiplied natively (fp8_block_scaling_bmm_out) on
    Hopper; on SM100 (is_sm_100f) without use_cute_dsl_blockscaling_bmm (False by default) it also holds
    k_b_proj_trans_dequant and v_b_proj_dequant in bf16, which its decode BMMs read."""
    return generation == "Blackwell"
