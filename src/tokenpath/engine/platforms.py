"""The software platform an engine runs on a chip, read from the chip's `generation` (catalog/chips.toml):
NVIDIA's generations run CUDA, AMD's CDNA runs ROCm, and the rest (Google's TPUs, Intel's Gaudi) neither,
so the engines' CUDA and ROCm paths (SGLang's prompt-step graphs, vLLM's measured KV sizing) do not apply
there. A chip file of another generation is read as neither.
"""

from __future__ import annotations

CUDA_GENERATIONS = frozenset({"Ampere", "Hopper", "Blackwell"})
ROCM_GENERATIONS = frozenset({"CDNA3"})


def runs_cuda(generation: str) -> bool:
    """Whether engines run CUDA on a chip of `generation`."""
    return generation in CUDA_GENERATIONS


def runs_rocm(generation: str) -> bool:
    """Whether engines run ROCm on a chip of `generation`."""
    return generation in ROCM_GENERATIONS
