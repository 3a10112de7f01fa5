"""The `sharegpt` length distribution: ShareGPT V3 as serving benchmarks sample it.

vLLM's `benchmark_serving` / `vllm bench serve` and SGLang's `bench_serving` take the first turn of
ShareGPT_V3_unfiltered_cleaned_split.json conversations with at least two turns, tokenize the prompt
and the reference completion, and drop pairs with either under 4 tokens, a prompt over 1024 tokens or
both together over 2048 (vllm/benchmarks/datasets.py, `is_valid_sequence`). The completion's token
count is the request's output length.

Published for that filter with the Llama-3 tokenizer: 215,196 input and 198,343 generated tokens over
1000 prompts (vllm-project/vllm pull request 13305, 2025-03-19; the same input total in issue 7567).
No spread of the filtered set is published, so each length is drawn from a lognormal with the
published mean and a coefficient of variation of SHAREGPT_ASSUMED_CV (an assumption: conversation
lengths are heavy-tailed), then clipped to the filter's bounds. Nothing is downloaded.
"""

from __future__ import annotations

SHAREGPT_MEAN_TOKENS = {"input": 215.196, "output": 198.343}
SHAREGPT_ASSUMED_CV = 1.0
# The benchmark clients' filter: at least 4 tokens each, a prompt of at most 1024, both at most 2048.
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_TOKENS = {"input": 1024, "output": 2048 - SHAREGPT_MIN_TOKENS}
