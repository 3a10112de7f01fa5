"""The most sequences and tokens of a step an engine picks for itself when its launch does not say,
for the GPU it runs on: each profile's `batch_limits` (engine/profiles.py). The scenario applies them
to the [engine] settings its table leaves out (sim/scenario.py); where a limit is None, or the chip is
not known (an EngineSpec on its own), the [engine] table's defaults stand: 1024 sequences and 8192
tokens, vLLM V1's on an H100-class GPU.
"""

from __future__ import annotations

from typing import NamedTuple

from tokenpath.config.units import parse_bytes
from tokenpath.engine.cuda_graphs import sglang_defaults
from tokenpath.engine.release import release_at_least


class BatchLimits(NamedTuple):
    """Defaults of `[engine] max_num_seqs` and `max_num_batched_tokens` (None: the table's own)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def given(self) -> dict[str, int]:
        """The [engine] settings these limits set, by name (those not None)."""
        return {name: value for name, value in self._asdict().items() if value is not None}


# vLLM V1's OpenAI server (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, and
# tests/engine/test_arg_utils.py, test_defaults_with_usage_context): 1024 sequences and 8192 tokens a
# step on a GPU of 70 GiB or more whose name does not contain "a100", else 256 and 2048, since 0.9.0
# (vllm-project/vllm pull request 17885, "Use small max_num_batched_tokens for A100", May 2025). 0.8.5
# gave the larger pair to every GPU of 70 GiB or more, the A100 too (pull request 17073, April 2025), and
# the releases from 0.7.0 to 0.8.4 to H100 and H200 alone, by name (pull request 12369, January 2025:
# EngineArgs._set_default_args_v1, 'if "h100" in device_name or "h200" in device_name').
# From 0.28.0 a GPU of 160 GiB or more (B200, GB200, MI300X, MI325X) takes 16384 tokens a step ("for
# GPUs like B200/B300 with >= 160GB memory, use the largest defaults"; read in the wheels of 0.27.1, 0.28.0
# and 0.34.0).
VLLM_V1_LARGE_GPU_BYTES = parse_bytes("70 GiB")
VLLM_V1_BY_MEMORY_SINCE = "0.8.5"
VLLM_V1_NOT_A100_SINCE = "0.9.0"
VLLM_V1_LARGE_GPU_LIMITS = BatchLimits(1024, 8192)
VLLM_V1_OTHER_GPU_LIMITS = BatchLimits(256, 2048)
VLLM_V1_LARGEST_GPU_BYTES = parse_bytes("160 GiB")
VLLM_V1_LARGEST_GPU_SINCE = "0.28.0"
VLLM_V1_LARGEST_GPU_LIMITS = BatchLimits(1024, 16384)
# vLLM V0 ran at most 256 sequences by default (EngineArgs.max_num_seqs before V1's defaults).
VLLM_V0_MAX_NUM_SEQS = 256
# trtllm-serve (tensorrt_llm/commands/serve.py) defaults --max_batch_size and --max_num_tokens to
# BuildConfig's (tensorrt_llm/builder.py: max_batch_size 2048, max_num_tokens 8192), on any GPU.
TRTLLM_SERVE_LIMITS = BatchLimits(2048, 8192)


def vllm_v1_batch_limits(chip: str | None, hbm_bytes: float | None, release: str | None = None) -> BatchLimits:
    """vLLM V1's defaults on the catalog chip `chip` of `hbm_bytes` (None: not known) in the release
    `release` states (the newest where it states none)."""
    if chip is None or hbm_bytes is None:
        return BatchLimits()
    if hbm_bytes >= VLLM_V1_LARGEST_GPU_BYTES and release_at_least(release, VLLM_V1_LARGEST_GPU_SINCE):
        return VLLM_V1_LARGEST_GPU_LIMITS
    name = chip.lower()
    if not release_at_least(release, VLLM_V1_BY_MEMORY_SINCE):
        large = "h100" in name or "h200" in name
    else:
        large = hbm_bytes >= VLLM_V1_LARGE_GPU_BYTES
        if release_at_least(release, VLLM_V1_NOT_A100_SINCE):
            large = large and "a100" not in name
    return VLLM_V1_LARGE_GPU_LIMITS if large else VLLM_V1_OTHER_GPU_LIMITS


def vllm_v0_batch_limits(chip: str | None, hbm_bytes: float | None, release: str | None = None) -> BatchLimits:
    """vLLM V0's: 256 sequences on any GPU; the token budget the table's."""
    return BatchLimits(VLLM_V0_MAX_NUM_SEQS)


def sglang_batch_limits(chip: str | None, hbm_bytes: float | None, release: str | None = None) -> BatchLimits:
    """SGLang's chunked_prefill_size by the GPU's memory in its release (engine/cuda_graphs.py, the same
    rule of server_args.py, whatever the tensor-parallel size); its running requests follow from its KV
    pool once sized (sglang_max_running_requests)."""
    return BatchLimits() if hbm_bytes is None else BatchLimits(None, sglang_defaults(hbm_bytes, 1, release)[0])


# SGLang's running requests where speculative decoding is on and --max-running-requests is not given
# (server_args.py, ServerArgs.__post_init__ / _handle_speculative_decoding, read in each release's wheel):
# 32 with EAGLE (and NEXTN, its MTP) in 0.4.3 and 0.4.4, 48 from 0.4.5 with every drafter (EAGLE, EAGLE3,
# NEXTN, STANDALONE, NGRAM), through 0.5.23 (srt/arg_groups/speculative_hook.py there).
SGLANG_SPECULATIVE_MAX_RUNNING = 48
SGLANG_SPECULATIVE_MAX_RUNNING_BEFORE_0_4_5 = 32


def sglang_speculative_max_running(release: str | None) -> int:
    """SGLang's default running requests with speculative decoding on, in `release`."""
    return (SGLANG_SPECULATIVE_MAX_RUNNING if release_at_least(release, "0.4.5")
            else SGLANG_SPECULATIVE_MAX_RUNNING_BEFORE_0_4_5)


