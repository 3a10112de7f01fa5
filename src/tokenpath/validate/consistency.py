"""Whether a published row is physically possible: a floor under its measured mean TTFT.

A closed loop of C concurrent requests sends its first C at once. Each needs its prompt prefilled before
its first token, and no engine prefills faster than the chips' peak dense FLOP/s: a prompt of p tokens
takes at least 2 x (weights a token uses, less the embedding table and the LM head, which engines run
on a prompt's last token alone) x p FLOPs (attention and the rest left out, so the floor stays below
any real time). Served shortest first, the k-th of them cannot have
its first token before the first k prompts' FLOPs are done, so the burst alone puts the mean TTFT over
the run's N requests at or above sum_k t_k / N. A row whose measured mean lies below that floor was not
measured as it says (the lengths, the concurrency or the statistic differ from what it states); it is
documented and left out of the medians with the reason (latency.toml's [[left_out]]), never fitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.validate.latency import row_prepared, simulated_requests


def ttft_floor_s(row: dict[str, Any], sharegpt: dict[str, Any]) -> float | None:
    """The lowest mean TTFT any engine could measure for the row, in seconds; None where the floor does
    not apply (not a closed loop measured from its start, or a median)."""
    count, skip = simulated_requests(row)
    if row["arrival"] != "concurrency" or row["ttft_stat"] != "mean" or skip or row["window"] != "whole":
        return None
    model, chip = load_model(row["model"]), load_chip(row["chip"])
    embeddings = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    flops_per_token = 2.0 * (model.params_active_per_token() - embeddings)
    chips = row.get("tp", 1) * row.get("pp", 1)
    # The fastest of the weights' precisions (an MoE's routed experts may have one of their own).
    precisions = {row["precision"], row.get("expert_precision") or row["precision"]}
    peak_flops = chips * max(chip.peak_flops[chip.compute_precision(p)] for p in precisions)
    prompts = row_prepared(row, sharegpt).requests.input_tokens[:count]
    burst = np.sort(prompts[:row["concurrency"]]).astype(np.float64)
    first_token_s = np.cumsum(burst * flops_per_token / peak_flops)
    return float(first_token_s.sum() / len(prompts))


def below_floor(row: dict[str, Any], sharegpt: dict[str, Any]) -> str | None:
    """Why the row cannot be right, or None: its measured mean TTFT under the floor."""
    floor_s = ttft_floor_s(row, sharegpt)
    if floor_s is None or row["ttft_ms"] / 1e3 >= floor_s:
        return None
    return (f"its mean TTFT of {row['ttft_ms']:.0f} ms is below the {floor_s * 1e3:.0f} ms that the first "
            f"{row['concurrency']} prompts' prefill alone takes at the chips' peak FLOP/s")
