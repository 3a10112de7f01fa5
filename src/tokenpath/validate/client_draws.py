"""The prompt and output lengths a benchmark client drew, request by request, where its draw can be
replayed exactly: SGLang's `bench_serving --dataset-name random` (a latency row's `lengths =
"sglang_random"`).

bench_serving seeds numpy's global generator with its `--seed` (default 1) and its random dataset
draws every prompt length, then every output length, from it, in the order it sends the requests
(python/sglang/bench_serving.py, `sample_random_requests`: `np.random.randint(max(int(input_len *
range_ratio), 1), input_len + 1, size=num_prompts)`, then `np.random.randint(int(output_len *
range_ratio), output_len + 1, size=num_prompts)`; `--random-range-ratio` defaulted to 0 in the releases
the rows name). A run's published token totals then follow from its flags alone, and each row's
published means are checked against the draw: a row that does not match is refused, naming the row.

The draw also names the prompts: request i's prompt is the i-th conversation of ShareGPT, shuffled with
the same seed, cut or repeated to its length (`sample_random_requests`), so two runs with the same
--random-input-len send the same prompts, in the same order. bench_serving first sends the run's first
prompt as its warm-up (calibrate/formats.py's CLIENT_WARMUP_PROMPTS) and flushes the server's cache only
under --flush-cache, so a run finds its first prompt cached, and the first prompts of the runs the same
server served before it (a row's `cached_prompts`, from the page's run order): SGLang's radix cache keeps
them until it needs the room.

Some servers report one more generated token per request than asked (the row's published output mean is
then the draw's plus exactly 1: its end-of-sequence token counted); the simulated outputs are the
published ones, the draw's plus that whole number. A draw of 0 output tokens (possible with a range
ratio of 0) is simulated as 1, the least a request can generate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpath.calibrate.formats import CLIENT_WARMUP_PROMPTS
from tokenpath.config.errors import UserError

# bench_serving's --seed default (python/sglang/bench_serving.py: parser.add_argument("--seed", type=int, default=1)).
SGLANG_BENCH_SEED = 1
# --random-range-ratio as the rows' releases default it (0.0: lengths from 1, outputs from 0, to the length asked).
SGLANG_RANGE_RATIO = 0.0
# How far a published mean may lie from the draw's and still be it: the sources print means to 1e-3 or finer.
MEAN_TOLERANCE = 1e-3


def sglang_random_lengths(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, output tokens) of each of the row's `num_requests` requests, in the order sent."""
    count, prompt_len, output_len = row["num_requests"], row["input_len"], row["output_len"]
    draw = np.random.RandomState(SGLANG_BENCH_SEED)
    prompts = draw.randint(max(int(prompt_len * SGLANG_RANGE_RATIO), 1), prompt_len + 1, size=count)
    outputs = draw.randint(int(output_len * SGLANG_RANGE_RATIO), output_len + 1, size=count)
    label = f"latency row from {row['source']} ({row.get('id') or 'no id'})"
    if abs(prompts.mean() - row["input_mean"]) > MEAN_TOLERANCE:
        raise UserError(f"{label}: input_mean {row['input_mean']:g} is not bench_serving's seed-{SGLANG_BENCH_SEED} "
                        f"draw of {count} prompts up to {prompt_len} tokens ({prompts.mean():g}); give the run's "
                        "lengths as lengths = \"uniform\"")
    extra = row["output_mean"] - outputs.mean()
    if abs(extra - round(extra)) > MEAN_TOLERANCE or round(extra) < 0:
        raise UserError(f"{label}: output_mean {row['output_mean']:g} is not bench_serving's seed-{SGLANG_BENCH_SEED} "
                        f"draw of {count} outputs up to {output_len} tokens ({outputs.mean():g}) plus a whole number "
                        "of tokens per request; give the run's lengths as lengths = \"uniform\"")
    return prompts.astype(np.int64), np.maximum(outputs + round(extra), 1).astype(np.int64)


def sglang_cached_prompts(row: dict[str, Any]) -> int:
    """How many of the row's first prompts the server holds cached when its run begins: those of the runs
    it served before (the row's `cached_prompts`), and at least the warm-up's."""
    return max(row.get("cached_prompts") or 0, CLIENT_WARMUP_PROMPTS)
