"""tokenpath against NVIDIA AISimulate on the latency rows: each row's requests simulated by both, each
tool's signed TTFT and TPOT / ITL error against the published figure, and each tool's CPU time.

Usage:
  python3 -m venv /tmp/aisim-venv
  /tmp/aisim-venv/bin/pip install --pre --only-binary=:all: aisimulate   # not a tokenpath dependency
  python benchmarks/vs_aisimulate.py [--aisimulate /tmp/aisim-venv/bin/aisimulate] [--rows N] [--repeats 1]
                                     [--no-host-loop] [--held-out N [--seed S]] [--json PATH]

AISimulate lives in a virtual environment of its own (its wheel pins jax, flax and more); the script
runs its `aisimulate predict` as a subprocess and reads its report. Its sdist build wants nvidia-smi:
install the wheel.

What runs, for each row of catalog/validation/latency.toml that AISimulate can express (the others are
listed with the reason; --rows N stops after N rows both ran), or with --held-out N for N of
AIConfigurator's measured runs that the project does not ship (benchmarks/aiconfigurator_silicon.py's
draw and rows; aiconfigurator-core installed beside tokenpath). Those runs are unseen by tokenpath, not
necessarily by AISimulate: they ship with the AIConfigurator package whose kernel tables AISimulate runs
on.
- tokenpath: `predict_row`, as `tokenpath validate --group latency` predicts the row.
- AISimulate: the same requests, `row_prepared(row, sharegpt).requests` (the row's lengths, in the
  order sent, with the client's own draw where validate replays it), written as a Mooncake trace
  (tokenpath's `write_trace`: arrival times to the millisecond, fresh hash ids, so no request shares a
  prefix), run with `aisimulate predict --capture-per-request`: open-loop rows (Poisson, all at once) at
  the trace's timestamps, closed-loop rows with `traffic.load = {type: concurrency}` at the row's
  concurrency (it sends the trace's requests in order, one as another completes).
- Both are scored the way validate scores a row: the row's statistic (mean or median) of TTFT and of
  its decode metric over the requests after the row's warm-up (`simulated_requests`). TPOT is
  (E2E - TTFT) / (tokens - 1) per request of more than one token, from AISimulate's per-request
  records. ITL is every gap between tokens, which AISimulate reports only over the whole run: its
  summary's `mean_itl_ms` / `median_itl_ms` (every row with an ITL figure measures the whole run).

How a row becomes an AISimulate deployment:
- model: the shipped config of the same architecture (AISIM_MODELS; Llama 3.3 70B is Llama 3.1 70B's
  architecture). Precision: bf16 checkpoints as shipped; Llama fp8 with `gemm_quant_mode: fp8`, as
  AISimulate's own `silicon_sample.csv` states those runs; DeepSeek-V3 (fp8 blocks) and gpt-oss
  (MXFP4 experts) as their checkpoints are.
- chip: AISIM_CHIPS. No MI300X and no 40 GB A100 (its bandwidth and memory are not the 80 GB part's).
- engine: vllm, sglang, trtllm, each at AISimulate's current kernel-data version for that chip (the
  row's own version is printed beside it; AISimulate serves only its listed versions).
- layout: one replica, `tensor` = the row's TP; MoE models with their experts split over the same
  ranks (`moe_tensor` = TP), as tokenpath's rows shard them.
- KV cache: the precision the row's engine used (`kv_cache_precision`, else the engine's default as
  tokenpath resolves it: TensorRT-LLM quantizes it to fp8 with fp8 or fp4 weights, vLLM and SGLang keep
  bf16), as `kvcache_quant_mode`; AISimulate's own default for a Llama with fp8 GEMMs is bf16. Where
  AISimulate has no kernel table at that precision (DeepSeek's MLA on B200 with a bf16 cache) the row
  runs at AISimulate's own choice, noted with the row.
- launch settings: max_num_seqs, max_num_batched_tokens, chunked_prefill and gpu_memory_utilization
  carry over (CARRIED); SGLang's overlap scheduler is AISimulate's `host_loop`, on unless the row
  turned it off (--no-host-loop leaves AISimulate's default, off). Settings AISimulate has no field
  for (vLLM V0's scheduler and multi-step windows, CUDA-graph limits, mixed chunks) are listed per row
  as not carried; AISimulate then uses its own behaviour for them.

CPU time: user + system. AISimulate's is its `aisimulate predict` process and children (getrusage of
the children): start-up, loading its kernel tables and the run. tokenpath's is this process's while
`predict_row` runs (the package is imported once, before). Also printed: AISimulate's own reported
simulation time (`wall_time_ms`) and the CPU of one `aisimulate predict` of a single request (its
floor per process). With --repeats R each tool runs each row R times; the medians are kept.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath import __version__ as TOKENPATH_VERSION
from tokenpath.compute.model import load_model
from tokenpath.validate.latency import (
    load_latency,
    predict_row,
    relative_errors,
    row_prepared,
    simulated_requests,
)
from tokenpath.validate.row_keys import label, lengths_label, load_label, precision_label
from tokenpath.workload.traces import write_trace

# (tokenpath model, precision) -> (AISimulate model id, engine keys that set its precision)
AISIM_MODELS = {
    ("llama-3.1-8b", "bf16"): ("meta-llama/Meta-Llama-3.1-8B", {}),
    ("llama-3.1-8b", "fp8"): ("meta-llama/Meta-Llama-3.1-8B", {"gemm_quant_mode": "fp8"}),
    ("llama-3.1-70b", "bf16"): ("meta-llama/Meta-Llama-3.1-70B", {}),
    ("llama-3.3-70b", "bf16"): ("meta-llama/Meta-Llama-3.1-70B", {}),
    ("llama-3.1-70b", "fp8"): ("meta-llama/Meta-Llama-3.1-70B", {"gemm_quant_mode": "fp8"}),
    ("llama-3.3-70b", "fp8"): ("meta-llama/Meta-Llama-3.1-70B", {"gemm_quant_mode": "fp8"}),
    ("deepseek-v3", "fp8"): ("deepseek-ai/DeepSeek-V3", {}),
    ("qwen3-235b-a22b", "bf16"): ("Qwen/Qwen3-235B-A22B", {}),
    ("gpt-oss-120b", "bf16/fp4 experts"): ("openai/gpt-oss-120b", {}),
}
AISIM_CHIPS = {"a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
AISIM_BACKENDS = ("vllm", "sglang", "trtllm")
AISIM_KV = {"bf16": "bfloat16", "fp8": "fp8"}
# The row's engine_settings AISimulate has a field for: key -> (where, its name)
CARRIED = {
    "max_num_seqs": ("scheduler", "max_sequences"),
    "max_num_batched_tokens": ("scheduler", "max_batched_tokens"),
    "chunked_prefill": ("engine", "enable_chunked_prefill"),
    "gpu_memory_utilization": ("kv_cache", "memory_fraction"),
}
MOONCAKE_BLOCK_TOKENS = 512  # the hash-id block write_trace writes


def why_not(row: dict[str, Any]) -> str | None:
    """Why AISimulate cannot express the row, or None where it can."""
    if row["chip"] not in AISIM_CHIPS:
        return f"no {row['chip']} in AISimulate's systems"
    if (row["model"], precision_label(row)) not in AISIM_MODELS:
        return f"no {row['model']} {precision_label(row)} among AISimulate's model configs"
    if row.get("pp", 1) > 1 or row.get("expert_parallel") or row.get("attention_dp"):
        return "the export carries one tensor-parallel replica, not pipeline, expert or attention data parallelism"
    if "speculative" in row.get("engine_settings", {}):
        return "the export does not carry speculative decoding"
    if row["engine"] not in AISIM_BACKENDS:
        return f"no {row['engine']} backend"
    _, skip = simulated_requests(row)
    if row["decode_metric"] == "itl" and skip:
        return "ITL after a warm-up: AISimulate reports every gap only over the whole run"
    return None


def aisim_config(row: dict[str, Any], trace: Path, kv_precision: str, host_loop: bool) -> tuple[dict, list[str]]:
    """The `aisimulate predict` config of the row (its KV cache at `kv_precision`, bf16 or fp8), and the
    row's settings it does not carry."""
    model, precision_keys = AISIM_MODELS[(row["model"], precision_label(row))]
    settings = dict(row.get("engine_settings", {}))
    worker: dict[str, Any] = {"parallelism": {"replicas": 1, "tensor": row["tp"]}}
    if load_model(row["model"]).num_experts:
        worker["parallelism"]["moe_tensor"] = row["tp"]
    engine: dict[str, Any] = {"mode": "aggregated", "model": model, "hardware": AISIM_CHIPS[row["chip"]],
                              "backend": row["engine"], **precision_keys, "kvcache_quant_mode": AISIM_KV[kv_precision],
                              "workers": {"aggregated": worker}}
    for key, (where, name) in CARRIED.items():
        if key not in settings:
            continue
        value = settings.pop(key)
        if where == "engine":
            engine[name] = value
        elif where == "kv_cache":
            worker["kv_cache"] = {"capacity": {"memory_fraction": value}}
        else:
            worker.setdefault(where, {})[name] = value
    if row["engine"] == "sglang":
        overlap = settings.pop("host_overlap", True)
        worker["host_loop"] = bool(overlap and host_loop)
    elif settings.get("host_overlap") is False:  # AISimulate models no overlap for the other engines
        settings.pop("host_overlap")
    if settings.get("eager_host") is False:  # AISimulate's kernel tables carry no host time per kernel
        settings.pop("eager_host")
    if row["arrival"] == "concurrency":
        load = {"type": "concurrency", "concurrency": row["concurrency"]}
    else:  # poisson or all at once: the trace's own times
        load = {"type": "trace_timestamps"}
    traffic = {"source": {"type": "trace", "paths": [str(trace)], "format": "mooncake",
                          "block_size": MOONCAKE_BLOCK_TOKENS}, "load": load}
    return {"traffic": traffic, "engine": engine}, [f"{k}={v}" for k, v in settings.items()]


