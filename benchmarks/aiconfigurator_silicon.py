"""tokenpath's latency predictions on AIConfigurator's measured serving runs that the project does not ship.

NVIDIA's AIConfigurator validates its own predictions against thousands of measured runs, published in
the `aiconfigurator-core` wheel as `systems/silicon_sample.csv` (TTFT and TPOT means of aiperf runs at
fixed lengths and a stated concurrency). `tokenpath validate --group latency` ships 13 of them; this
script draws others at random, the aggregated (one-engine) runs of the models and chips tokenpath's
catalog has, and predicts each the way `validate` predicts its rows: the engine limits AIConfigurator's
generator writes, 20 x concurrency requests as its benchmark script sends, and AIPerf's measured phase
alone (its warm-up drains first).

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_silicon.py --rows 60 --seed 1

`--window steady` predicts the same runs as one continuous run with the warm-up skipped instead, to
compare the two readings of how AIPerf measures.

Each run's TTFT and TPOT are also checked against the error band `simulate` states for the run (sim/
bands.py: the range a measurement would fall in, from the validated rows nearest its regime, nominally
eight in ten): `in` or `OUT` on each line, and at the end the share of runs whose measurement the band
held, with the bands' median width (high / low). A run whose scenario `simulate` says lies outside the
validated envelope (sim/envelope.py) is marked `*`, and the end gives the medians inside and outside
it, with what put the runs outside.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from importlib import resources
from pathlib import Path

import pandas as pd

from tokenpath.sim.document import result_document
from tokenpath.sim.simulate import simulate
from tokenpath.validate.latency import load_latency, relative_errors, row_prepared, run_prediction

# silicon_sample.csv's names -> the catalog's
MODELS = {"meta-llama/Llama-3.1-70B": "llama-3.1-70b", "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
          "deepseek-ai/DeepSeek-R1": "deepseek-v3"}
CHIPS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200"}
REQUESTS_PER_SLOT = 20  # bench_run.sh.j2: --num-requests concurrency x BENCH_MULTI_ROUND (20)
# The days vLLM 0.14.0's and 0.20.0's wheels were built (their files' dates on PyPI): runs measured before
# one ran an earlier release.
VLLM_0_14_BUILT = "2026-01-18"
VLLM_0_20_BUILT = "2026-04-27"


def engine_settings(backend: str, isl: int, batch_size: int, measured: str | None = None,
                    release: str | None = None) -> dict:
    """The engine settings of a run, exactly as the shipped rows of catalog/validation/latency.toml record
    them: the limits AIConfigurator's generator writes for an aggregated worker (generator/rule_plugin/
    *.rule; TensorRT-LLM's decode graphs padded, trtllm.rule's 'agg_decode cuda_graph_enable_padding =
    true', of every size up to its max_batch_size, its cuda_graph_batch_sizes running to 512 and to
    max_batch_size + 8). `batch_size`: the run's own max_batch_size, silicon_sample's batch_size (the rules'
    first line sets the benchmark's concurrency to the workers times it: a tensor-parallel run states its
    concurrency, an attention-DP run each rank's share), which trtllm.rule keeps ('agg_decode max_batch_size
    = (max_batch_size if max_batch_size else 128)') and vllm.rule raises to 512. A vLLM run that states no
    `release` but was `measured` (a date, YYYY-MM-DD) before 0.14.0 was built (VLLM_0_14_BUILT) ran without
    async scheduling, which that release made the default, and one measured before 0.20.0 with 0.9 of the
    GPU's memory, its default until then."""
    if backend == "vllm":
        settings: dict = {"max_num_seqs": 512, "max_num_batched_tokens": 512 + isl + 1500}
        if release is None and measured is not None and measured < VLLM_0_14_BUILT:
            settings["host_overlap"] = False
        if release is None and measured is not None and measured < VLLM_0_20_BUILT:
            settings["gpu_memory_utilization"] = 0.9
        return settings
    if backend == "trtllm":
        return {"max_num_seqs": batch_size, "max_num_batched_tokens": math.ceil((batch_size + isl + 500) / 32) * 32,
                "chunked_prefill": False, "cuda_graphs": "decode", "cuda_graph_padding": True,
                "cuda_graph_max_tokens": batch_size}
    return {"chunked_prefill": True, "mixed_chunk": True, "max_num_batched_tokens": isl + 1500, "cuda_graphs": "decode"}


def default_csv() -> Path:
    try:
        return Path(str(resources.files("aiconfigurator_core") / "systems" / "silicon_sample.csv"))
    except ModuleNotFoundError:
        sys.exit("aiconfigurator-core is not installed: pip install aiconfigurator-core, or pass --csv PATH")


def candidate_runs(csv: Path, shipped: set[str], attention_dp: bool = False) -> pd.DataFrame:
    """The aggregated fp8 runs of the catalog's models and chips that latency.toml does not ship: tensor-parallel
    ones, or with `attention_dp` those whose attention is data-parallel over all their GPUs with as many expert
    ranks (TensorRT-LLM's DeepSeek runs: attention_dp_size = moe_ep_size, tp_size 1)."""
    df = pd.read_csv(csv)
    if attention_dp:
        layout = (df.tp_size == 1) & (df.attention_dp_size > 1) & (df.moe_ep_size == df.attention_dp_size)
    else:
        layout = (df.attention_dp_size == 1) & (df.moe_ep_size.fillna(1) == 1)
    runs = df[(df["mode"] == "agg") & df.model_path.isin(MODELS) & df.system.isin(CHIPS) & (df.pp_size == 1)
              & layout & ~df.id.isin(shipped)
              & df.gemm_quant_mode.isin(["fp8", "fp8_block"]) & df.silicon_ttft_ms.notna() & df.silicon_tpot_ms.notna()]
    runs = runs.assign(concurrency=runs.silicon_data_source.str.extract(r"silicon_concurrency=(\d+)")[0].astype(float))
    runs = runs[runs.concurrency.notna()]
    return runs.drop_duplicates(["model_path", "system", "backend", "isl", "osl", "tp_size", "attention_dp_size",
                                 "concurrency"])


def group_of(run: pd.Series) -> tuple[str, str, str]:
    """Where a run's error is reported in the breakdown: its engine, chip and whether it is tensor-parallel
    (or attention data-parallel)."""
    if run.attention_dp_size > 1:
        return run.backend, CHIPS[run.system], f"adp{int(run.attention_dp_size)}"
    return run.backend, CHIPS[run.system], "tp1" if run.tp_size == 1 else "tp>1"


def row_of(run: pd.Series, window: str) -> dict:
    """A latency row, as catalog/validation/latency.toml writes AIConfigurator's, for one measured run: its
    measured TTFT and TPOT means included, its KV cache fp8 as AIConfigurator's fp8 profile sets it, and
    the engine's release where the run states it (the newest where not), and the engine settings
    `engine_settings` gives its backend, release and measuring date."""
    version = run.get("backend_version")
    release = {"engine_version": version} if isinstance(version, str) else {}
    ranks = int(run.attention_dp_size)
    measured = re.search(r"measured=(\d{4}-\d{2}-\d{2})", str(run.get("silicon_data_source", "")))
    settings = engine_settings(run.backend, int(run.isl), int(run.batch_size),
                               measured.group(1) if measured else None, release.get("engine_version"))
    layout = {"tp": ranks, "attention_dp": True, "expert_parallel": True} if ranks > 1 else {"tp": int(run.tp_size)}
    return {"source": f"silicon_sample {run.id}", "id": str(run.id), "engine": run.backend, **release,
            "model": MODELS[run.model_path], "precision": "fp8", "kv_cache_precision": "fp8",
            "chip": CHIPS[run.system], **layout,
            "lengths": "fixed", "input_len": int(run.isl), "output_len": int(run.osl), "arrival": "concurrency",
            "concurrency": int(run.concurrency), "engine_settings": settings,
            "window": window, "requests_per_slot": REQUESTS_PER_SLOT,
            "ttft_ms": float(run.silicon_ttft_ms), "ttft_stat": "mean",
            "decode_ms": float(run.silicon_tpot_ms), "decode_metric": "tpot", "decode_stat": "mean"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="silicon_sample.csv (default: the installed aiconfigurator-core's)")
    parser.add_argument("--rows", type=int, default=60, help="runs drawn at random")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--window", choices=["profiling_phase", "steady"], default="profiling_phase")
    parser.add_argument("--attention-dp", action="store_true",
                        help="draw the runs with attention data-parallel over all their GPUs (TensorRT-LLM's DeepSeek "
                             "runs) instead of the tensor-parallel ones")
    args = parser.parse_args()
    data = load_latency()
    shipped = {row.get("id") for row in data["rows"]}
    runs = candidate_runs(args.csv or default_csv(), shipped, args.attention_dp)
    runs = runs.sample(min(args.rows, len(runs)), random_state=args.seed)
    errors = []
    groups: dict[tuple[str, str, str], list[tuple[float, float, bool, bool]]] = {}  # errors, bands held
    held: dict[str, list[tuple[bool, float]]] = {"ttft": [], "tpot": []}
    by_envelope: dict[bool, list[tuple[float, float, bool, bool]]] = {True: [], False: []}  # errors, bands held
    outside_why: dict[str, int] = {}
    for _, run in runs.iterrows():
        row = row_of(run, args.window)
        simulation = simulate(row_prepared(row, data["sharegpt"]))
        predicted = run_prediction(row, simulation.run)
        error = relative_errors(row, predicted)
        ttft, tpot = error["ttft"], error["decode"]
        errors.append((ttft, tpot))
        document, _ = result_document(simulation)
        bands = band_ratios(document)
        validated = document["envelope"]["validated"]
        for what in document["envelope"]["outside"]:
            outside_why[what] = outside_why.get(what, 0) + 1
        marks = {}
        for key, value_s, measured_ms in (("ttft", predicted["ttft_s"], run.silicon_ttft_ms),
                                          ("tpot", predicted["decode_s"], run.silicon_tpot_ms)):
            low, high = (value_s * 1e3 * ratio for ratio in bands[key])
            held[key].append((low <= measured_ms <= high, high / low))
            marks[key] = "in " if held[key][-1][0] else "OUT"
        outcome = (ttft, tpot, held["ttft"][-1][0], held["tpot"][-1][0])
        by_envelope[validated].append(outcome)
        groups.setdefault(group_of(run), []).append(outcome)
        layout = f"adp{int(run.attention_dp_size)}" if run.attention_dp_size > 1 else f"tp{int(run.tp_size)}"
        print(f"{run.backend:6} {MODELS[run.model_path]:13} {run.system:8} {layout} "
              f"{int(run.isl)}/{int(run.osl)} c{int(run.concurrency):<4} "
              f"TTFT {run.silicon_ttft_ms:8.1f} ms {ttft:+6.0%} {marks['ttft']}  "
              f"TPOT {run.silicon_tpot_ms:6.1f} ms {tpot:+6.0%} {marks['tpot']}{'' if validated else ' *'}",
              flush=True)
    print("\nby engine, chip and TP (median signed error, then median |error|, then the share of runs the band held):")
    for (backend, chip, tp), group in sorted(groups.items()):
        ttfts, tpots = [g[0] for g in group], [g[1] for g in group]
        print(f"  {backend:6} {chip:8} {tp:5} {len(group):3} runs  TTFT {statistics.median(ttfts):+6.0%} "
              f"({statistics.median(map(abs, ttfts)):4.0%}, {sum(g[2] for g in group) / len(group):4.0%} held)  "
              f"TPOT {statistics.median(tpots):+6.0%} ({statistics.median(map(abs, tpots)):4.0%}, "
              f"{sum(g[3] for g in group) / len(group):4.0%} held)")
    print(f"{len(errors)} runs ({args.window}): median |error| TTFT "
          f"{statistics.median(abs(t) for t, _ in errors):.1%}, "
          f"TPOT {statistics.median(abs(d) for _, d in errors):.1%}")
    print("the error bands simulate states (nominally 8 in 10) held the measurement: "
          + ", ".join(f"{key.upper()} {sum(ok for ok, _ in outcomes) / len(outcomes):.0%} of runs "
                      f"(median width x{statistics.median(width for _, width in outcomes):.2f})"
                      for key, outcomes in held.items()))
    for validated, group in by_envelope.items():
        if group:
            print(f"{'inside' if validated else 'outside (*)'} the validated envelope: {len(group)} runs, median "
                  f"|error| TTFT {statistics.median(abs(g[0]) for g in group):.1%}, "
                  f"TPOT {statistics.median(abs(g[1]) for g in group):.1%}; bands held TTFT "
                  f"{sum(g[2] for g in group) / len(group):.0%}, TPOT {sum(g[3] for g in group) / len(group):.0%}")
    if outside_why:
        print("outside for: " + "; ".join(f"{what} ({count} runs)" for what, count in sorted(outside_why.items())))


def band_ratios(document: dict) -> dict[str, tuple[float, float]]:
    """The mean TTFT's and TPOT's error bands of a simulated run's result document, as multiples of the
    predicted means."""
    ratios = {}
    for key in ("ttft", "tpot"):
        figure = document["latency_s"][key]
        ratios[key] = (figure["band"]["mean"]["low"] / figure["mean"], figure["band"]["mean"]["high"] / figure["mean"])
    return ratios


if __name__ == "__main__":
    main()
