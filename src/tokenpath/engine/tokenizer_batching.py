"""How long an engine's API server holds a prompt before tokenizing it, waiting for others to tokenize
with it, release by release: a wait on every request's way in, during which the server's CPU is free
for other work (delivery/frontend.py, FrontEnd.requests, models the batches).

vLLM 0.10.0 to 0.23.0 tokenize every text prompt, chat or completion, through `AsyncMicrobatchTokenizer`
(vllm/utils/__init__.py, from 0.23.0 vllm/utils/async_utils.py; called from entrypoints/openai/
serving_engine.py's `_normalize_prompt_text_to_input`, later from the renderer's `_tokenize_prompt_async`),
vLLM pull request 19334. Its batching task takes the first prompt waiting, sets a deadline
`batch_wait_timeout_s` (0.002 s) later and takes every prompt that arrives before it, up to
`max_batch_size` (32); only then does it tokenize them, together, in its executor thread. A prompt alone
waits the whole 2 ms. vLLM pull request 45759 removed it for 0.24.0 ("uses a 2ms wait_timeout, which is too
large for preprocessing, as the normal time for most tokenizer.encode calls is ~0.1ms"); 0.24.0
tokenizes each prompt in the renderer's thread pool at once. Read in the wheels of 0.9.2 (not yet),
0.10.0, 0.11.0, 0.23.0 and 0.24.0 (gone).

SGLang's dynamic batch tokenizer (`--enable-dynamic-batch-tokenizer`, SGLang pull request 9382) is off by
default, and TensorRT-LLM's trtllm-serve tokenizes each request as it comes: neither waits.
"""

from __future__ import annotations

from typing import NamedTuple

from tokenpath.engine.release import release_at_least

# AsyncMicrobatchTokenizer's defaults (its __init__: batch_wait_timeout_s=0.002, max_batch_size=32).
VLLM_TOKENIZER_BATCH_WAIT_S = 0.002
VLLM_TOKENIZER_BATCH_MAX = 32
# The first release with it, and the first without.
VLLM_TOKENIZER_BATCHING_RELEASES = ("0.10.0", "0.24.0")


class TokenizerBatching(NamedTuple):
    """A front end's tokenizer batches: each is open `wait_s` after its first prompt arrives, for at most
    `max_prompts` prompts."""

    wait_s: float
    max_prompts: int


NO_BATCHING = TokenizerBatching(0.0, 1)


def vllm_tokenizer_batching(release: str | None) -> TokenizerBatching:
    """vLLM's API server in `release` (None: the newest, which does not batch)."""
    first, gone = VLLM_TOKENIZER_BATCHING_RELEASES
    if release_at_least(release, first) and not release_at_least(release, gone):
        return TokenizerBatching(VLLM_TOKENIZER_BATCH_WAIT_S, VLLM_TOKENIZER_BATCH_MAX)
    return NO_BATCHING


def no_tokenizer_batching(release: str | None) -> TokenizerBatching:
    """An engine that tokenizes each request as it comes, in every release read."""
    return NO_BATCHING
