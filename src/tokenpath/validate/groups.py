"""Predict published measurements and report the error of each prediction.

Every row becomes a scenario the way the measurement was made (fixed lengths; offline rows send every
request at t=0), with an engine-side last mile (no network, no host cost), since the published figures
are the engine's own. Constants are shared by all rows; nothing here is tuned per row. A group that fits
a constant (its `fits`, validate/fit.py's GROUP_PROCEDURES) predicts each of its rows with the value
fitted on its other rows.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import tomllib
from pydantic import TypeAdapter
from rich.console import Console
from rich.table import Table

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.compute.precision import PRECISION_BYTES
from tokenpath.config.assumptions import active_values
from tokenpath.config.errors import UserError
from tokenpath.config.units import format_bytes, format_number
from tokenpath.delivery.spec import ENGINE_SIDE_DELIVERY
from tokenpath.fabric.build import build_topology
from tokenpath.fabric.collectives import Collectives
from tokenpath.fabric.spec import FabricSpec
from tokenpath.sim.deployment import chip_fabric
from tokenpath.sim.scenario import Scenario, build_scenario
from tokenpath.sim.simulate import simulate
from tokenpath.sim.summary import output_tokens_per_s, stats_s
from tokenpath.validate.fit import GROUP_PROCEDURES, Fit, Procedure, RowErrors, fit
from tokenpath.validate.latency import GROUP as LATENCY_GROUP
from tokenpath.validate.latency import load_latency, print_latency, run_latency_group

# How each group's runs were configured, as `[engine]` settings.
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "cuda_graphs", "cuda_graph_max_tokens",
               "cuda_graph_padding", "scheduler", "eager_host")


def published_rows() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    text = (resources.files("tokenpath.catalog") / "validation" / "published.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return data["groups"], data["rows"]


def trtllm_bench_limits(row: dict[str, Any], kv_cache_fraction: float) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) that `trtllm-bench throughput` picks for a row when given
    neither: the requests of the row's shape whose KV cache fits in the memory the weights leave,
    rounded up "optimistically" (TensorRT-LLM tensorrt_llm/bench/build/tuning.py, calc_engine_setting
    and finetune_setting, pp = 1); without chunked prefill, at least one prompt plus a token for every
    other sequence (bench/benchmark/utils/general.py, get_settings)."""
    model, chip = load_model(row["model"]), load_chip(row["chip"])
    isl, osl, tp = row["input_tokens"], row["output_tokens"], row["tp"]
    weight_bytes = model.params_total() * PRECISION_BYTES[row["precision"]]
    # FP8 and NVFP4 checkpoints keep an FP8 KV cache; every rank holds at least one KV head.
    kv_bytes_per_token = 2 * model.num_layers * max(tp, model.num_kv_heads) * model.head_dim * 1.0
    cache_bytes = (chip.hbm_bytes * tp - weight_bytes) * kv_cache_fraction
    requests = min(cache_bytes / (kv_bytes_per_token * (isl + osl)), 4096)
    batch = _round_up(requests, at_least=64, steps=((256, 32), (1024, 128), (math.inf, 256)))
    tokens = _round_up(min(requests * (1 + isl / osl), 32768), at_least=2048,
                       steps=((4096, 256), (8192, 512), (math.inf, 1024)))
    return batch, max(tokens, isl + batch)


def _round_up(x: float, at_least: int, steps: tuple[tuple[float, int], ...]) -> int:
    """x rounded up to a multiple of the step of the first (below, step) tier with x < below."""
    step = next(step for below, step in steps if x < below)
    return max(at_least, step * math.ceil(x / step))


def row_scenario(row: dict[str, Any], group: dict[str, Any],
                 assumptions: Mapping[str, float] | None = None) -> Scenario:
    """The row as the scenario it was measured as; `assumptions` overrides registry values by name (SI)."""
    engine = {key: group[key] for key in ENGINE_KEYS if key in group}
    if group.get("batch_limits") == "trtllm-bench":
        fraction = group["kv_cache_free_gpu_mem_fraction"]
        engine["max_num_seqs"], engine["max_num_batched_tokens"] = trtllm_bench_limits(row, fraction)
        engine["gpu_memory_utilization"] = fraction
    num_requests = group["num_requests"]
    if isinstance(num_requests, dict):
        num_requests = num_requests[f"{row['input_tokens']}/{row['output_tokens']}"]
    table = {
        "name": f"validate {row['model']} {row['chip']} tp{row['tp']} {row['precision']} "
                f"{row['input_tokens']}/{row['output_tokens']}",
        "model": {"name": row["model"], "precision": row["precision"]},
        "deployment": {"chip": row["chip"], "chips": row["tp"], "tp": row["tp"]},
        "engine": engine,
        "workload": {
            "num_requests": num_requests,
            "input": {"kind": "fixed", "value": row["input_tokens"]},
            "output": {"kind": "fixed", "value": row["output_tokens"]},
            "arrival": {"rate": "inf"},
        },
        "delivery": ENGINE_SIDE_DELIVERY,
    }
    if assumptions:
        table["assumptions"] = dict(assumptions)
    return build_scenario(table, "validation row")