class MissingData(RuntimeError):
    """AISimulate has no measured kernel table for a shape the row needs."""


def cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def run_aisimulate(exe: str, config: dict, folder: Path) -> tuple[float, dict]:
    """(CPU s of the process and its children, its prediction.json) of `aisimulate predict`."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "config.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([exe, "predict", "-c", str(path), "--output-dir", str(folder / "out"), "--overwrite",
                           "--capture-per-request", "--format", "json"], capture_output=True, text=True)
    cpu = cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - cpu_s(before)
    if done.returncode != 0:
        error = MissingData if "missing performance data" in done.stderr else RuntimeError
        raise error(f"aisimulate predict failed ({done.returncode}): {done.stderr[-2000:]}")
    return cpu, json.loads((folder / "out" / "prediction.json").read_text())


def aisim_predicted(row: dict[str, Any], report: dict, requests: Any) -> dict[str, float]:
    """The row's TTFT and decode metric (seconds) from AISimulate's report, with the row's statistic over
    the requests after the row's warm-up, in the order sent (its records are numbered request_1, ...)."""
    records = sorted(report["per_request"], key=lambda r: int(r["session_id"].rsplit("_", 1)[1]))
    inputs = [r["input_length"] for r in records]
    outputs = [r["requested_output_length"] for r in records]
    if inputs != requests.input_tokens.tolist() or outputs != requests.output_tokens.tolist():
        raise RuntimeError("AISimulate's records are not the trace's requests in order")
    _, skip = simulated_requests(row)
    kept = [r for r in records[skip:] if r["terminal_status"] == "completed"]
    ttft_ms = np.array([r["ttft_ms"] for r in kept])
    tpot_ms = np.array([(r["e2e_latency_ms"] - r["ttft_ms"]) / (r["output_length"] - 1)
                        for r in kept if r["output_length"] > 1])
    stat = np.mean if row["ttft_stat"] == "mean" else np.median
    decode_stat = np.mean if row["decode_stat"] == "mean" else np.median
    if row["decode_metric"] == "itl":  # every gap of the whole run (why_not refuses a warm-up)
        decode_ms = report[f"{row['decode_stat']}_itl_ms"]
    else:
        decode_ms = float(decode_stat(tpot_ms))
    return {"ttft_s": float(stat(ttft_ms)) / 1e3, "decode_s": decode_ms / 1e3}


