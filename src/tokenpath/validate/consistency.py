"""Whether a published row is physically possible: floors under its measured mean and 99th-percentile
TTFT.

A closed loop of C concurrent requests sends its first C at once (a burst sends all of them). Each needs
its prompt prefilled before its first token, and no engine prefills faster than the chips' peak dense
FLOP/s: a prompt of p tokens takes at least 2 x (weights a token uses, less the embedding table and the
LM head, which engines run on a prompt's last token alone) x p FLOPs (attention and the rest left out,
so the floor stays below any real time). A prompt the server holds cached (validate/client_draws.py: the
client's warm-up and earlier runs sent it) needs only its last token computed. Served shortest first,
the k-th of the burst cannot have its first token before the first k prompts' FLOPs are done; the other
requests' floor is 0. The run's mean and 99th percentile (numpy's, as the clients compute it) of those
per-request floors are floors under its published mean and P99 TTFT. A row whose figure lies below its
floor was not measured as it says (the lengths, the concurrency, the statistic or the server's cache
differ from what it states); it is documented and left out of the medians with the reason
(latency.toml's [[left_out]]), never fitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.validate.latency import row_prepared, simulated_requests

# The published figures checked: each floor's statistic, and its key in a row's `also` where it is not the row's TTFT.
_ALSO_KEYS = {"mean": "ttft_mean_ms", "p99": "ttft_p99_ms"}


def ttft_floors_s(row: dict[str, Any], sharegpt: dict[str, Any]) -> dict[str, float] | None:
    """The lowest mean and 99th-percentile TTFT any engine could measure for the row, in seconds
    ({"mean", "p99"}); None where the floors do not apply (not a closed loop or a burst measured from its start)."""
    count, skip = simulated_requests(row)
    if row["arrival"] not in ("concurrency", "all_at_once") or skip or row["window"] != "whole":
        return None
    model, chip = load_model(row["model"]), load_chip(row["chip"])
    embeddings = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    flops_per_token = 2.0 * (model.params_active_per_token() - embeddings)
    chips = row.get("tp", 1) * row.get("pp", 1)
    # The fastest of the weights' precisions (an MoE's routed experts may have one of their own).
    precisions = {row["precision"], row.get("expert_precision") or row["precision"]}
    peak_flops = chips * max(chip.peak_flops[chip.compute_precision(p)] for p in precisions)
    requests = row_prepared(row, sharegpt).requests
    computed = requests.input_tokens[:count]
    if requests.prefixes is not None:
        computed = computed - requests.prefixes.warm_tokens()[:count]
    burst = np.sort(computed[:row.get("concurrency") or count]).astype(np.float64)  # all at once: every request
    floors = np.zeros(len(computed))
    floors[:len(burst)] = np.cumsum(burst * flops_per_token / peak_flops)
    return {"mean": float(floors.mean()), "p99": float(np.percentile(floors, 99))}


def published_ms(row: dict[str, Any], statistic: str) -> float | None:
    """The row's published TTFT of `statistic` ("mean" or "p99"), in ms, where it gives one."""
    return row["ttft_ms"] if row["ttft_stat"] == statistic else row.get("also", {}).get(_ALSO_KEYS[statistic])


def below_floor(row: dict[str, Any], sharegpt: dict[str, Any]) -> str | None:
    """Why the row cannot be right, or None: a published mean or P99 TTFT under its floor."""
    floors = ttft_floors_s(row, sharegpt)
    if floors is None:
        return None
    for statistic in _ALSO_KEYS:
        measured_ms = published_ms(row, statistic)
        if measured_ms is not None and measured_ms / 1e3 < floors[statistic]:
            return (f"its {statistic} TTFT of {measured_ms:.0f} ms is below the {floors[statistic] * 1e3:.0f} ms "
                    f"that the first {row.get('concurrency') or 'all'} prompts' prefill alone puts under it at the "
                    "chips' peak FLOP/s")
    return None
