"""Where an engine holds an MXFP4 checkpoint's expert scales twice (Profile.mxfp4_scale_copy; the bytes:
compute/ops.py, _routed_experts).

gpt-oss's routed experts ship as MXFP4: 4-bit values with one E8M0 scale byte per 32 (compute/precision.py).
vLLM's Triton MXFP4 backend, its default for those experts on Hopper (get_mxfp4_backend in
vllm/model_executor/layers/quantization/mxfp4.py: FlashInfer's SM90 path only with
VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 set), converts the loaded weights and scales into triton_kernels'
layouts in Mxfp4MoEMethod.process_weights_after_loading (`_swizzle_mxfp4`,
vllm/model_executor/layers/quantization/utils/mxfp4_utils.py). It then deletes the loaded values, whose
swizzled copy takes their place, but not the loaded scales: `w13_weight_scale` and `w2_weight_scale` stay
registered on the layer while the kernels read the swizzled copies held in the layer's PrecisionConfig. On
Hopper the copy is HopperMXScaleLayout's (triton_kernels/tensor_details/layout_details/hopper_scale.py),
which pads each GEMM's output dimension to a multiple of SWIZZLE_ALIGN_M = 2 x num_warps x 2 x 8 = 256
(vLLM swizzles with 8 warps). So the experts hold their scales twice, the copy padded: for gpt-oss-120b on
one GPU 3.46 GiB (36 layers x 128 experts x (5,888 x 90 + 3,072 x 90) bytes), which with the biases vLLM
widens to fp32 (0.07 GiB more, not modelled) is the 3.7 GiB vLLM 0.14.1 logs beyond the checkpoint
("Model loading took 64.38 GiB", "Using Triton backend": vLLM issue 33155; the checkpoint with its scales is
60.7 GiB).

Before vLLM 0.11.1 it did not: `_swizzle_mxfp4` keeps the loaded layout (StridedLayout, no copy) on Hopper
with torch older than 2.8.1, and vLLM's releases were built on torch 2.8.0 until 0.11.1, the first built on
torch 2.9.0 (vLLM issue 27228). GPUStack's vLLM 0.10.2 runs of gpt-oss-120b on one H100 at the default 0.9
share fit a batch of about 140 requests, which the duplicate would not have left room for.

Not read, so not modelled: SGLang's and TensorRT-LLM's MXFP4 loaders (False), vLLM on other chips (its
FlashInfer paths on Blackwell replace the loaded scales; on ROCm the scales keep the loaded layout but on
gfx950), and vLLM's Marlin backend, which pads hidden to 256 and the intermediate size to 128 instead
(vLLM issue 23278: 65.97 GiB under 0.10.1).
"""

from __future__ import annotations

from tokenpath.engine.release import release_at_least

# The first vLLM release built on torch >= 2.8.1, from which its Triton MXFP4 backend swizzles on Hopper.
VLLM_SWIZZLED_MXFP4_SINCE = "0.11.1"
# HopperMXScaleLayout's alignment of a GEMM's output dimension in the scales' copy (2 x num_warps x 2 x 8, 8 warps).
HOPPER_SCALE_ALIGN = 256


def vllm_mxfp4_scale_copy(generation: str, release: str | None) -> int | None:
    """vLLM: on Hopper from 0.11.1 a copy of the expert scales beside the loaded ones, each GEMM's output
    dimension padded to HOPPER_SCALE_ALIGN (the module's docstring); `release` the scenario's engine.version
    (None: the newest). None: the scales are held once."""
    if generation == "Hopper" and release_at_least(release, VLLM_SWIZZLED_MXFP4_SINCE):
        return HOPPER_SCALE_ALIGN
    return None


def no_mxfp4_scale_copy(generation: str, release: str | None) -> int | None:
    """An engine whose MXFP4 loader holds the checkpoint's scales once (or was not read)."""
    return None