def run_tokenpath(row: dict[str, Any], sharegpt: dict) -> tuple[float, dict[str, float]]:
    before = cpu_s(resource.getrusage(resource.RUSAGE_SELF)) + cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
    predicted = predict_row(row, sharegpt)
    after = cpu_s(resource.getrusage(resource.RUSAGE_SELF)) + cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
    return after - before, predicted


def floor_cpu_s(exe: str, work: Path) -> float:
    """CPU of one `aisimulate predict` of a single short request: its cost per process, before any work."""
    trace = work / "one.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 128, "output_length": 8, "hash_ids": [0]}) + "\n")
    config = {"traffic": {"source": {"type": "trace", "paths": [str(trace)], "format": "mooncake",
                                     "block_size": MOONCAKE_BLOCK_TOKENS}, "load": {"type": "trace_timestamps"}},
              "engine": {"mode": "aggregated", "model": "meta-llama/Meta-Llama-3.1-8B", "hardware": "h100_sxm",
                         "backend": "vllm", "workers": {"aggregated": {"parallelism": {"tensor": 1}}}}}
    return run_aisimulate(exe, config, work / "floor")[0]


def aisim_version(exe: str) -> str:
    python = Path(exe).with_name("python")
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aisimulate'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def compare_row(k: int, row: dict, sharegpt: dict, exe: str, work: Path, args: argparse.Namespace) -> dict:
    """One row through both tools: predictions, signed errors, CPU medians."""
    prepared = row_prepared(row, sharegpt)
    requests, scenario = prepared.requests, prepared.scenario
    trace = work / f"row{k}.jsonl"
    write_trace(requests, trace, "mooncake")
    kv_precision = scenario.model.kv_precision(scenario.engine.scheduler)
    config, not_carried = aisim_config(row, trace, kv_precision, host_loop=not args.no_host_loop)
    aisim_cpu, tokenpath_cpu = [], []
    for _ in range(args.repeats):
        try:
            cpu, report = run_aisimulate(exe, config, work / f"row{k}")
        except MissingData:  # no kernel table at the run's KV precision: AISimulate's own choice of it
            del config["engine"]["kvcache_quant_mode"]
            not_carried.append(f"KV cache {kv_precision} (no AISimulate data for it)")
            cpu, report = run_aisimulate(exe, config, work / f"row{k}")
        aisim_cpu.append(cpu)
        cpu, tp_predicted = run_tokenpath(row, sharegpt)
        tokenpath_cpu.append(cpu)
    ai_predicted = aisim_predicted(row, report, requests)
    provenance = report["prediction_provenance"]["aggregated"]
    return {
        "index": k, "source": row["source"], "id": row.get("id"), "calibration": bool(row.get("calibration")),
        "row": f"{label(row)}, {lengths_label(row)}, {load_label(row)}", "requests": len(requests),
        "ttft_stat": row["ttft_stat"], "decode": f"{row['decode_metric']} {row['decode_stat']}",
        "published_ttft_ms": row["ttft_ms"], "published_decode_ms": row["decode_ms"],
        "tokenpath_ttft_ms": tp_predicted["ttft_s"] * 1e3, "tokenpath_decode_ms": tp_predicted["decode_s"] * 1e3,
        "aisim_ttft_ms": ai_predicted["ttft_s"] * 1e3, "aisim_decode_ms": ai_predicted["decode_s"] * 1e3,
        "tokenpath_error": relative_errors(row, tp_predicted), "aisim_error": relative_errors(row, ai_predicted),
        "tokenpath_cpu_s": statistics.median(tokenpath_cpu), "aisim_cpu_s": statistics.median(aisim_cpu),
        "aisim_sim_ms": report["wall_time_ms"], "aisim_completed": report["completed_requests"],
        "aisim_prefix_reuse": report["prefix_cache_reused_ratio"],
        "engine_version": row.get("engine_version", "not stated"), "aisim_data_version": provenance["data_version"],
        "kv_precision": kv_precision,
        "not_carried": not_carried, "aisim_config": config["engine"],
    }


