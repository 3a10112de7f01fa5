"""The host's share of an engine step: what the engine's own process does around the GPU's kernels.

An engine's host schedules the batch and prepares its inputs (block tables, positions, sampling
parameters) when it calls its scheduler, and samples and processes the outputs: a fixed part per
scheduler call, a fixed part every step, and a part per sequence sampled. Where that runs in the step's
critical path it adds to the step's time; an engine that prepares the next step while the GPU runs the
current one (SGLang's zero-overhead batch scheduler since v0.4, TensorRT-LLM's overlap scheduler, on by
default in its PyTorch backend; the C++ executor that runs built TensorRT engines has none) hides it
behind the GPU, and a step then lasts the longer of the two (`[engine] host_overlap` overrides the
profile's default). Every step calls the scheduler but those inside a multi-step window after its
first (vLLM V0's num_scheduler_steps): they pay the part every step and the part per sequence only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.config.assumptions import assumed, default
from tokenpath.engine.profiles import PROFILES


@dataclass(frozen=True)
class HostStepCost:
    """Host time of a step: `window_s` when it calls the scheduler (a step of its own, or a multi-step
    window's first), `step_s` every step, plus `per_sequence_s` for every sequence that samples a token;
    `overlapped`: prepared while the GPU runs the step before; `eager_per_kernel_s`: the host's time
    per kernel, added to the kernels, when the step replays no CUDA graph."""

    window_s: float
    step_s: float
    per_sequence_s: float
    overlapped: bool
    eager_per_kernel_s: float = 0.0


# The fixed host time of a step, the same order for every engine written in Python around the GPU:
# 0.76 ms, of which vLLM's V1 scheduler and input preparation take most at small batches. Fitted in
# code on the TPOT / ITL of the rows whose steps wait for it (vLLM V1, and NIM and SGLang v0.3 run
# without overlap; validate/fit.py), with the other constants fitted before it; an order of magnitude
# to calibrate per deployment (0.286 ms before the rows ran through the front end, docs/validation.md). The profiles
# other than vllm-v0 pay it per scheduler call (their host_window_assumption): every step, but under
# multi-step windows once a window.
HOST_STEP_S = default("host_step_s")
# vLLM's V0 engine (the vllm-v0 profile): its fixed host time, in the step's path, in two parts, as
# its code splits the work between a scheduler call and a step. V0 schedules, builds the step's inputs
# and metadata in Python and waits for the sampler every step, the costs V1 was rewritten to cut
# (vLLM's V1 announcement, January 2025). With --num-scheduler-steps k (vLLM 0.6, vllm-project/vllm):
# - Once per window, VLLM_V0_HOST_WINDOW_S: LLMEngine.step (vllm/engine/llm_engine.py) calls
#   Scheduler.schedule only when `_has_remaining_steps` finds the window done, and keeps its output for
#   the window's other steps (`_cache_scheduler_outputs_for_multi_step`); the worker builds the model's
#   inputs, ModelRunner.prepare_model_input (vllm/worker/model_runner.py: tokens, positions, slot
#   mapping, block tables, attention metadata and SamplingMetadata.prepare, in Python per sequence),
#   on the window's first step only (MultiStepWorker._get_driver_input_and_broadcast,
#   vllm/worker/multi_step_worker.py, `is_first_multi_step`), and reuses them.
# - Every step, VLLM_V0_HOST_STEP_S: LLMEngine.step itself (an ExecuteModelRequest, execute_model, and
#   `finish_step` on every sequence group); in MultiStepModelRunner.execute_model (vllm/worker/
#   multi_step_model_runner.py), on every step after the first, the wait on the step before and
#   `_advance_step`: the attention metadata's sequence lengths in a Python loop, and ops.advance_step, a
#   kernel, for the tokens, positions and slots on the GPU; the driver broadcasting the model input to
#   the tensor-parallel workers; the model and the sampler, which rebuilds its sampling tensors every
#   step (`reuse_sampling_tensors = False` on the first step and the others); and pythonizing each
#   step's sampled ids into SequenceOutput objects (`_pythonize_sampler_output`: a copy to pinned memory
#   and a Python loop over the sequence groups). The engine processes the window's outputs at its end
#   (detokenizing and checking stops for every token of it), work per token: HOST_PER_SEQUENCE_S and the
#   delivery path's per-token costs.
# A V0 step run one at a time pays both parts. Each is fitted in code (validate/fit.py): the window part
# on the V0 rows run one step at a time (the vLLM performance benchmark's V0 run of Llama 3 70B on
# 4 x H200 at 1 req/s, and Azure's vLLM 0.8.3 pipeline-parallel run, which fell back to V0; their ITL
# and TPOT set the sum), then the step part on the rows run with 10-step windows (SGLang's benchmark of
# vLLM 0.6.0), given the window part. The two values are where each part's fit, the others held, stays
# put: 1.92 ms and 0.114 ms (`tokenpath validate --cross`, the fit on every row; docs/validation.md has
# each row's error). One constant shared by the window (the model before this split) could not fit both:
# the multi-step rows wanted 15.5 ms a window, 1.55 ms a step, where the single-step row wanted 2.9 ms.
VLLM_V0_HOST_WINDOW_S = default("vllm_v0_host_window_s")
VLLM_V0_HOST_STEP_S = default("vllm_v0_host_step_s")
# Per sequence sampled: vLLM V1's engine core schedules a step, takes its sampled tokens back and encodes
# the outputs for the API server in 7.57 us a decoding sequence (vLLM 0.11.0's own Scheduler.schedule,
# update_from_output and MsgpackEncoder, run without a GPU on this project's 2-core machine, 16 to 1,024
# sequences: benchmarks/vllm_scheduler_host.py). update_from_output alone is 2.1 us of it (vllm-project/
# vllm pull request 46112 timed it at 1.12 us on its machine); the GPU worker's own per-request work is
# not in it. The same figure stands for the other engines' Python schedulers, none of which is timed.
HOST_PER_SEQUENCE_S = default("host_per_sequence_s")

# A Python engine's host time per kernel of a step it launches eagerly (no CUDA graph replayed): the
# model's Python forward pass, the PyTorch dispatcher and the launch call, spread over the kernels it
# launches. The host queues kernels ahead of the GPU, so an eager step lasts the longer of its kernels
# and its launches, plus at most a layer of the shorter (compute/roofline.launch_queue_s): short
# kernels wait on the host, long ones (a large model's, a long prompt's) hide it. (Added to every kernel
# instead, as this model did before, a 405B model's eager prompts at TP8 paid some 40 ms of launches on
# top of kernels that hide them.) Fitted in code on the TTFT of every SGLang and vLLM V0 row
# (validate/fit.py): 63.2 us (72.7 us before the rows ran through the front end). The rows side
# with neither form alone: on the SGLang cookbook's B200 runs at concurrency 1, a 4,194-token prompt
# takes 23 ms (Qwen3-235B) and 14 ms (DeepSeek-R1) longer than a 610-token one; the kernels alone grow
# by 40 and 46 ms (launches added to them keep that growth), the queue by 0.4 and 0.8 ms, both prompts
# waiting on their launches. Something that grows with the
# prompt is missing, and this value, above what the engines' own timings suggest, stands in for it at
# short prompts (docs/validation.md, "The host's launches queue ahead"). AIConfigurator times one eager
# custom all-reduce call in vLLM and SGLang at 19-22 us on H100 and H200 hosts (41-50 us on A100
# hosts), where its kernel takes 5 us.
EAGER_HOST_PER_KERNEL_S = default("eager_host_per_kernel_s")
TRTLLM_EAGER_HOST_PER_KERNEL_S = default("trtllm_eager_host_per_kernel_s")
# The profiles that pay it (Profile.eager_host): SGLang's and vLLM V0's, whose model code runs op by op
# in Python when no graph is replayed (one value for both: vLLM V0's own, fitted on its rows run a step
# at a time, came out at 48 us and left the cross-validated TTFT no better). vLLM V1 compiles its
# model: no host time per kernel is measured for it, so none.
# TensorRT-LLM's PyTorch backend launches a step that holds a prompt eagerly too, its layers written as
# fewer fused custom ops (engine/eager_launches.py counts them) whose dispatch is C++: its own value,
# TRTLLM_EAGER_HOST_PER_KERNEL_S, fitted in code on the TTFT of the TensorRT-LLM rows that run that
# backend (validate/fit.py). Its TensorRT engines launch from C++ and pay none (`[engine] eager_host =
# false`). Whether each profile's engine prepares a step while the GPU runs the one before is
# Profile.host_overlap (engine/profiles.py cites each engine). An overlapped host launches that step
# then too: SGLang's event_loop_overlap (python/sglang/srt/managers/scheduler.py) runs the next batch,
# its kernels launched, before it waits for the current one's results, so once a busy engine's host has
# done its own work in a step (host_s, and that step's launches if eager) it launches the next step's
# kernels for the rest of it, and an eager prompt that joins a decoding batch waits on only the rest
# of its launches (compute/roofline.ComputeModel.launch_wait_s's `ahead_s`, engine/replica.py).


def host_overlapped(scheduler: str, overlap: bool | None = None) -> bool:
    """Whether the host prepares each step while the GPU runs the one before: `overlap`, or the
    profile's default when None.

    An overlapped scheduler forms a step's batch when it launches the step before (SGLang's
    event_loop_overlap, TensorRT-LLM's overlap executor loop), so a request that arrives while the
    GPU is busy joins the step after next: it waits out the current step and one more. An idle
    engine forms a batch as soon as a request arrives."""
    return PROFILES[scheduler].host_overlap if overlap is None else overlap


def eager_host_paid(scheduler: str, eager_host: bool | None = None) -> str | None:
    """The host time per kernel (the registry's name) an eager step pays under `scheduler`, unless
    `eager_host` is False (its kernels launched from compiled code); None: none."""
    return None if eager_host is False else PROFILES[scheduler].eager_host


def host_step_cost(scheduler: str, overlap: bool | None = None, eager_host: bool | None = None) -> HostStepCost:
    """The host cost of a step under `scheduler`, `overlap` and `eager_host` (None: the profile's)."""
    profile = PROFILES[scheduler]
    fixed_s = {"host_step_s": assumed("host_step_s", HOST_STEP_S),
               "vllm_v0_host_window_s": assumed("vllm_v0_host_window_s", VLLM_V0_HOST_WINDOW_S),
               "vllm_v0_host_step_s": assumed("vllm_v0_host_step_s", VLLM_V0_HOST_STEP_S), None: 0.0}
    per_kernel_s = {"eager_host_per_kernel_s": assumed("eager_host_per_kernel_s", EAGER_HOST_PER_KERNEL_S),
                    "trtllm_eager_host_per_kernel_s": assumed("trtllm_eager_host_per_kernel_s",
                                                              TRTLLM_EAGER_HOST_PER_KERNEL_S), None: 0.0}
    return HostStepCost(fixed_s[profile.host_window_assumption], fixed_s[profile.host_step_assumption],
                        assumed("host_per_sequence_s", HOST_PER_SEQUENCE_S),
                        host_overlapped(scheduler, overlap),
                        per_kernel_s[eager_host_paid(scheduler, eager_host)])
