"""Numeric precisions of weights, KV cache and compute, and their storage size."""

from __future__ import annotations

from tokenpath.config.errors import UserError

PRECISION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
"""Bytes per element, without the scales of a block-scaled format (stored_bytes adds them)."""

FP4_SCALE_BLOCKS = {"nvfp4": 16, "mxfp4": 32}
"""Elements per one-byte scale of each block-scaled fp4 format: NVIDIA's NVFP4 (an E4M3 scale per 16
elements, plus one fp32 per tensor; NVIDIA's ModelOpt checkpoints, TensorRT-LLM and the Blackwell
tensor cores) and the OCP Microscaling spec's MXFP4 (an E8M0 scale per 32; gpt-oss's checkpoint, AMD's
Quark and CDNA). The scales are stored and read with the weights: 12.5% and 6.25% more bytes than
0.5 a weight. fp8's block scales (DeepSeek-V3: one fp32 per 128 x 128 weights, 0.02%) are left out."""


def stored_bytes(precision: str, fp4_format: str = "nvfp4") -> float:
    """Bytes a weight stored at `precision` takes, its share of its block's scale included;
    `fp4_format`: the block-scaled format fp4 weights are in (FP4_SCALE_BLOCKS)."""
    if precision == "fp4":
        return PRECISION_BYTES["fp4"] + 1.0 / FP4_SCALE_BLOCKS[fp4_format]
    return PRECISION_BYTES[precision]


def check_precision(value: str, field: str) -> str:
    """`value` if it names a known precision, else a UserError naming `field`."""
    if value not in PRECISION_BYTES:
        raise UserError(f"{field}: unknown precision {value!r}; use one of {', '.join(PRECISION_BYTES)}")
    return value