def print_rows(results: list[dict]) -> None:
    print("\n(* a calibration row: it sets a tokenpath constant)")
    print(f"{'#':>3} {'row':70} {'TTFT':>14} {'tokenpath':>9} {'AISim':>8}  {'decode':>17} {'tokenpath':>9} "
          f"{'AISim':>8}  {'CPU tp':>7} {'AISim':>6}")
    for r in results:
        tp, ai = r["tokenpath_error"], r["aisim_error"]
        mark = "*" if r["calibration"] else " "
        print(f"{r['index']:3}{mark}{(r['source'] + ': ' + r['row'])[:70]:70} "
              f"{r['ttft_stat']:>6} {r['published_ttft_ms']:7.1f} {tp['ttft']:+9.1%} {ai['ttft']:+8.1%}  "
              f"{r['decode']:>11} {r['published_decode_ms']:5.1f} {tp['decode']:+9.1%} {ai['decode']:+8.1%}  "
              f"{r['tokenpath_cpu_s']:6.2f}s {r['aisim_cpu_s']:5.2f}s")
        carried = f"; not carried: {', '.join(r['not_carried'])}" if r["not_carried"] else ""
        print(f"    AISimulate {r['aisim_data_version']} (row: {r['engine_version']}), ms: TTFT tokenpath "
              f"{r['tokenpath_ttft_ms']:.1f} AISim {r['aisim_ttft_ms']:.1f}, decode {r['tokenpath_decode_ms']:.2f} / "
              f"{r['aisim_decode_ms']:.2f}{carried}")


