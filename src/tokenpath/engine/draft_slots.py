"""The KV slots a running request holds for speculative decoding's drafts, where an engine keeps them
from step to step (Profile.draft_hold; engine/held_drafts.py keeps a replica's account of them).

vLLM V1's scheduler gives a running request the KV slots of every token it schedules: a decoding
sequence's verify step, its last token and its k drafts (num_new_tokens = num_tokens_with_spec -
num_computed_tokens), and `num_lookahead_tokens` more (Scheduler.schedule, vllm/v1/core/sched/
scheduler.py: kv_cache_manager.allocate_slots(request, num_new_tokens, num_lookahead_tokens=...), whose
table reaches num_computed_tokens + num_new_tokens + num_lookahead_tokens, KVCacheManager.allocate_slots
in vllm/v1/core/kv_cache_manager.py). The lookahead is k for the drafters that write KV of their own,
EAGLE, EAGLE-3 and MTP (SpeculativeConfig.use_eagle) and a draft model (uses_draft_model), and none
for n-gram drafts (Scheduler.__init__). A request's blocks are given back only when it finishes or is
preempted: rejected drafts roll num_computed_tokens back (update_from_output), not its block table. So
at a step whose context is C a sequence holds the blocks of C + (k + 1) + lookahead tokens.

Under async scheduling (vllm/v1/core/sched/async_scheduler.py) a step is scheduled before the one
before it has returned, its num_computed_tokens already counting that step's k + 1 tokens as if all
were accepted (num_output_placeholders): the table then reaches the context of the step before, plus
2 (k + 1) + lookahead. A sequence's first decode step follows its prompt's, which scheduled no draft,
so it reaches its context plus k + 1 + lookahead in either mode.

Prompt chunks: a running request's chunk takes its lookahead too; a waiting request's first chunk none
(`effective_lookahead_tokens = 0 if request.num_computed_tokens == 0`).

Read in vLLM's main branch (scheduler.py, async_scheduler.py, kv_cache_manager.py,
config/speculative.py), and in earlier scheduler.py versions that set the lookahead for EAGLE and MTP
alone (before V1 ran draft models).

SGLang's speculative V2 worker, which runs EAGLE, EAGLE-3, their MTP (NEXTN) and draft-model (STANDALONE)
drafts under its overlap scheduler (from 0.5.11 by default: engine/speculative.py, sglang_keeps_overlap),
over-allocates by its own rule (EagleDraftInputV2Mixin.prepare_for_decode, python/sglang/srt/speculative/
eagle_info_v2.py): before each decode step a request's table is grown to kv_committed_len + 2 x
alloc_len_per_decode slots, and nothing is given back until it finishes (release_kv_cache frees its
allocated length). alloc_len_per_decode is max(speculative_num_steps x topk, speculative_num_draft_tokens)
(get_alloc_len_per_decode, managers/utils.py), k + 1 for a chain of k drafts (topk = 1, where server_args
sets num_draft_tokens to k + 1). kv_committed_len is the prompt after its prefill (prepare_for_extend) and
grows by each decode step's accepted tokens when its result is processed
(_resolve_spec_overlap_token_ids, managers/scheduler_output_processor_mixin.py), which the overlap
scheduler does after it has prepared the next batch: at a step that follows a decode step it is the
context of the step before, else the context now. The table so reaches that context plus 2 (k + 1), the
verify step's tokens not counted on top; a prompt's chunks over-allocate nothing. Read on SGLang's main
branch. Its V1 worker (the overlap scheduler off: releases before 0.5.11, n-gram drafts, or
--disable-overlap-schedule) frees a verify step's rejected slots after it (EagleVerifyInput.verify).
TensorRT-LLM rewinds a request's rejected drafts after each step (KVCacheManager.rewind_kv_cache,
tensorrt_llm/_torch/pyexecutor/resource_manager.py): no hold.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's drafters that write KV of their own for the drafts they propose (SpeculativeConfig.use_eagle:
# eagle, eagle3, mtp; uses_draft_model: draft_model), whose drafts each running request holds slots for.
VLLM_LOOKAHEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model"})
# SGLang's drafters its speculative V2 worker runs (EAGLE, EAGLE3, NEXTN and STANDALONE); n-gram drafts run
# on a worker of their own, without the overlap scheduler.
SGLANG_V2_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model"})
# Decode steps' over-allocation of SGLang's V2 worker, in alloc_len_per_decode (prepare_for_decode: "2 *").
SGLANG_V2_DECODE_ALLOCATIONS = 2


def vllm_lookahead_tokens(method: str, drafts: int) -> int:
    """vLLM V1's num_lookahead_tokens for a drafter `method` proposing `drafts` tokens a step."""
    return drafts if method in VLLM_LOOKAHEAD_METHODS else 0


