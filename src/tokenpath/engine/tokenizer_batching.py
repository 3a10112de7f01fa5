"""How an engine's API server tokenizes prompts, release by release: on its event loop or in a thread of
its own, and how long it holds a prompt before tokenizing it, waiting for others to tokenize with it (a
wait on every request's way in, during which the server's CPU is free for other work). delivery/frontend.py,
FrontEnd.requests, models both; `delivery.tokenizer_batch_max` bounds the batches, 32 by default as in both
batchers below.

vLLM's OpenAI server tokenizes in a thread of its own from 0.6.5 (vllm/entrypoints/openai/serving_engine.py:
`self._tokenizer_executor = ThreadPoolExecutor(max_workers=1)` and the `_tokenize_prompt_input_async` it
runs on; read in the wheels of 0.6.4, not yet, and of 0.6.5, 0.6.6, 0.7.0 and 0.8.3), later in the
batcher's executor thread below (0.10.0 to 0.23.0) and from 0.24.0 in its renderer's (both one thread as
far as read). The chat template is rendered on the loop before (`apply_hf_chat_template`, synchronous in
`_preprocess_chat`). A Hugging Face fast tokenizer encodes in Rust with the GIL released (tokenizers'
`encode_batch`, which transformers' fast tokenizers call for one text too), so the thread runs beside the
loop: a prompt's tokenizing waits for the prompts tokenized before it, not for the loop's other work
(measured here: a Python thread kept its pace, 20.9M loop turns against 8.9M a sleeping half second, while
`encode_batch` ran, and 0.7M under `encode`). SGLang's TokenizerManager (`_tokenize_one_request`,
`self.tokenizer.encode`) and trtllm-serve's input processor tokenize on the loop, synchronously.

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

# The first vLLM release that tokenizes in a thread of its own.
VLLM_TOKENIZER_THREAD_SINCE = "0.6.5"


def vllm_tokenizes_in_thread(release: str | None) -> bool:
    """Whether vLLM's API server in `release` (None: the newest) tokenizes off its event loop."""
    return release_at_least(release, VLLM_TOKENIZER_THREAD_SINCE)


def no_tokenizer_thread(release: str | None) -> bool:
    """An engine whose API server tokenizes on its event loop (no thread of its own), in every release read."""
    return False


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
