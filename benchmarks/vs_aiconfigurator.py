"""tokenpath search against NVIDIA AIConfigurator's `aiconfigurator cli default` on one question: which
layout of Llama-3.1-70B FP8 on 8x H200 serves the most requests at TTFT <= 1 s and TPOT <= 50 ms for
550 input and 150 output tokens? Wall and CPU time of each, their top three layouts, the ratio of the
wall times, and each tool's top answer re-run through `tokenpath capacity` so the rates compare on one
model.

Usage:
  pip install aiconfigurator          # 0.12.0; not a tokenpath dependency
  python benchmarks/vs_aiconfigurator.py [--repeats 3] [--backends trtllm vllm] [--json PATH]

What runs, one after the other, --repeats times (medians kept; the machine is shared and noisy):
- `aiconfigurator cli default --model nvidia/Llama-3.1-70B-Instruct-FP8 --total-gpus 8 --system h200_sxm
  --backend B --isl 550 --osl 150 --ttft 1000 --tpot 50` for each backend B (its default: aggregated and
  disaggregated serving compared). The model id is one whose config AIConfigurator ships (it reads it
  offline); its FP8 checkpoint is the one tokenpath's default scenario serves.
- `tokenpath search --chips 8 --slo ttft_p99=1s,tpot_p99=50ms` on the default scenario (Llama-3.1-70B
  FP8 on H200s, the LLMPerf workload: 550 +- 150 input tokens, 150 +- 80 output, Poisson arrivals).
- The same search with `ttft_mean=1s,tpot_mean=50ms`: AIConfigurator estimates one TTFT and one TPOT per
  configuration, those of a steady batch of requests of exactly ISL and OSL tokens (its TTFT with a
  queueing correction for the prefills ahead), filtered against the targets. That is a mean over a
  steady state, with no spread of lengths or arrivals, not a percentile; the mean search is the like for
  like comparison, the p99 one the question as asked.
- The p99 search over the same engines with disaggregated pools too, `--engines trtllm,vllm --disagg`:
  the scope of AIConfigurator's default mode (both backends, aggregated and disaggregated), where the
  plain search compares the scenario's own engine (vLLM V1) colocated.

Wall time is each process's, start to exit; CPU time is user + system of it and its children
(getrusage). AIConfigurator's time is the sum over the backends it is asked for (one answer, as one
search is), and each backend's alone is printed too.

The top answers are then re-run in tokenpath, `tokenpath capacity --set ...`: each search's best at its
SLO (which repeats its capacity search), and each backend's best of AIConfigurator at both SLOs: its
layout (TP, PP, the replicas; for disaggregated serving the prefill replicas, when both pools have one
TP, as tokenpath models them) under the tokenpath engine profile its backend maps to (trtllm: trtllm,
vllm: vllm-v1), at the scenario's engine limits. AIConfigurator's batch size is the operating point it
assumed, not an engine limit, so it is not carried.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenpath.engine.profiles import MEASURED_ENGINES
from tokenpath.whatif.search import set_args

MODEL = "nvidia/Llama-3.1-70B-Instruct-FP8"  # AIConfigurator ships its config (model_configs/)
SYSTEM = "h200_sxm"
CHIPS = 8
ISL, OSL = 550, 150
TTFT_MS, TPOT_MS = 1000, 50
SLOS = {"p99": "ttft_p99=1s,tpot_p99=50ms", "mean": "ttft_mean=1s,tpot_mean=50ms"}  # TTFT_MS, TPOT_MS


def timed(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the process and its children, the finished process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def aiconfigurator(exe: str, backend: str, folder: Path) -> tuple[float, float, list[dict]]:
    shutil.rmtree(folder, ignore_errors=True)
    wall, cpu, _ = timed([exe, "cli", "default", "--model", MODEL, "--total-gpus", str(CHIPS), "--system", SYSTEM,
                          "--backend", backend, "--isl", str(ISL), "--osl", str(OSL), "--ttft", str(TTFT_MS),
                          "--tpot", str(TPOT_MS), "--save-dir", str(folder)])
    rows = []
    for path in folder.rglob("best_config_topn.csv"):
        mode = path.parent.name  # agg or disagg
        for row in csv.DictReader(path.open()):
            rows.append(_aic_row(mode, row))
    return wall, cpu, rows


def _aic_row(mode: str, row: dict) -> dict:
    """One configuration AIConfigurator ranks, as a tokenpath layout where it maps to one."""
    rate = float(row["seq/s/gpu"]) * CHIPS
    out = {"mode": mode, "requests_per_s": rate, "ttft_ms": float(row["ttft"]), "tpot_ms": float(row["tpot"])}
    if mode == "agg":
        backend, tp, pp = row["backend"], int(row["tp"]), int(row["pp"])
        replicas = CHIPS // (tp * pp)
        out |= {"backend": backend, "batch": int(row["bs"]),
                "layout": f"TP{tp}" + (f" x PP{pp}" if pp > 1 else "") + f" x DP{replicas}",
                "set": {"deployment.tp": tp, "deployment.pp": pp}}
    else:
        backend = row["(p)backend"]
        copies = CHIPS // int(row["num_total_gpus"])
        p_tp, d_tp = int(row["(p)tp"]), int(row["(d)tp"])
        prefill, decode = int(row["(p)workers"]) * copies, int(row["(d)workers"]) * copies
        out |= {"backend": backend, "batch": int(row["(d)bs"]),
                "layout": f"prefill {prefill} x TP{p_tp}, decode {decode} x TP{d_tp}"}
        if p_tp == d_tp and row["(p)pp"] == row["(d)pp"] == "1":
            out["layout"] = f"TP{p_tp} x DP{prefill + decode} ({prefill}P:{decode}D)"
            out["set"] = {"deployment.tp": p_tp, "deployment.prefill_replicas": prefill}
        else:
            out["set"] = None  # tokenpath's disaggregated pools share one TP
    if out["set"] is not None:
        out["set"]["engine.scheduler"] = MEASURED_ENGINES[backend]
    return out


def search(slo: str, flags: list[str], folder: Path) -> tuple[float, float, dict]:
    path = folder / "search.json"
    wall, cpu, _ = timed([sys.executable, "-m", "tokenpath", "search", "--chips", str(CHIPS), "--slo", slo, *flags,
                          "--json", str(path)])
    return wall, cpu, json.loads(path.read_text())


def capacity(sets: list[str], slo: str, folder: Path) -> dict:
    """`tokenpath capacity` of the default scenario with `sets` (KEY=VALUE) on CHIPS chips at `slo`."""
    path = folder / "capacity.json"
    sets = [f"deployment.chips={CHIPS}", *(s for s in sets if not s.startswith("deployment.chips="))]
    argv = [sys.executable, "-m", "tokenpath", "capacity", "--slo", slo]
    for item in sets:
        argv += ["--set", item]
    wall, _, _ = timed([*argv, "--json", str(path)])
    document = json.loads(path.read_text())
    return {"request_rate": document["request_rate"], "binding": document["binding"],
            "overloaded": document["summary"]["load"]["overloaded"], "wall_s": wall,
            "command": f"tokenpath capacity --slo {slo}" + "".join(f" --set {item}" for item in sets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["trtllm", "vllm"])
    parser.add_argument("--aiconfigurator", default="aiconfigurator", help="the aiconfigurator executable")
    parser.add_argument("--json", help="write the figures to PATH")
    args = parser.parse_args()
    exe = shutil.which(args.aiconfigurator) or sys.exit("aiconfigurator not found: pip install aiconfigurator")
    work = Path(tempfile.mkdtemp(prefix="vs-aic-"))

    # name -> (its SLO's key in SLOS, extra flags): the question as asked, with mean targets, and over the
    # engines AIConfigurator compares with disaggregated pools too (the same scope as its default mode)
    searches_run = {"p99": ("p99", []), "mean": ("mean", []),
                    "p99, engines + disagg": ("p99", ["--engines", ",".join(args.backends), "--disagg"])}
    times: dict[str, list[tuple[float, float]]] = {"aiconfigurator": []}
    times |= {f"aiconfigurator {backend}": [] for backend in args.backends}
    times |= {f"search {name}": [] for name in searches_run}
    aic_rows: list[dict] = []
    searches: dict[str, dict] = {}
    for repeat in range(args.repeats):  # the tools alternate, so each median spans the same stretches
        wall = cpu = 0.0
        rows = []
        for backend in args.backends:
            w, c, r = aiconfigurator(exe, backend, work / f"aic-{backend}")
            times[f"aiconfigurator {backend}"].append((w, c))
            wall, cpu, rows = wall + w, cpu + c, rows + r
        times["aiconfigurator"].append((wall, cpu))
        aic_rows = rows
        for name, (stat, flags) in searches_run.items():
            w, c, searches[name] = search(SLOS[stat], flags, work)
            times[f"search {name}"].append((w, c))
        print(f"run {repeat + 1}: " + ", ".join(f"{name} {t[-1][0]:.1f} s wall ({t[-1][1]:.1f} s CPU)"
                                                for name, t in times.items()), flush=True)

    medians = {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
               for name, t in times.items()}
    print(f"\nMedians of {args.repeats} run(s) (wall, CPU):")
    for name, (wall, cpu) in medians.items():
        print(f"  {name:30} {wall:6.1f} s  {cpu:6.1f} s")
    aic_wall = medians["aiconfigurator"][0]
    for name in searches_run:
        print(f"  wall ratio aiconfigurator ({' + '.join(args.backends)}) / search {name}: "
              f"{aic_wall / medians[f'search {name}'][0]:.2f}")

    aic_rows.sort(key=lambda row: -row["requests_per_s"])
    for backend in args.backends:
        print(f"\nAIConfigurator {backend} (its TTFT and TPOT of a steady batch), top three:")
        for i, row in enumerate([row for row in aic_rows if row["backend"] == backend][:3], 1):
            print(f"  {i}. {row['layout']:34} {row['mode']:6} bs {row['batch']:4}  {row['requests_per_s']:6.2f} req/s"
                  f"  TTFT {row['ttft_ms']:6.1f} ms  TPOT {row['tpot_ms']:5.1f} ms")
    for name, document in searches.items():
        stat, flags = searches_run[name]
        command = " ".join(["tokenpath search --slo", SLOS[stat], *flags])
        print(f"{command} ({document['counts']['simulations']} simulations), top three:")
        for c in document["candidates"][:3]:
            print(f"  {c['rank']}. {c['layout']:34} {c['engine']:7} {c['request_rate']:6.2f} req/s  "
                  f"TTFT p99 {c['ttft_p99_s'] * 1e3:6.1f} ms  TPOT p99 {c['tpot_p99_s'] * 1e3:5.1f} ms")
        close = [f"{p['layout']} ({p['engine']}, {p['limits']})" for p in document["pruned"] if p["stage"] == "close"]
        if close:
            print(f"  close to the best at {document['candidates'][0]['num_requests']:,} requests, not searched: "
                  + "; ".join(close))

    print("\nEach top answer's capacity in tokenpath:")
    rerun = {}
    for stat, slo in SLOS.items():
        answers = {f"search {name}": searches[name]["best"]["set"]
                   for name, (searched, _) in searches_run.items() if searched == stat}
        for backend in args.backends:  # each backend's best that tokenpath models
            best = next((row for row in aic_rows if row["backend"] == backend and row["set"] is not None), None)
            if best is not None:
                answers[f"aiconfigurator {backend} {best['layout']}"] = set_args(best["set"])
        for name, sets in answers.items():
            result = capacity(sets, slo, work)
            rerun[f"{name} at {stat}"] = result
            print(f"  {name:40} at {stat:4}: {result['request_rate']:6.2f} req/s ({result['binding']['metric']} "
                  f"binds, overloaded {result['overloaded']})\n      {result['command']}")

    if args.json:
        kept = ("layout", "engine", "request_rate", "ttft_p99_s", "tpot_p99_s", "set")
        Path(args.json).write_text(json.dumps({
            "repeats": args.repeats, "backends": args.backends, "times": times, "medians": medians,
            "aiconfigurator": aic_rows, "capacity": rerun,
            "search": {name: [{k: c[k] for k in kept} for c in d["candidates"]] for name, d in searches.items()}},
            indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