def vllm_draft_hold(method: str, drafts: int, lagged: bool) -> DraftHold:
    """vLLM V1's hold: each scheduled token's slot and the lookahead, the scheduled tokens counted computed
    until the step's output is taken in (`lagged`: async scheduling)."""
    lookahead = vllm_lookahead_tokens(method, drafts)
    return DraftHold(drafts + 1, lookahead, counts_scheduled=True, chunk_lookahead=lookahead, lagged=lagged)


def sglang_draft_hold(method: str, drafts: int, lagged: bool) -> DraftHold | None:
    """SGLang's hold: its V2 worker's, which runs with the overlap scheduler (`lagged`) and a drafter of its
    own (not n-gram), committed tokens plus 2 x alloc_len_per_decode (k + 1); None under its V1 worker."""
    if not lagged or method not in SGLANG_V2_METHODS:
        return None
    width = drafts + 1
    return DraftHold(width, SGLANG_V2_DECODE_ALLOCATIONS * width, counts_scheduled=False, chunk_lookahead=0,
                     lagged=True)


@dataclass(frozen=True)
class DraftHold:
    """What a decoding sequence's block table reaches under an engine that keeps its drafts' slots from step to
    step: past a base context, the tokens a verify step schedules (`width`, its drafts and one more, where the
    table counts them: `counts_scheduled`, vLLM's) and `lookahead` more. The base is its context now, or where
    a step is scheduled before the one before it returns (`lagged`: vLLM's async scheduling, SGLang's overlap
    scheduler) and the sequence ran in that step, that step's context, plus the tokens it scheduled there where
    the table counts them. A prompt chunk of a running request reaches `chunk_lookahead` past its tokens."""

    width: int
    lookahead: int
    counts_scheduled: bool
    chunk_lookahead: int
    lagged: bool

    def reach(self, base: int, scheduled: int, scheduled_before: int) -> int:
        """The slots a decoding sequence's table reaches in a step of `scheduled` tokens, `base` its context now
        or (lagged) at the step before, in which it scheduled `scheduled_before` (0: it took no part)."""
        if not self.counts_scheduled:
            return base + self.lookahead
        return base + scheduled_before + scheduled + self.lookahead

    @property
    def first_tokens(self) -> int:
        """Tokens past its context a sequence's first decode step holds: its verify tokens and lookahead."""
        return self.reach(0, self.width, 0)

    @property
    def steady_tokens(self) -> int:
        """Tokens past the context of the step it references (that step, or lagged the one before) a
        decoding sequence holds once it ran full verify steps back to back (one, lagged two)."""
        return self.reach(0, self.width, self.width if self.lagged else 0)

    @property
    def entry_steps(self) -> int:
        """Full decode steps after which a sequence's hold follows the steady rule."""
        return 2 if self.lagged else 1

    @property
    def beyond_last_token(self) -> int:
        """Slots past the last token's that a request can hold at its last step, beyond the plain decode's
        (whose table ends at its last token but one): its context there is at most its length less two
        (less three at the step before), so steady_tokens - 1, or lagged steady_tokens - 2; at its first
        decode step (context at most its length less two) first_tokens - 1."""
        return max(self.first_tokens - 1, self.steady_tokens - (2 if self.lagged else 1))
