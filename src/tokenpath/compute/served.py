"""Roofline time of a small model served beside the LLM (an embedder, a reranker): one forward pass over
`tokens` tokens is 2 x params x tokens FLOPs and reads the weights once.

On a chip it is one GEMM row of the compute layer (ops.LinearOp) timed as every GEMM of a step is
(roofline.op_time_s: the p-norm of its compute and memory times at the chip's sustained rates). On a
CPU a request runs on one core: the larger of its FLOPs at a core's rate and its weights at a core's
memory bandwidth. Counting every parameter per token (embedding rows too) bounds the FLOPs from above;
attention's own FLOPs (a few percent at a few hundred tokens) and kernels' fixed costs are left out.
"""

from __future__ import annotations

import numpy as np

from tokenpath.compute.chip import ChipSpec
from tokenpath.compute.ops import LinearOp
from tokenpath.compute.precision import PRECISION_BYTES, stored_bytes
from tokenpath.compute.roofline import op_time_s
from tokenpath.config.assumptions import DEFAULTS, Assumptions, default
from tokenpath.config.errors import UserError

CPU_CORE_ENCODER_FLOPS = default("cpu_core_encoder_flops")
"""FLOP/s one CPU core sustains in an encoder's forward pass. ONNX Runtime runs BERT-base (110M
parameters) over 128 tokens in 273 ms on one thread of an Intel Xeon W-2123 (fp32, AVX-512, Gelu and
LayerNorm fused; nightr.gitbook.io/nnopt, "BERT"): 2 x 110M x 128 / 273 ms = 103 GFLOP/s, counted the
way this module counts (every parameter per token). A core with AMX (Sapphire Rapids on) runs bf16
several times faster: override the assumption for one."""

CPU_CORE_BW_BPS = default("cpu_core_bw_Bps")
"""Memory bandwidth one CPU core sustains alone: single-thread STREAM Triad on a Xeon E5-2690 v3,
19.9 GB/s (John McCalpin, Intel community forum, "single core bandwidth: haswell vs. broadwell vs.
skylake"). A served model's weights stream once per request from it."""


def forward_flops(params: float, tokens: float | np.ndarray) -> float | np.ndarray:
    return 2.0 * params * tokens


def cpu_forward_s(params: float, precision: str, tokens: np.ndarray,
                  assumptions: Assumptions = DEFAULTS) -> np.ndarray:
    """Per request, the time of its forward pass over `tokens` tokens on one core."""
    compute_s = forward_flops(params, np.asarray(tokens, np.float64)) / assumptions.value("cpu_core_encoder_flops")
    memory_s = params * PRECISION_BYTES[precision] / assumptions.value("cpu_core_bw_Bps")
    return np.maximum(compute_s, memory_s)


class ChipForward:
    """The forward pass of a served model on one chip, batched: `time_s(tokens)` for a batch holding
    `tokens` tokens in all (its weights read once per batch)."""

    def __init__(self, params: float, precision: str, chip: ChipSpec, assumptions: Assumptions = DEFAULTS,
                 field: str = "precision") -> None:
        try:
            rate = chip.effective_flops(precision)
        except UserError:
            raise UserError(f"{field}: {precision} does not run on {chip.name}; use bf16"
                            + (" or one of " + ", ".join(chip.peak_flops) if len(chip.peak_flops) > 1 else "")) \
                from None
        weights = params * stored_bytes(precision, chip.fp4_format)
        self.op = LinearOp("forward", rate, flops_per_token=2.0 * params, bytes_fixed=weights,
                           resident_bytes=weights, gemm=True)
        self.bw_Bps = chip.effective_hbm_bw_Bps
        self.norm = assumptions.value("gemm_overlap_norm")

    def time_s(self, tokens: float) -> float:
        op = self.op
        return op_time_s(op.compute_s(tokens, 0, 0, 0), op.bytes(tokens, 0, 0, 0) / self.bw_Bps, True, self.norm)