def summarize(results: list[dict]) -> dict:
    """Over the rows both ran that set no tokenpath constant: median |error|, rows closer, CPU."""
    scored = [r for r in results if not r["calibration"]]
    summary: dict[str, Any] = {"rows": len(scored), "calibration_rows_left_out": len(results) - len(scored)}
    for metric in ("ttft", "decode"):
        tp = [abs(r["tokenpath_error"][metric]) for r in scored]
        ai = [abs(r["aisim_error"][metric]) for r in scored]
        summary[metric] = {
            "tokenpath_median_abs_error": statistics.median(tp) if tp else None,
            "aisim_median_abs_error": statistics.median(ai) if ai else None,
            "tokenpath_closer": sum(t < a for t, a in zip(tp, ai)),
            "aisim_closer": sum(a < t for t, a in zip(tp, ai)),
        }
    for tool in ("tokenpath", "aisim"):
        cpu = [r[f"{tool}_cpu_s"] for r in results]
        summary[f"{tool}_cpu_s"] = {"median_per_row": statistics.median(cpu) if cpu else None, "total": sum(cpu)}
    sim = [r["aisim_sim_ms"] / 1e3 for r in results]
    summary["aisim_reported_sim_s"] = {"median_per_row": statistics.median(sim) if sim else None, "total": sum(sim)}
    return summary


def print_summary(summary: dict, floor_s: float) -> None:
    print(f"\nOver {summary['rows']} rows both express ({summary['calibration_rows_left_out']} calibration "
          "rows of tokenpath's left out):")
    for metric, name in (("ttft", "TTFT"), ("decode", "TPOT / ITL")):
        s = summary[metric]
        if s["tokenpath_median_abs_error"] is None:
            continue
        print(f"  {name:10} median |error| tokenpath {s['tokenpath_median_abs_error']:.1%}, AISimulate "
              f"{s['aisim_median_abs_error']:.1%}; closer: tokenpath on {s['tokenpath_closer']} rows, "
              f"AISimulate on {s['aisim_closer']}")
    tp, ai, sim = summary["tokenpath_cpu_s"], summary["aisim_cpu_s"], summary["aisim_reported_sim_s"]
    print(f"  CPU per row, median: tokenpath {tp['median_per_row']:.2f} s, AISimulate {ai['median_per_row']:.2f} s "
          f"(its own reported simulation time {sim['median_per_row']:.2f} s; one request alone {floor_s:.2f} s); "
          f"total {tp['total']:.1f} s against {ai['total']:.1f} s")