def predict_collective(row: dict[str, Any]) -> float:
    """A collective's bus bandwidth (B/s), time (s) or inter-node bandwidth (B/s) on the row's topology:
    its `fabric` table, or the scale-up domain of `ranks` of its `chip`, as a deployment builds it."""
    if "fabric" in row:
        topology = build_topology(TypeAdapter(FabricSpec).validate_python(row["fabric"]))
    else:
        chip = load_chip(row["chip"])
        topology = build_topology(chip_fabric(chip, row["ranks"])[0], chip.scaleup_bw_Bps, row["ranks"],
                                  chip.generation)
    group = [row.get("hosts") or list(range(row["ranks"]))]
    op, size = row.get("op", "all_reduce"), row["size_bytes"]
    collectives = Collectives(topology, row["algorithm"])
    metric = row.get("metric", "time" if row.get("unit") == "s" else "busbw")
    if metric == "time":
        return collectives.time_s(op, size, group)
    if metric == "busbw":
        return collectives.bus_bandwidth_Bps(op, size, group)
    # Bytes each rank sends off its node per second (all-to-all: an equal share to every other rank).
    ranks = len(group[0])
    per_node = topology.per_node
    off_node = (ranks - min(ranks, per_node)) / ranks
    return size * off_node / collectives.time_s(op, size, group)


def predict(row: dict[str, Any], group: dict[str, Any], assumptions: Mapping[str, float] | None = None) -> float:
    if group["metric"] == "collective":
        return predict_collective(row)
    run = simulate(row_scenario(row, group, assumptions), continuity=False, token_times=False).run
    if group["metric"] == "output_tokens_per_s":  # (read as the summary reads them, without the rest of it)
        return output_tokens_per_s(run)
    return stats_s(run.ttft_ns[run.completed])["mean"]


# Each group's rows' errors (their simulations) by the group, rows and active assumptions they were made for:
# the fit on every row (fit_group_constants) and the fits on all but one (_held_out) share them
# within a process.
_FITTED_ERRORS: dict[str, tuple[Procedure, RowErrors]] = {}


def _fitted_errors(group: dict[str, Any], rows: Sequence[dict[str, Any]]) -> tuple[Procedure, RowErrors]:
    """The procedure of the constant a group fits (its `fits`, validate/fit.py's GROUP_PROCEDURES) and its
    rows' errors under values of it."""
    key = json.dumps([group, list(rows), active_values()], sort_keys=True, default=str)
    if key in _FITTED_ERRORS:
        return _FITTED_ERRORS[key]
    procedure = GROUP_PROCEDURES[group["fits"]]

    def errors(row: dict[str, Any], values: Mapping[str, float]) -> dict[str, float]:
        return {procedure.metric: predict(row, group, values) / row["published"] - 1.0}
    _FITTED_ERRORS[key] = procedure, RowErrors(rows, errors, (procedure,))
    return _FITTED_ERRORS[key]


def fit_group_constants(groups_wanted: set[str] | None = None) -> dict[str, tuple[str, Fit]]:
    """Each constant a published group fits (of `groups_wanted`, None: every group), fitted on every row of
    it: {name: (group, its Fit)}."""
    groups, rows = published_rows()
    fitted = {}
    for name, group in groups.items():
        if "fits" in group and (groups_wanted is None or name in groups_wanted):
            procedure, errors = _fitted_errors(group, [row for row in rows if row["group"] == name])
            fitted[procedure.name] = name, fit(procedure, range(len(errors.rows)), {}, errors)
    return fitted


def _held_out(group: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, float], float]]:
    """For each row of a group that fits a constant, the constant fitted on the group's other rows and the
    row's prediction with it (a point of the fit's grid, simulated for the fits already). The fits' grid
    runs through the procedure's held_out_start, not the registry's value: that is the fit on every row,
    the held-out one too."""
    procedure, errors = _fitted_errors(group, rows)
    values = [{procedure.name: fit(procedure, [j for j in range(len(rows)) if j != k], {}, errors,
                                   held_out=True).value}
              for k in range(len(rows))]
    predicted = errors.get(list(enumerate(values)))
    return [(v, row["published"] * (1.0 + e[procedure.metric])) for v, row, e in zip(values, rows, predicted)]


