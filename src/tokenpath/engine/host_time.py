"""The host's share of an engine step: what the engine's own process does around the GPU's kernels.

Each step an engine schedules the batch, prepares its inputs (block tables, positions, sampling
parameters), samples and processes the outputs. Where that runs in the step's critical path it adds
to the step's time, as a fixed part and a part per sequence sampled. The constants are per engine
profile, each with its source, and set on published measurements (`tokenpath validate --group latency`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostStepCost:
    """Host time of one step: `step_s`, plus `per_sequence_s` for every sequence that samples a token.
    `overlapped`: the engine prepares each step while the GPU runs the one before (SGLang's
    zero-overhead scheduler, TensorRT-LLM's overlap scheduler), so a step lasts the longer of the two."""

    step_s: float
    per_sequence_s: float
    overlapped: bool = False


# PLACEHOLDER values, calibrated below.
HOST_STEP_COSTS = {
    "vllm-v1": HostStepCost(step_s=0.5e-3, per_sequence_s=0.0),
}


def host_step_cost(profile: str) -> HostStepCost:
    return HOST_STEP_COSTS[profile]