def held_out_rows(data: dict, count: int, seed: int, csv: Path | None = None) -> list[dict]:
    """`count` of AIConfigurator's measured runs (`csv`: its silicon_sample.csv, the installed
    aiconfigurator-core's by default) that latency.toml does not ship, as latency rows: the draw and the
    rows of benchmarks/aiconfigurator_silicon.py (AIPerf's measured phase alone)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from aiconfigurator_silicon import candidate_runs, default_csv, row_of

    runs = candidate_runs(csv or default_csv(), {row.get("id") for row in data["rows"]})
    runs = runs.sample(min(count, len(runs)), random_state=seed)
    return [row_of(run, "profiling_phase") for _, run in runs.iterrows()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aisimulate", default="aisimulate", help="the aisimulate executable (its venv's bin/)")
    parser.add_argument("--rows", type=int, help="stop after this many rows both ran")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each tool per row (CPU medians)")
    parser.add_argument("--no-host-loop", action="store_true", help="leave SGLang's overlap loop off in AISimulate")
    parser.add_argument("--held-out", type=int, metavar="N",
                        help="instead of the shipped rows, N of AIConfigurator's measured runs the project does not "
                             "ship, drawn as benchmarks/aiconfigurator_silicon.py draws them")
    parser.add_argument("--seed", type=int, default=1, help="the --held-out draw's seed")
    parser.add_argument("--json", help="write the rows and the summary to PATH")
    args = parser.parse_args()
    exe = shutil.which(args.aisimulate) or sys.exit(
        "aisimulate not found: python3 -m venv /tmp/aisim-venv && /tmp/aisim-venv/bin/pip install --pre "
        "--only-binary=:all: aisimulate, then --aisimulate /tmp/aisim-venv/bin/aisimulate")
    data = load_latency()
    rows = data["rows"] if args.held_out is None else held_out_rows(data, args.held_out, args.seed)
    work = Path(tempfile.mkdtemp(prefix="vs-aisim-"))
    start = time.perf_counter()
    results, skipped = [], []
    for k, row in enumerate(rows):
        if args.rows is not None and len(results) >= args.rows:
            break
        reason = why_not(row)
        if reason:
            skipped.append({"index": k, "source": row["source"], "row": label(row), "reason": reason})
            continue
        try:
            results.append(compare_row(k, row, data["sharegpt"], exe, work, args))
        except RuntimeError as error:  # AISimulate refused the row: say why, go on
            skipped.append({"index": k, "source": row["source"], "row": label(row),
                            "reason": str(error).splitlines()[0][:300]})
            continue
        r = results[-1]
        print(f"row {k} ({r['source']}): TTFT {r['tokenpath_error']['ttft']:+.1%} / {r['aisim_error']['ttft']:+.1%}, "
              f"decode {r['tokenpath_error']['decode']:+.1%} / {r['aisim_error']['decode']:+.1%} "
              f"(tokenpath / AISimulate)", flush=True)
    floor_s = floor_cpu_s(exe, work)
    versions = {"tokenpath": TOKENPATH_VERSION, "aisimulate": aisim_version(exe)}
    print(f"\ntokenpath {versions['tokenpath']}, AISimulate {versions['aisimulate']}; "
          f"{time.perf_counter() - start:.0f} s in all")
    for s in skipped:
        print(f"  row {s['index']} ({s['source']}, {s['row']}): not run, {s['reason']}")
    print_rows(results)
    summary = summarize(results)
    print_summary(summary, floor_s)
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions, "repeats": args.repeats,
                                               "host_loop": not args.no_host_loop, "aisim_floor_cpu_s": floor_s,
                                               "summary": summary, "rows": results, "not_run": skipped}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
