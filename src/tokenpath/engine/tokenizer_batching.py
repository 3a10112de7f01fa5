"""How long an engine's API server holds a prompt before tokenizing it, waiting for others to tokenize
with it, release by release: a wait on every request's way in, during which the server's CPU is free
for other work (delivery/frontend.py, FrontEnd.requests, models the batches; `delivery.tokenizer_batch_max`
bounds them, 32 by default as in both batchers below).

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

SGLang's dynamic batch tokenizer (SGLang pull request 9382) batches the same way, 32 prompts within 2 ms
(`--dynamic-batch-tokenizer-batch-size`, `--dynamic-batch-tokenizer-batch-timeout`), but only with
`--enable-dynamic-batch-tokenizer`, off by default: a scenario that turns it on states
`delivery.tokenizer_batch_wait = "2 ms"`. TensorRT-LLM's trtllm-serve tokenizes each request as it comes.
"""

from __future__ import annotations

from tokenpath.engine.release import release_at_least

# AsyncMicrobatchTokenizer's wait (its __init__: batch_wait_timeout_s=0.002).
VLLM_TOKENIZER_BATCH_WAIT_S = 0.002
# The first release with it, and the first without.
VLLM_TOKENIZER_BATCHING_RELEASES = ("0.10.0", "0.24.0")


def vllm_tokenizer_batch_wait_s(release: str | None) -> float:
    """vLLM's API server in `release` (None: the newest, which does not wait)."""
    first, gone = VLLM_TOKENIZER_BATCHING_RELEASES
    batches = release_at_least(release, first) and not release_at_least(release, gone)
    return VLLM_TOKENIZER_BATCH_WAIT_S if batches else 0.0


def no_tokenizer_batch_wait(release: str | None) -> float:
    """An engine that tokenizes each request as it comes, in every release read (by default)."""
    return 0.0