# SGLang's running requests where --max-running-requests is not given (managers/tp_worker.py and
# model_executor/model_runner.py from 0.3.2; mem_cache/kv_cache_configurator.py, resolve_max_num_reqs, in
# 0.5.17 to 0.5.23): per data-parallel attention worker, its KV pool's tokens over the model's context
# length x 512, held within 2,048 to 4,096, and at most half the pool's tokens.
SGLANG_RUNNING_PER_CONTEXT = 512
SGLANG_RUNNING_FLOOR = 2048
SGLANG_RUNNING_CEILING = 4096


def sglang_max_running_requests(pool_tokens: int, context_len: int) -> int:
    """SGLang's default running requests of a worker whose KV pool holds `pool_tokens`, for a model of
    `context_len` tokens of context."""
    estimated = int(pool_tokens / context_len * SGLANG_RUNNING_PER_CONTEXT)
    return min(max(estimated, SGLANG_RUNNING_FLOOR), SGLANG_RUNNING_CEILING, pool_tokens // 2)


def trtllm_batch_limits(chip: str | None, hbm_bytes: float | None, release: str | None = None) -> BatchLimits:
    """trtllm-serve's on every GPU: BuildConfig's 2048 requests and 8192 tokens a step."""
    return TRTLLM_SERVE_LIMITS


# Where the decoding sequences' tokens pass max_num_batched_tokens (Profile.decodes_past_budget).
# vLLM V1 (Scheduler.schedule, vllm/v1/core/sched/scheduler.py, read on its main branch): its running requests,
# in their running order (admission order), each take min(num_new_tokens, token_budget), a decode's
# num_new_tokens its last token and its drafts, and the loop ends once the budget is spent (`while req_index <
# len(self.running) and token_budget > 0`). The request that meets the budget's end runs what is left, its
# drafts cut to num_new_tokens - 1 (`spec_token_ids[:num_scheduled_spec_tokens]`; none where one token is
# left), its table reaching those tokens and the lookahead (allocate_slots); those after it are not scheduled
# that step and keep their blocks, their place and their drafts for a later step; no waiting request is
# admitted (`while self.waiting and token_budget > 0`). Its SchedulerConfig refuses max_num_batched_tokens <
# max_num_seqs, not < max_num_seqs x (1 + k): with its defaults from k = 8 drafts (1,024 x 9 > 8,192).
# TensorRT-LLM (MicroBatchScheduler::operator(), cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp;
# PyMicroBatchScheduler.schedule, tensorrt_llm/_torch/pyexecutor/scheduler.py) takes max_num_tokens below
# max_batch_size (or below max_batch_size x (1 + drafts)) as it is: neither trtllm-serve nor its LLM API refuses
# or clamps the pair (a TensorRT engine's build clamps max_num_tokens only against max_seq_len x max_batch_size
# and tokens_per_block, _utils.check_max_num_tokens). Its micro-batch scheduler goes through the requests its
# capacity scheduler fits, in their order, adds each generation request's beam width and draft tokens, and stops
# at the first that would pass max_num_tokens (`break`), draft tokens untrimmed: that one and every request
# after it, contexts too, wait. The capacity scheduler fits up to max_batch_size requests by their KV alone
# (GuaranteedNoEvictScheduler, cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp: every generation request in
# progress, its blocks to completion reserved, then the contexts whose blocks to completion fit the rest), so a
# generation request that waits keeps its blocks and its reservation, and contexts are admitted while the
# budget has room after the generation requests, up to max_batch_size. Its CUDA graphs stop at the decodes a
# step holds (_filter_cuda_graph_batch_sizes, tensorrt_llm/_torch/pyexecutor/model_engine.py:
# min(max_batch_size, max_num_tokens / (1 + max_draft_len))).
def decodes_a_step(max_num_seqs: int, max_num_batched_tokens: int, width: int, trims: bool) -> int:
    """The most decoding sequences a step runs where those past the budget wait: as many as
    max_num_batched_tokens holds at `width` tokens each (1, or speculating the drafts and one more), and where
    the engine `trims` the drafts of the one that meets the budget's end, that one too."""
    whole, rest = divmod(max_num_batched_tokens, width)
    return min(max_num_seqs, whole + (1 if trims and rest else 0))
