"""The host's share of an engine step: what the engine's own process does around the GPU's kernels.

Each step an engine schedules the batch, prepares its inputs (block tables, positions, sampling
parameters), samples and processes the outputs: a fixed part and a part per sequence sampled. Where
that runs in the step's critical path it adds to the step's time; an engine that prepares the next
step while the GPU runs the current one (SGLang's zero-overhead batch scheduler since v0.4,
TensorRT-LLM's overlap scheduler, on by default in its PyTorch backend; the C++ executor that runs
built TensorRT engines has none) hides it behind the GPU, and a step then lasts the longer of the two
(`[engine] host_overlap` overrides the profile's default). Under vLLM V0's multi-step scheduling the
scheduler and input preparation run once per window of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.config.assumptions import assumed, default
from tokenpath.engine.profiles import PROFILES


@dataclass(frozen=True)
class HostStepCost:
    """Host time of one step: `step_s`, plus `per_sequence_s` for every sequence that samples a token;
    `overlapped`: prepared while the GPU runs the step before; `eager_per_kernel_s`: the host's time
    per kernel, added to the kernels, when the step replays no CUDA graph."""

    step_s: float
    per_sequence_s: float
    overlapped: bool
    eager_per_kernel_s: float = 0.0


# The fixed host time of a step, the same order for every engine written in Python around the GPU:
# 0.5 ms, of which vLLM's V1 scheduler and input preparation take most at small batches. It reproduces
# the vLLM rows of AIConfigurator's measured runs at one chip (tokenpath validate --group latency);
# an order of magnitude to calibrate per deployment.
HOST_STEP_S = default("host_step_s")
# vLLM's V0 engine (its profile's host_step_assumption): its fixed host time per step, in the step's
# path. V0 schedules, builds the step's inputs and metadata in Python and waits for the sampler every
# step, the costs V1 was rewritten to cut (vLLM's V1 announcement, January 2025). Calibrated once, on
# the vLLM performance benchmark's V0 run of Llama 3 70B on 4 x H200 at 1 req/s (a calibration row of
# `tokenpath validate --group latency`): 2.9 ms puts its mean ITL within 0.5% (HOST_STEP_S leaves it 15% short).
VLLM_V0_HOST_STEP_S = default("vllm_v0_host_step_s")
# Per sequence sampled: vLLM V1's Scheduler.update_from_output takes 0.287 ms for 256 decoding
# sequences, 1.12 us each (vllm-project/vllm pull request 46112's micro-benchmark).
HOST_PER_SEQUENCE_S = default("host_per_sequence_s")

# A Python engine's host time per kernel of a step it launches eagerly (no CUDA graph replayed): the
# model's Python forward pass, the PyTorch dispatcher and the launch call, spread over the kernels it
# launches. The measured steps show it adding to the kernels rather than hiding behind them: such a
# step lasts its kernels, plus per kernel the launch gap (compute/efficiency.EAGER_KERNEL_LAUNCH_S) and
# this. (A host running ahead of the GPU would make the step the longer of its kernels and its
# launches; with that form, calibrated the same way at 38 us, prefills of 500 tokens came out 15-16%
# short of DataCrunch's measured TTFTs where prefills of 230 tokens matched, and the latency group's
# TTFT median was 17.7% against 13.3%: tokenpath validate --group latency.) Calibrated once, on
# DataCrunch's SGLang ShareGPT run at 4 req/s (Llama 3.3 70B on 4 x H200, a calibration row of
# `tokenpath validate --group latency`): 17.5 us gives -0.8% TTFT there, 18 us +0.5%. For comparison,
# AIConfigurator times one eager custom all-reduce call in vLLM and SGLang at 19-22 us on H100 and H200
# hosts, where its kernel takes 5 us.
EAGER_HOST_PER_KERNEL_S = default("eager_host_per_kernel_s")
# The profiles that pay it (Profile.eager_host): SGLang's and vLLM V0's, whose model code runs op by op
# in Python when no graph is replayed (calibrated on SGLang, checked on vLLM V0). vLLM V1 compiles its
# model and TensorRT-LLM launches from C++ or fused custom ops: neither host time per kernel is measured
# here, so none. Whether each profile's engine prepares a step while the GPU runs the one before is
# Profile.host_overlap (engine/profiles.py cites each engine).


def host_overlapped(scheduler: str, overlap: bool | None = None) -> bool:
    """Whether the host prepares each step while the GPU runs the one before: `overlap`, or the
    profile's default when None.

    An overlapped scheduler forms a step's batch when it launches the step before (SGLang's
    event_loop_overlap, TensorRT-LLM's overlap executor loop), so a request that arrives while the
    GPU is busy joins the step after next: it waits out the current step and one more. An idle
    engine forms a batch as soon as a request arrives."""
    return PROFILES[scheduler].host_overlap if overlap is None else overlap


def host_step_cost(scheduler: str, overlap: bool | None = None, scheduler_steps: int = 1) -> HostStepCost:
    """The host cost of a step under `scheduler`; `overlap` (None: the profile's) and multi-step windows
    of `scheduler_steps` steps, whose scheduling and input preparation are shared by the window."""
    profile = PROFILES[scheduler]
    step_s = {"host_step_s": assumed("host_step_s", HOST_STEP_S),
              "vllm_v0_host_step_s": assumed("vllm_v0_host_step_s", VLLM_V0_HOST_STEP_S)}[profile.host_step_assumption]
    return HostStepCost(step_s / scheduler_steps,
                        assumed("host_per_sequence_s", HOST_PER_SEQUENCE_S),
                        host_overlapped(scheduler, overlap),
                        assumed("eager_host_per_kernel_s", EAGER_HOST_PER_KERNEL_S) if profile.eager_host else 0.0)
