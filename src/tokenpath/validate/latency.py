"""The latency validation group: published TTFT and TPOT / ITL under load, each row simulated the way
it was measured (catalog/validation/latency.toml says how each source measured).

A row becomes a scenario with the source's model, chip, tensor parallelism, precision, lengths,
arrival process and engine settings, and the last mile its client took (`row_delivery`: the server's
front end, at the network the row states). The prediction is the same statistic (mean or median) of
the same metric over the same requests: TTFT includes queueing; "tpot" is (E2E - TTFT) / (tokens - 1)
per request; "itl" is every gap between streamed tokens. The row's `engine` picks the scheduler profile
(ENGINE_PROFILES, from engine/profiles.py's `measured_as`), and the row's `engine_settings` go over it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config.errors import UserError
from tokenpath.config.units import format_duration
from tokenpath.delivery.spec import ENGINE_SIDE_DELIVERY
from tokenpath.engine.profiles import MEASURED_ENGINES
from tokenpath.prefixes import cached_prompts
from tokenpath.sim.run import Run, itl_per_token_ns
from tokenpath.sim.scenario import Scenario, build_scenario
from tokenpath.sim.simulate import Prepared, prepare, simulate
from tokenpath.sim.summary import output_tokens_per_s, tpot_ns
from tokenpath.validate.client_draws import sglang_cached_prompts, sglang_random_lengths
from tokenpath.validate.latency_rows import read_latency_rows
from tokenpath.validate.ranking import print_ranking, ranking
from tokenpath.validate.row_keys import label, lengths_label, load_label, precision_label

GROUP = "latency"
TITLE = "Latency under load: TTFT and TPOT / ITL at a stated request rate or concurrency"

# The most requests a row simulates: enough for stable medians, and the whole group stays within
# seconds (a source's run of 2400 or 3200 requests is cut to its first 2000).
MAX_SIMULATED_REQUESTS = 2000
# One request at a time has no start-up transient, so a source's short run (10 requests) is simulated
# longer only to average out the sampled lengths.
CONCURRENCY_ONE_REQUESTS = 100
# Steady-state rows (one continuous run): a row's `requests_per_slot` requests per concurrent slot
# (this many where the source does not state its request count), the first WARMUP_PER_SLOT per slot
# skipped (every slot has turned over twice by then). Profiling-phase rows (a client that drains its
# warm-up phase before it starts measuring, as AIPerf does) simulate the measured requests alone:
# `requests_per_slot` per slot, none skipped, starting from a burst of `concurrency` requests.
STEADY_REQUESTS_PER_SLOT = 10
STEADY_MIN_REQUESTS = 100
WARMUP_PER_SLOT = 2
# ShareGPT lengths as a lognormal with the published mean and this coefficient of variation. No
# published median or standard deviation of the filtered set was found; this is an assumption, to be
# replaced by the built-in `sharegpt` distribution (one function, `sharegpt_lengths`, maps the rows).
SHAREGPT_ASSUMED_CV = 1.0
# Bench "random" datasets draw lengths uniformly from 1 up to the requested length: tokenpath's
# uniform kind with this range ratio spans [1, 2 x mean] around the mean the run drew.
UNIFORM_FULL_RANGE_RATIO = 0.998
_STAT_KEY = {"mean": "mean", "median": "p50"}
# The key of a row's `also` that states its output tokens per second over the measured requests.
THROUGHPUT_KEY = "throughput_tokens_per_s"
# Each engine's scheduler profile (engine/profiles.py); a row's engine_settings can refine it (vLLM V0).
ENGINE_PROFILES = {engine: {"scheduler": profile} for engine, profile in MEASURED_ENGINES.items()}


def load_latency(path: str | Path | None = None) -> dict[str, Any]:
    """The latency data: `sharegpt` statistics, `sources` and `rows` (the catalog's file by default),
    every row checked (latency_rows.py)."""
    return read_latency_rows(path)


def sharegpt_lengths(row: dict[str, Any], sharegpt: dict[str, Any]) -> tuple[dict, dict]:
    """(input, output) length tables for a ShareGPT row: lognormals with the run's published means,
    clipped as the benchmark clients filter the set."""
    cv = SHAREGPT_ASSUMED_CV
    low = sharegpt["min_tokens"]
    prompt = {"kind": "lognormal", "mean": row["input_mean"], "sd": cv * row["input_mean"],
              "min": low, "max": sharegpt["clip_input_max"]}
    completion = {"kind": "lognormal", "mean": row["output_mean"], "sd": cv * row["output_mean"],
                  "min": low, "max": sharegpt["clip_total_max"] - low}
    return prompt, completion


def row_lengths(row: dict[str, Any], sharegpt: dict[str, Any]) -> tuple[dict, dict]:
    kind = row["lengths"]
    if kind == "fixed":
        return {"kind": "fixed", "value": row["input_len"]}, {"kind": "fixed", "value": row["output_len"]}
    if kind == "uniform":
        return tuple({"kind": "uniform", "mean": row[f"{part}_mean"], "range_ratio": _range_ratio(row, part)}
                     for part in ("input", "output"))
    if kind == "sglang_random":  # the scenario's spread; row_prepared puts in the lengths the client drew
        return tuple({"kind": "uniform", "mean": row[f"{part}_mean"], "range_ratio": UNIFORM_FULL_RANGE_RATIO}
                     for part in ("input", "output"))
    if kind == "sharegpt":
        return sharegpt_lengths(row, sharegpt)
    raise ValueError(f"latency row from {row['source']}: unknown lengths {kind!r}")


def _range_ratio(row: dict[str, Any], part: str) -> float:
    """A uniform row's spread around its mean: from `{part}_min` to `{part}_max` where the source draws
    from a range (SGLang's --random-range-ratio), else from 1 to twice the mean."""
    low = row.get(f"{part}_min")
    if low is None:
        return UNIFORM_FULL_RANGE_RATIO
    high = row[f"{part}_max"]
    return (high - low) / (high + low)


def simulated_requests(row: dict[str, Any]) -> tuple[int, int]:
    """(requests to simulate, requests to skip as warm-up) for a row.

    A row's `window` says how its source measured: "whole" (every request of one run), "steady" (one
    continuous run after its first requests) or "profiling_phase" (AIPerf: the warm-up phase's requests
    all complete before the measured phase sends its first `concurrency` at once, so the measured
    phase is a run of its own; the warm-up leaves nothing behind that a synthetic prompt reuses)."""
    concurrency = row.get("concurrency")
    window = row["window"]
    per_slot = row.get("requests_per_slot", STEADY_REQUESTS_PER_SLOT)
    if window == "profiling_phase":
        return per_slot * concurrency, 0
    if window == "steady":
        return max(per_slot * concurrency, STEADY_MIN_REQUESTS), WARMUP_PER_SLOT * concurrency
    if window != "whole":
        raise ValueError(f"latency row from {row['source']}: unknown window {window!r}")
    count = min(row["num_requests"], MAX_SIMULATED_REQUESTS)
    if concurrency == 1 and row.get("lengths") != "sglang_random":  # replayed lengths: the run's own requests
        count = max(count, CONCURRENCY_ONE_REQUESTS)
    return count, 0


def row_engine(row: dict[str, Any]) -> dict[str, Any]:
    """The row's [engine] table: its engine's scheduler profile and its `engine_version` as the release
    simulated (engine/release.py reads what it can of the text; where it begins with no release number,
    the newest), its `engine_settings` over them."""
    release = {"version": row["engine_version"]} if row.get("engine_version") else {}
    return {**ENGINE_PROFILES[row["engine"]], **release, **row.get("engine_settings", {})}


def locked_loop(row: dict[str, Any]) -> bool:
    """A closed loop of fixed lengths: its requests, sent together, finish together, so the simulated
    loop locks into rounds whose TTFTs turn on sub-millisecond offsets between a request's return and
    the engine's next step (docs/validation.md, "The front end in the rows")."""
    return row["lengths"] == "fixed" and row["arrival"] == "concurrency"


def through_front_end(row: dict[str, Any]) -> bool:
    """Whether the row runs through the server's front end: every row but one measured at the engine
    and a locked loop (`row_delivery` says why)."""
    return row.get("endpoint", "completions") != "engine" and not locked_loop(row)


def row_delivery(row: dict[str, Any]) -> dict[str, Any]:
    """The row's `[delivery]` table: its client's path through the server's front end (HTTP, tokenizing,
    the hops to the engine's process and back, each token detokenized and framed: every front-end cost at
    the registry's, the chat template's rendering only on a chat endpoint) at the row's round trip, the
    bytes left out (loopback or a data-centre link carries them in microseconds). A row measured at the
    engine, and a locked loop (`locked_loop`), run with no front end and no network: in a locked loop the
    front end's millisecond, as a round trip's, moves each request from joining the next step to waiting
    one out, a shift the measured runs show only in part (docs/validation.md)."""
    endpoint = row.get("endpoint", "completions")
    if not through_front_end(row):
        return dict(ENGINE_SIDE_DELIVERY)
    delivery: dict[str, Any] = {"network_rtt": row.get("network_rtt_ms", 0.0) / 1e3, "event_overhead_bytes": 0,
                                "bytes_per_token": 0.0, "request_overhead_bytes": 0}
    if endpoint != "chat":
        delivery["chat_template_per_request"] = 0.0
    return delivery


def row_scenario(row: dict[str, Any], sharegpt: dict[str, Any],
                 assumptions: Mapping[str, float] | None = None) -> Scenario:
    """The row as the scenario it was measured as; `assumptions` overrides registry values by name (SI)."""
    prompt, completion = row_lengths(row, sharegpt)
    count, _ = simulated_requests(row)
    workload: dict[str, Any] = {"num_requests": count, "input": prompt, "output": completion,
                                "chat_template_tokens": row.get("chat_template_tokens", 0)}
    if row.get("draft_acceptance") is not None:
        workload["draft_acceptance"] = row["draft_acceptance"]
    if row["arrival"] == "poisson":
        workload["arrival"] = {"rate": row["rate"]}
    elif row["arrival"] == "concurrency":
        workload["arrival"] = {"rate": "inf"}
        workload["max_concurrency"] = row["concurrency"]
    elif row["arrival"] == "all_at_once":
        workload["arrival"] = {"rate": "inf"}
    else:
        raise ValueError(f"latency row from {row['source']}: unknown arrival {row['arrival']!r}")
    table = {
        "name": f"latency {row['source']} {row['engine']} {row['model']} {row['chip']} tp{row['tp']}",
        "seed": 0,
        "model": {"name": row["model"], "precision": row["precision"],
                  "kv_cache_precision": row.get("kv_cache_precision", "auto"),
                  **({"expert_precision": row["expert_precision"]} if row.get("expert_precision") else {})},
        "deployment": {"chip": row["chip"], "chips": row["tp"] * row.get("pp", 1), "tp": row["tp"],
                       "pp": row.get("pp", 1), "expert_parallel": row.get("expert_parallel", False),
                       "moe_all_to_all": row.get("moe_all_to_all", False),
                       "attention_dp": row.get("attention_dp", False)},
        "engine": row_engine(row),
        "workload": workload,
        "delivery": row_delivery(row),
    }
    if assumptions:
        table["assumptions"] = dict(assumptions)
    return build_scenario(table, "its scenario")


def row_prepared(row: dict[str, Any], sharegpt: dict[str, Any],
                 assumptions: Mapping[str, float] | None = None) -> Prepared:
    """The row's scenario with its requests drawn, ready to simulate: where the row's client draw is
    replayed (lengths = "sglang_random", validate/client_draws.py), each request has the lengths the
    client sent it, in order, and the server holds the prompts its warm-up and earlier runs sent; a row
    that drew its lengths and states `cached_prompts` finds every prompt held."""
    prepared = prepare(row_scenario(row, sharegpt, assumptions))
    count = len(prepared.requests)
    if row["lengths"] != "sglang_random":
        if not row.get("cached_prompts"):
            return prepared
        held = cached_prompts(prepared.requests.input_tokens, np.ones(count, bool))  # every prompt (LatencyRow)
        return replace(prepared, requests=replace(prepared.requests, prefixes=held))
    prompts, outputs = sglang_random_lengths(row)
    prompts = prompts[:count] + row.get("chat_template_tokens", 0)  # the server's template, as the workload adds it
    requests = replace(prepared.requests, input_tokens=prompts, output_tokens=outputs[:count],
                       prefixes=cached_prompts(prompts, np.arange(count) < sglang_cached_prompts(row)))
    return replace(prepared, requests=requests)


# A row whose client is SGLang's benchmark (its `client` names it) counts ITL per token (measured).
SGLANG_BENCH_CLIENT = "bench_serving"


def counts_itl_per_token(row: dict[str, Any]) -> bool:
    """Whether the row's client counted ITL per token: SGLang's bench_serving against SGLang, its native
    backend spreading an event's gap over the tokens it carries; against vLLM (`--backend vllm`, the
    OpenAI completions client) it times one gap an event, as vLLM's own client does."""
    return SGLANG_BENCH_CLIENT in row.get("client", "") and row["engine"] == "sglang"


def measured(run: Run, skip: int, itl_per_token: bool = False) -> dict[str, np.ndarray]:
    """Per-request TTFT and TPOT, and every ITL gap where the run kept its token times, in seconds, of
    the requests after the first `skip` (requests are numbered in the order they were sent);
    `itl_per_token`: ITL as SGLang's bench_serving counts it, a multi-token event's gap spread over its
    tokens (sim/run.py, itl_per_token_ns)."""
    run = run.after(skip)
    values = {"ttft": run.ttft_ns[run.completed] / 1e9, "tpot": tpot_ns(run) / 1e9}
    if run.token_client_ns is not None:
        values["itl"] = (itl_per_token_ns(run) if itl_per_token else run.itl_ns()) / 1e9
    return values


def _statistic(values: np.ndarray, stat: str) -> float:
    return float(np.mean(values)) if _STAT_KEY[stat] == "mean" else float(np.median(values))


def predict_row(row: dict[str, Any], sharegpt: dict[str, Any],
                assumptions: Mapping[str, float] | None = None) -> dict[str, float]:
    """The row's TTFT and decode metric (seconds), predicted with the row's statistic, and its output
    tokens per second over the measured requests' window (under `assumptions`, registry values
    overridden by name, where given)."""
    return run_prediction(row, simulate(row_prepared(row, sharegpt, assumptions), continuity=False,
                                        token_times=row["decode_metric"] == "itl").run)


def run_prediction(row: dict[str, Any], run: Run) -> dict[str, float]:
    """predict_row's figures from the row's simulated run."""
    _, skip = simulated_requests(row)
    values = measured(run, skip, itl_per_token=counts_itl_per_token(row))
    if row["decode_metric"] not in values:
        raise UserError("its ITL needs every token's time, which a run this large does not keep; give the row "
                        "fewer requests or state its TPOT (decode_metric = \"tpot\")")
    return {"ttft_s": _statistic(values["ttft"], row["ttft_stat"]),
            "decode_s": _statistic(values[row["decode_metric"]], row["decode_stat"]),
            "output_tokens_per_s": output_tokens_per_s(run.after(skip))}


def row_error(k: int, row: dict[str, Any], error: UserError) -> UserError:
    """A row's error, naming the row."""
    return UserError(f"latency rows[{k}] ({row['source']}): {error}")


def relative_errors(row: dict[str, Any], predicted: dict[str, float]) -> dict[str, float]:
    """Signed relative errors of a prediction (predict_row's) against the row's published TTFT and decode
    metric: {"ttft": predicted / published - 1, "decode": ...}, and "throughput" where the row's `also`
    states its output tokens per second (`throughput_tokens_per_s`) and the prediction has one (a
    calibration's fit predicts the two latencies only)."""
    errors = {"ttft": predicted["ttft_s"] * 1e3 / row["ttft_ms"] - 1.0,
              "decode": predicted["decode_s"] * 1e3 / row["decode_ms"] - 1.0}
    published = row.get("also", {}).get(THROUGHPUT_KEY)
    if published and "output_tokens_per_s" in predicted:
        errors["throughput"] = predicted["output_tokens_per_s"] / published - 1.0
    return errors


def run_latency_group(data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every row's predictions and signed errors, and the medians of |error| for TTFT and for the
    decode metric over the rows that set no constant."""
    data = load_latency() if data is None else data
    rows = []
    for k, row in enumerate(data["rows"]):
        try:
            predicted = predict_row(row, data["sharegpt"])
        except UserError as error:
            raise row_error(k, row, error) from None
        errors = relative_errors(row, predicted)
        rows.append({**row, "group": GROUP, "front_end": through_front_end(row),
                     "predicted_ttft_ms": predicted["ttft_s"] * 1e3,
                     "predicted_decode_ms": predicted["decode_s"] * 1e3,
                     "ttft_error": errors["ttft"], "decode_error": errors["decode"]})
    scored = [r for r in rows if not r.get("calibration")]
    ttft = [abs(r["ttft_error"]) for r in scored]
    decode = [abs(r["decode_error"]) for r in scored]
    summary = {
        "title": TITLE,
        "source": ", ".join(sorted({r["source"] for r in rows})),
        "rows": len(scored),
        "calibration_rows": len(rows) - len(scored),
        "median_abs_error_ttft": statistics.median(ttft) if ttft else math.nan,
        "median_abs_error_decode": statistics.median(decode) if decode else math.nan,
        "worst_abs_error_ttft": max(ttft, default=math.nan),
        "worst_abs_error_decode": max(decode, default=math.nan),
    }
    # The group's headline: the worse of its two medians.
    summary["median_abs_error"] = max(summary["median_abs_error_ttft"], summary["median_abs_error_decode"])
    summary["worst_abs_error"] = max(summary["worst_abs_error_ttft"], summary["worst_abs_error_decode"])
    summary["ranking"] = ranking(rows)
    summary["left_out"] = [{"source": row["source"], "row": f"{label(row)}, {lengths_label(row)}, {load_label(row)}",
                            "reason": row["reason"]} for row in data.get("left_out", [])]
    return {"rows": rows, "summary": summary}


def _ms(value_ms: float) -> str:
    return format_duration(value_ms / 1e3)


def print_latency(console: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{summary['title']}\n{summary['source']}", title_justify="left")
    for column in ("source, engine", "model, chips", "workload", "TTFT", "predicted", "error",
                   "TPOT / ITL", "predicted", "error"):
        wrap = column in ("source, engine", "model, chips", "workload")
        table.add_column(column, justify="left" if wrap else "right", no_wrap=not wrap)
    for r in rows:
        table.add_row(
            f"{r['source']} {r['engine']}" + (" (calibration)" if r.get("calibration") else ""),
            f"{r['model']} {precision_label(r)} {r['chip']} TP{r['tp']}",
            f"{lengths_label(r)}, {load_label(r)}",
            f"{r['ttft_stat']} {_ms(r['ttft_ms'])}", _ms(r["predicted_ttft_ms"]), f"{r['ttft_error']:+.1%}",
            f"{r['decode_metric']} {r['decode_stat']} {_ms(r['decode_ms'])}", _ms(r["predicted_decode_ms"]),
            f"{r['decode_error']:+.1%}")
    console.print(table)
    console.print(f"median |error| TTFT {summary['median_abs_error_ttft']:.1%}, TPOT/ITL "
                  f"{summary['median_abs_error_decode']:.1%}; worst TTFT {summary['worst_abs_error_ttft']:.1%}, "
                  f"TPOT/ITL {summary['worst_abs_error_decode']:.1%} over {summary['rows']} rows "
                  f"({summary['calibration_rows']} calibration rows left out)")
    at_engine = sum(not r["front_end"] for r in rows)
    if at_engine:
        console.print(f"{at_engine} of the {len(rows)} rows run without the server's front end or a network: "
                      "measured at the engine, or closed loops of fixed lengths, whose simulated rounds lock in "
                      "step (docs/validation.md, \"The front end in the rows\")", highlight=False)
    console.print()
    for row in summary.get("left_out", []):
        console.print(f"left out, not predicted: {row['source']}, {row['row']}: {row['reason']}\n", highlight=False)
    print_ranking(console, summary["ranking"])
