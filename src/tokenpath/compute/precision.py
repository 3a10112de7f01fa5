"""Numeric precisions of weights, KV cache and compute, and their storage size."""

from __future__ import annotations

from tokenpath.config.errors import UserError

PRECISION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
"""Bytes per element. fp4 ignores its block scales (about 1 byte per 16 elements)."""


def check_precision(value: str, field: str) -> str:
    """`value` if it names a known precision, else a UserError naming `field`."""
    if value not in PRECISION_BYTES:
        raise UserError(f"{field}: unknown precision {value!r}; use one of {', '.join(PRECISION_BYTES)}")
    return value
