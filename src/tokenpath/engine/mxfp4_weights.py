"""How each engine lays out an MXFP4 checkpoint's routed experts in memory (Profile.mxfp4_layout; the bytes:
compute/ops.py's Mxfp4Layout and _routed_experts).

gpt-oss's routed experts ship as MXFP4: 4-bit values with one E8M0 scale byte per 32 (compute/precision.py),
60.7 GiB for gpt-oss-120b on one GPU. An engine's MoE kernels want their own layout, which may pad each
expert GEMM's dimensions and may hold the scales twice. vLLM picks its MXFP4 backend by the chip
(get_mxfp4_backend in vllm/model_executor/layers/quantization/mxfp4.py) and sizes the experts' tensors for it
in Mxfp4MoEMethod.create_weights:

- Ampere (no FP4 path of its own): Marlin, the hidden size padded to a multiple of 256 and the intermediate
  size to 128 ("the moe marlin kernel requires that for each linear n % 256 == 0 and k % 128 == 0"); its
  repack (prepare_moe_fp4_layer_for_marlin) keeps the values' and scales' bytes. gpt-oss-120b: 9.0% more
  expert bytes. vLLM 0.10.1 on an H100 without triton_kernels ran Marlin there too and logged "Model loading
  took 65.9651 GiB" (vLLM issue 23278); the layout gives 65.8.
- Hopper: Triton (triton_kernels' matmul_ogs; FlashInfer's SM90 path only with
  VLLM_USE_FLASHINFER_MOE_MXFP4_BF16 set), the intermediate size padded to a multiple of 64. From 0.11.1 it
  also holds the scales twice: process_weights_after_loading swizzles the experts for triton_kernels
  (`_swizzle_mxfp4`, vllm/model_executor/layers/quantization/utils/mxfp4_utils.py) and deletes the loaded
  values, whose swizzled copy takes their place, but not the loaded scales: `w13_weight_scale` and
  `w2_weight_scale` stay registered while the kernels read the copy in the layer's PrecisionConfig, whose
  HopperMXScaleLayout (triton_kernels/tensor_details/layout_details/hopper_scale.py) pads each GEMM's output
  dimension to SWIZZLE_ALIGN_M = 2 x num_warps x 2 x 8 = 256 (8 warps). gpt-oss-120b on one GPU: 3.46 GiB
  more (36 layers x 128 experts x (5,888 + 3,072) x 90 bytes), which with the biases vLLM widens to fp32
  (0.07 GiB, not modelled) is the 3.7 GiB vLLM 0.14.1 logs beyond the checkpoint ("Model loading took
  64.38 GiB", "Using Triton backend": vLLM issue 33155). Before 0.11.1 `_swizzle_mxfp4` keeps the loaded
  layout (StridedLayout) on Hopper with torch older than 2.8.1, and vLLM was built on torch 2.8.0 until
  0.11.1, the first release on torch 2.9.0 (vLLM issue 27228): GPUStack's vLLM 0.10.2 runs of gpt-oss-120b
  on one H100 at the default 0.9 share fit a batch of about 140 requests, which the copy would not leave room
  for.
- Blackwell: FlashInfer's TRT-LLM-gen MoE (SM100_FI_MXFP4_BF16, or _MXFP8_TRTLLM), both sizes padded to a
  multiple of 256; its shuffled values and scales replace the loaded ones. gpt-oss-120b: 13.8% more on one
  GPU; at TP8, whose 360-wide intermediate pads to 512, 1.52 times the expert bytes.

Where a measured multiple of the kernels' time stands for them (Hopper's, engine/expert_kernels.py: measured
on these kernels, padding and all), the padding adds memory alone; elsewhere the kernels also run the padded
shapes. As loaded, where not read through: vLLM on AMD chips; TensorRT-LLM's loaders; and SGLang's, though
its Mxfp4MoEMethod (python/sglang/srt/layers/quantization/mxfp4.py) follows vLLM's: on Blackwell with
FlashInfer it pads both sizes to 256 (the intermediate at TP8 from 360 to 512: 1.52 times the expert
bytes), and on Hopper its triton_kernels path swizzles whatever the torch (no gate in its
`_swizzle_mxfp4`) and leaves the loaded scales registered beside the copy. Modelled, the padding would
slow the decode of the project's SGLang gpt-oss rows on 8 B200s, which already measure faster than the
model reads them, while AIConfigurator's SGLang B200 MoE tables time those kernels at 1.25 to 2.0 times
the unpadded roofline (engine/expert_kernels.py): the two do not agree, and the layout waits on rows that
tell them apart. On GPUStack's gpt-oss-120b run on one H100 under SGLang 0.5.3rc0 the scale copy would
take 3.46 GiB of the 8.5 GiB its KV pool gets, and the measured rate says about 34 requests ran, fewer than
either leaves room for.
"""

from __future__ import annotations

from tokenpath.compute.ops import Mxfp4Layout
from tokenpath.engine.release import release_at_least

# The first vLLM release built on torch >= 2.8.1, from which its Triton MXFP4 backend swizzles on Hopper.
VLLM_SWIZZLED_MXFP4_SINCE = "0.11.1"
# vLLM's layouts by the chip's generation (the module's docstring); Hopper's scale copy from VLLM_SWIZZLED_MXFP4_SINCE.
VLLM_MARLIN = Mxfp4Layout(hidden_align=256, intermediate_align=128)
VLLM_TRITON_HOPPER = Mxfp4Layout(intermediate_align=64)
VLLM_TRITON_HOPPER_SWIZZLED = Mxfp4Layout(intermediate_align=64, scale_copy_align=256)
VLLM_FLASHINFER_SM100 = Mxfp4Layout(hidden_align=256, intermediate_align=256)


def vllm_mxfp4_layout(generation: str, release: str | None) -> Mxfp4Layout | None:
    """vLLM's layout on a chip of `generation` in `release` (the scenario's engine.version; None: the newest)."""
    if generation == "Ampere":
        return VLLM_MARLIN
    if generation == "Hopper":
        swizzled = release_at_least(release, VLLM_SWIZZLED_MXFP4_SINCE)
        return VLLM_TRITON_HOPPER_SWIZZLED if swizzled else VLLM_TRITON_HOPPER
    if generation == "Blackwell":
        return VLLM_FLASHINFER_SM100
    return None


def as_loaded(generation: str, release: str | None) -> Mxfp4Layout | None:
    """An engine whose MXFP4 loader was not read: the checkpoint's layout."""
    return None