def run_validation(groups_wanted: set[str] | None = None, latency_rows: str | None = None) -> dict[str, Any]:
    """Every row's prediction and signed error, and per group the median and worst |error| over the
    rows that did not set a constant; the latency group from the file `latency_rows` where given."""
    groups, rows = published_rows()
    unknown = sorted(set(groups_wanted or ()) - {*groups, LATENCY_GROUP})
    if unknown:
        raise UserError(f"--group: unknown {unknown[0]!r}; use one of {', '.join([*groups, LATENCY_GROUP])}")
    # A group that fits a constant: each of its rows predicted with the value fitted on the others.
    held_out: dict[int, tuple[dict[str, float], float]] = {}
    for name, group in groups.items():
        if "fits" in group and (not groups_wanted or name in groups_wanted):
            ks = [k for k, row in enumerate(rows) if row["group"] == name]
            held_out.update(zip(ks, _held_out(group, [rows[k] for k in ks])))
    results = []
    for k, row in enumerate(rows):
        if groups_wanted and row["group"] not in groups_wanted:
            continue
        predicted = held_out[k][1] if k in held_out else predict(row, groups[row["group"]])
        results.append({**row, "predicted": predicted, "error": predicted / row["published"] - 1.0,
                        **({"fitted_on_others": held_out[k][0]} if k in held_out else {})})
    summary = {}
    for name, group in groups.items():
        errors = [abs(r["error"]) for r in results if r["group"] == name and not r.get("calibration")]
        if errors:
            summary[name] = {"title": group["title"], "source": group["source"], "rows": len(errors),
                             "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
                             **({"fits": group["fits"]} if "fits" in group else {})}
    if latency_rows is not None and groups_wanted and LATENCY_GROUP not in groups_wanted:
        raise UserError("--latency-rows: replaces the latency group's rows; add --group latency, or drop --group")
    if not groups_wanted or LATENCY_GROUP in groups_wanted:
        latency = run_latency_group(None if latency_rows is None else load_latency(latency_rows))
        results += latency["rows"]
        summary[LATENCY_GROUP] = latency["summary"]
    return {"rows": results, "groups": summary}


def _describe(row: dict[str, Any]) -> tuple[str, str, str]:
    """(what, shape, precision) columns of a row."""
    if "fabric" in row:
        ranks = len(row.get("hosts") or range(row["ranks"]))
        return row["what"], f"{ranks} ranks", format_bytes(row['size_bytes'])
    if "ranks" in row:
        return f"all-reduce {row['algorithm']}", f"{row['ranks']} ranks", format_bytes(row['size_bytes'])
    shape = f"TP{row['tp']} {row['input_tokens']}/{row['output_tokens']}"
    return row["model"], shape, row["precision"]


def _value(row: dict[str, Any], value: float) -> str:
    if row.get("unit") == "s" or row.get("metric") == "time" or "ttft" in row["group"]:
        return f"{format_number(value * 1e3)} ms" if value >= 1e-3 else f"{format_number(value * 1e6)} us"
    if "ranks" in row or "fabric" in row:
        return f"{value / 1e9:,.0f} GB/s"
    return f"{value:,.0f}"


def print_validation(console: Console, result: dict[str, Any]) -> None:
    for name, group in result["groups"].items():
        if name == LATENCY_GROUP:
            print_latency(console, [r for r in result["rows"] if r["group"] == name], group)
            continue
        table = Table(title=f"{group['title']}\n{group['source']}", title_justify="left")
        for column in ("what", "chip", "shape", "precision", "published", "predicted", "error"):
            table.add_column(column, justify="left" if column in ("what", "chip", "shape", "precision") else "right",
                             no_wrap=column != "what")
        for r in (r for r in result["rows"] if r["group"] == name):
            what, shape, precision = _describe(r)
            what += " (calibration)" if r.get("calibration") else ""
            table.add_row(what, r.get("chip") or r["fabric"]["kind"], shape, precision, _value(r, r["published"]),
                          _value(r, r["predicted"]), f"{r['error']:+.1%}")
        console.print(table)
        held_out = (f"; each row predicted with {group['fits']} fitted on the group's other rows"
                    if "fits" in group else "")
        console.print(f"median |error| {group['median_abs_error']:.1%}, worst {group['worst_abs_error']:.1%} "
                      f"over {group['rows']} rows{held_out}\n")
