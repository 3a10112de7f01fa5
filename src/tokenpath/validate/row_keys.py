"""How latency rows are told apart: by the configuration a source measured (what was served, and how
the requests were shaped) and by the load it measured it at.

`validate --calibrated` fits each configuration on its lightest load; the latency group's ranking
compares configurations that a source measured at one load point.
"""

from __future__ import annotations

import json
from typing import Any

Row = dict[str, Any]


def lengths_key(row: Row) -> tuple:
    """The lengths a row asked for: fixed lengths; a uniform draw's range (its means where it states
    none: each run's drawn means differ); ShareGPT as the client filters it."""
    kind = row["lengths"]
    if kind in ("fixed", "sglang_random"):  # the lengths asked for (a draw's means differ run by run)
        return kind, row["input_len"], row["output_len"]
    if kind == "uniform":
        return (kind, *(part for side in ("input", "output")
                        for part in (row.get(f"{side}_min"), row.get(f"{side}_max") or row[f"{side}_mean"])))
    return (kind,)


def load(row: Row) -> float | None:
    """A row's load: its Poisson rate (requests/s) or closed-loop concurrency; None for all at once."""
    return {"poisson": row.get("rate"), "concurrency": row.get("concurrency")}.get(row["arrival"])


def configuration_key(row: Row) -> tuple:
    """What a source served and how the requests were shaped: the same model on the same chips, TP,
    engine, release and settings, lengths and arrival process, at whatever load."""
    return (row["source"], row["engine"], row.get("engine_version", ""),
            json.dumps(row.get("engine_settings", {}), sort_keys=True), row["model"],
            precision_label(row), row.get("kv_cache_precision", "auto"), row["chip"], row["tp"], row.get("pp", 1),
            row.get("expert_parallel", False), row.get("moe_all_to_all", False), row.get("attention_dp", False),
            lengths_key(row), row["arrival"])


def load_point_key(row: Row) -> tuple:
    """A source's load point: the lengths, the arrival process and its rate or concurrency."""
    return row["source"], lengths_key(row), row["arrival"], load(row)


def precision_label(row: Row) -> str:
    """The row's weights' precision: "bf16", or "bf16/fp4 experts" where its routed experts have their own."""
    experts = row.get("expert_precision")
    return row["precision"] if experts is None else f"{row['precision']}/{experts} experts"


def label(row: Row) -> str:
    """A row's configuration in a few words: engine, model, precision, chips."""
    split = f"TP{row['tp']}" + (f" PP{row['pp']}" if row.get("pp", 1) > 1 else "") + (
        " EP" if row.get("expert_parallel") else "") + (" all-to-all" if row.get("moe_all_to_all") else "") + (
        " DP-attention" if row.get("attention_dp") else "")
    return f"{row['engine']} {row['model']} {precision_label(row)} {row['chip']} {split}"


def load_label(row: Row) -> str:
    if row["arrival"] == "poisson":
        return f"{row['rate']:g} req/s"
    if row["arrival"] == "concurrency":
        return f"concurrency {row['concurrency']}"
    return f"{row['num_requests']} at once"


def lengths_label(row: Row) -> str:
    if row["lengths"] == "fixed":
        return f"{row['input_len']}/{row['output_len']}"
    if row["lengths"] == "sglang_random":  # bench_serving's random draw, replayed
        return f"U(1..{row['input_len']})/U(0..{row['output_len']})"
    if row["lengths"] == "uniform":
        # The range the source states, else the one simulated: from 1 to twice the mean.
        return "/".join(f"U({row.get(f'{part}_min') or 1}..{row.get(f'{part}_max') or round(2 * row[f'{part}_mean'])})"
                        for part in ("input", "output"))
    return "ShareGPT"
