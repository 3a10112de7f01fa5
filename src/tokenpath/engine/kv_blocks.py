"""The KV cache's block size an engine picks when the scenario does not set `[engine] block_size`
(Profile.default_block_size).

vLLM V1's cache blocks are 16 tokens through 0.33 and 64 from 0.34.0 (vllm/config/cache.py,
CacheConfig.DEFAULT_BLOCK_SIZE, read in the wheels of 0.18.0 to 0.34.0; the attention backend keeps it
where it supports it, as FlashAttention, FlashInfer and Triton's do: Platform.update_block_size_for_backend).
The other profiles take 16, which their launches write (SGLang's --page-size, TensorRT-LLM's
tokens_per_block), not their engines' own 1 and 32.
"""

from __future__ import annotations

from tokenpath.engine.release import release_at_least

DEFAULT_BLOCK_SIZE = 16
VLLM_BLOCK_SIZE_64_SINCE = "0.34.0"
VLLM_BLOCK_SIZE_0_34 = 64


def vllm_block_size(release: str | None) -> int:
    """vLLM V1's KV-cache block size in `release` (the newest where it states none)."""
    return VLLM_BLOCK_SIZE_0_34 if release_at_least(release, VLLM_BLOCK_SIZE_64_SINCE) else DEFAULT_BLOCK_SIZE
