"""The KV slots a running request holds for speculative decoding's drafts, where an engine keeps them
from step to step (Profile.draft_lookahead; engine/held_drafts.py keeps a replica's account of them).

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
SGLang and TensorRT-LLM are not given it: SGLang's speculative V1 worker frees a verify step's rejected
slots after it (EagleVerifyInput.verify), and its V2 worker keeps 2 x alloc_len_per_decode slots past
the committed tokens (EagleDraftInputV2Mixin.prepare_for_decode, eagle_info_v2.py), another rule;
TensorRT-LLM rewinds a request's rejected drafts after each step (KVCacheManager.rewind_kv_cache,
tensorrt_llm/_torch/pyexecutor/resource_manager.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's drafters that write KV of their own for the drafts they propose (SpeculativeConfig.use_eagle:
# eagle, eagle3, mtp; uses_draft_model: draft_model), whose drafts each running request holds slots for.
VLLM_LOOKAHEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model"})


def vllm_lookahead_tokens(method: str, drafts: int) -> int:
    """vLLM V1's num_lookahead_tokens for a drafter `method` proposing `drafts` tokens a step."""
    return drafts if method in VLLM_LOOKAHEAD_METHODS else 0


@dataclass(frozen=True)
class DraftHold:
    """What a decoding sequence holds beyond its context under an engine that keeps its drafts' slots:
    `width` tokens a verify step (its drafts and one more), `lookahead` more, and whether a step is
    scheduled before the one before it returns (`lagged`, vLLM's async scheduling)."""

    width: int
    lookahead: int
    lagged: bool

    @property
    def first_tokens(self) -> int:
        """Tokens past its context a sequence's first decode step holds: its verify tokens and lookahead."""
        return self.width + self.lookahead

    @property
    def steady_tokens(self) -> int:
        """Tokens past the context of the step it references (that step, or lagged the one before) a
        decoding sequence holds from its second decode step on (lagged: from its third)."""
        return (2 if self.lagged else 1) * self.width + self.lookahead

    @property
    def entry_steps(self) -> int:
        """Decode steps after which a new decoding sequence's hold follows the steady rule."""
        return 2 if self.lagged else 1

    @property
    def beyond_last_token(self) -> int:
        """Slots past the last token's that a request can hold at its last step, beyond the plain decode's
        (whose table ends at its last token but one): its context there is at most its length less two
        (less three at the step before), so width + lookahead - 1, or lagged 2 width + lookahead - 2."""
        return self.steady_tokens - (2 if self.lagged else 1)
