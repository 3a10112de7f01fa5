"""The `sharegpt` length distribution: ShareGPT V3 as serving benchmarks sample it.

vLLM's `benchmark_serving` / `vllm bench serve` and SGLang's `bench_serving` take the first turn of
ShareGPT_V3_unfiltered_cleaned_split.json conversations with at least two turns, tokenize the prompt
and the reference completion, and drop pairs with either under 4 tokens, a prompt over 1024 tokens or
both together over 2048 (vllm/benchmarks/datasets/datasets.py, `is_valid_sequence`, in vllm 0.27.1).
The completion's token count is the request's output length.

Published for that filter with the Llama-3 tokenizer: 215,196 input and 198,343 generated tokens over
1000 prompts (vllm-project/vllm pull request 13305, 2025-03-19; the same input total in issue 7567).
No spread of the filtered set is published, so each length is a rounded lognormal with a coefficient
of variation of SHAREGPT_ASSUMED_CV before the filter (an assumption: conversation lengths are
heavy-tailed), and a pair outside the filter is drawn again, as the clients skip it. The lognormals'
log-means are solved (`sharegpt_log_means`) so that the pairs the filter keeps have the published means:
with both lengths `sharegpt` the whole filter applies; with one, its own bounds alone, and its mean is
then 0.06% (input, 215.33) and 0.4% (output, 199.16) above the published one. Solved: log-means 5.1014
(input) and 4.9558 (output), log-sd sqrt(ln 2) = 0.8326 (means before the filter 232.3 and 200.8);
`sharegpt_log_means` solves them on first use, in a few ms. Nothing is downloaded.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

SHAREGPT_MEAN_TOKENS = {"input": 215.196, "output": 198.343}
SHAREGPT_ASSUMED_CV = 1.0
# The benchmark clients' filter: at least 4 tokens each, a prompt of at most 1024, both at most 2048.
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_TOTAL_TOKENS = 2048
SHAREGPT_MAX_TOKENS = {"input": 1024, "output": SHAREGPT_MAX_TOTAL_TOKENS - SHAREGPT_MIN_TOKENS}


def sharegpt_sigma() -> float:
    """The lognormals' log-sd: that of a lognormal with SHAREGPT_ASSUMED_CV."""
    return math.sqrt(math.log1p(SHAREGPT_ASSUMED_CV**2))


def _pmf(side: str, log_mean: float) -> np.ndarray:
    """P(a rounded lognormal draw is k) for k = 0 .. the side's maximum (k below the minimum: 0)."""
    from scipy.special import ndtr  # (here: scipy.special takes a third of the command line's start-up)

    k = np.arange(SHAREGPT_MAX_TOKENS[side] + 1, dtype=np.float64)
    edges = (np.log(np.append(k - 0.5, k[-1] + 0.5).clip(1e-300)) - log_mean) / sharegpt_sigma()
    pmf = np.diff(ndtr(edges))
    pmf[:SHAREGPT_MIN_TOKENS] = 0.0
    return pmf


def filtered_means(log_means: dict[str, float]) -> dict[str, float]:
    """The means of the pairs the clients' filter keeps, both lengths drawn with these log-means."""
    p_in, p_out = _pmf("input", log_means["input"]), _pmf("output", log_means["output"])
    tokens_in, tokens_out = np.arange(len(p_in)), np.arange(len(p_out))
    room = np.minimum(SHAREGPT_MAX_TOTAL_TOKENS - tokens_in, len(p_out) - 1)  # the longest output each input allows
    kept_out = np.cumsum(p_out)[room]
    tokens_kept_out = np.cumsum(tokens_out * p_out)[room]
    kept = float((p_in * kept_out).sum())
    return {"input": float((tokens_in * p_in * kept_out).sum()) / kept,
            "output": float((p_in * tokens_kept_out).sum()) / kept}


@cache
def sharegpt_log_means() -> dict[str, float]:
    """The lognormals' log-means whose filtered pairs have the published means, by fixed-point
    iteration on log(published / filtered mean): the filtered mean grows slower than e^mu, so each step
    undershoots and it converges (about 20 steps to 1e-12)."""
    sigma = sharegpt_sigma()
    log_means = {side: math.log(mean) - sigma**2 / 2 for side, mean in SHAREGPT_MEAN_TOKENS.items()}
    for _ in range(200):
        means = filtered_means(log_means)
        steps = {side: math.log(SHAREGPT_MEAN_TOKENS[side] / means[side]) for side in log_means}
        log_means = {side: log_means[side] + steps[side] for side in log_means}
        if max(abs(step) for step in steps.values()) < 1e-12:
            return log_means
    raise AssertionError("the ShareGPT log-means did not converge")


def sharegpt_draws(side: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n lengths of one side (int64), each drawn again until it is within that side's bounds."""
    log_mean, sigma = sharegpt_log_means()[side], sharegpt_sigma()
    tokens = _rounded(rng.lognormal(log_mean, sigma, n))
    out = np.flatnonzero(~_within(side, tokens))
    while out.size:
        tokens[out] = _rounded(rng.lognormal(log_mean, sigma, out.size))
        out = out[~_within(side, tokens[out])]
    return tokens


def redraw_long_pairs(input_tokens: np.ndarray, output_tokens: np.ndarray,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The pairs with both lengths over SHAREGPT_MAX_TOTAL_TOKENS drawn again, both lengths, until none is."""
    input_tokens, output_tokens = input_tokens.copy(), output_tokens.copy()
    long = np.flatnonzero(input_tokens + output_tokens > SHAREGPT_MAX_TOTAL_TOKENS)
    while long.size:
        input_tokens[long] = sharegpt_draws("input", long.size, rng)
        output_tokens[long] = sharegpt_draws("output", long.size, rng)
        long = long[input_tokens[long] + output_tokens[long] > SHAREGPT_MAX_TOTAL_TOKENS]
    return input_tokens, output_tokens


def _rounded(draws: np.ndarray) -> np.ndarray:
    return np.rint(np.minimum(draws, 1e12)).astype(np.int64)


def _within(side: str, tokens: np.ndarray) -> np.ndarray:
    return (tokens >= SHAREGPT_MIN_TOKENS) & (tokens <= SHAREGPT_MAX_TOKENS[side])
