"""SGLang's admission headroom: the share of the running requests' outputs still to come that a new
request must leave room for in the KV cache.

SGLang's scheduler (python/sglang/srt/managers/schedule_policy.py, PrefillAdder) admits a waiting
request only while its prompt plus its max_new_tokens (clipped at CLIP_MAX_NEW_TOKENS_ESTIMATION)
fits in the free KV cache less `new_token_ratio` times the running requests' outputs still to come,
each clipped at CLIP_MAX_NEW_TOKENS_ESTIMATION too (_get_running_request_total_token_offset), and less
what it admitted before it in the same step. The ratio starts at INIT_NEW_TOKEN_RATIO, falls
by a fixed decrement with every decode step (update_running_batch) to MIN_NEW_TOKEN_RATIO_FACTOR of
that, and when a decode step does not fit and requests are retracted it becomes the running
requests' share decoded so far, plus RETRACT_DECODE_STEPS tokens each, of their max_new_tokens plus one
(ScheduleBatch.retract_decode; estimate_new_token_ratio_after_retract in 0.5.23):
over-admission makes it cautious again. An idle engine starts over at INIT_NEW_TOKEN_RATIO
(self_check_during_idle). The defaults are python/sglang/srt/global_config.py's (v0.4 to v0.5),
scaled by --schedule-conservativeness (managers/scheduler.py, init_new_token_ratio): 1 by default, and
0.3 of it with data-parallel attention (ATTENTION_DP_CONSERVATIVENESS).

Where the cache has room, this changes nothing; under overload it keeps the engine from admitting
requests that it must retract a few steps later (and recompute), which otherwise thrashes.
"""

from __future__ import annotations

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096
ATTENTION_DP_CONSERVATIVENESS = 0.3
"""SGLang multiplies --schedule-conservativeness by 0.3 when attention is data-parallel (server_args.py,
_handle_data_parallelism, in 0.5.6; arg_groups/parallel_hook.py in 0.5.23)."""


class NewTokenRatio:
    """The ratio's value as the engine runs."""

    def __init__(self, conservativeness: float = 1.0) -> None:
        self.initial = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.minimum = min(self.initial * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decrement = (self.initial - self.minimum) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.initial

    def decoded(self) -> None:
        """One decode step ran."""
        value = self.value - self.decrement
        self.value = value if value > self.minimum else self.minimum

    def retracted(self, decoded_tokens: int, max_new_tokens: int, running: int) -> None:
        """A decode step retracted requests; the others, `running`, have decoded `decoded_tokens` of
        their `max_new_tokens`."""
        if not max_new_tokens:
            self.value = self.initial
            return
        estimate = (decoded_tokens + RETRACT_DECODE_STEPS * running) / (max_new_tokens + 1)  # (SGLang's + 1)
        self.value = estimate if estimate < 1.0 else 1.0

    def idle(self) -> None:
        self.value = self.initial

    def spare_tokens(self, free_tokens: int, outputs_to_come: int) -> float:
        """KV tokens left for new requests: the free ones less the ratio's share of what the running
        requests will still write."""
        return free_tokens - self.value * outputs_to_come


def new_request_tokens(prompt_tokens: int, outputs_to_come: int, cache_tokens: int) -> int:
    """What a waiting request must fit: the prompt it still has to compute and its output, clipped;
    at most one token less than the whole cache of `cache_tokens` (SGLang caps a request's
    max_new_tokens so that it fits the KV pool alone), so an idle engine always admits it."""
    tokens = prompt_tokens + min(outputs_to_come, CLIP_MAX_NEW_TOKENS_ESTIMATION)
    return tokens if tokens < cache_tokens else cache_tokens - 1
