"""Measure once, predict another load: `calibrate engine` against a server whose truth is hidden.

Usage: python benchmarks/calibrate_loop.py [--repeats 3] [--rate 6] [--input-len 700] [--output-len 200]
                                           [--requests 120] [--json PATH]

The server is `tokenpath serve` on 127.0.0.1 running Llama-3.1-8B (bf16) on one H100 with two of its
assumptions perturbed and not told to anyone else: the prefill GEMMs' share of the matmul rate halved
(`serving_gemm_fraction` x0.5) and the host's time per step x4 (`host_step_s`), no network
(`--no-network-delay`, round trip 0). Each repeat then, as a user would:

1. `tokenpath calibrate engine` probes that server from outside (its default probe and budget) against
   the unperturbed scenario, and writes a calibration file;
2. `tokenpath bench` measures the server at a load the probe never used: `--rate` requests a second,
   fixed lengths (`--input-len` / `--output-len`), `--requests` of them;
3. `tokenpath simulate` predicts the same load twice: with the calibration file and without it.

It prints each repeat's TTFT p50 and TPOT p50, measured and predicted, and the median error over the
repeats. The calibrated prediction should be within 10% of bench on both; the uncalibrated one shows how
far the hidden truth lies from the defaults. serve runs in real time on this machine: a busy machine
slows what bench measures, which the probe, run earlier, cannot know.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import tomli_w

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from serve_burst import served, tokenpath

from tokenpath.config.assumptions import default

MODEL = "llama-3.1-8b"
CLAIM = 0.10
# The hidden truth: each assumption's default, perturbed.
PERTURBATION = {"serving_gemm_fraction": 0.5, "host_step_s": 4.0}


def scenario_table() -> dict:
    return {
        "name": "calibrate-loop", "seed": 0,
        "model": {"name": MODEL, "precision": "bf16"},
        "deployment": {"chip": "h100", "chips": 1, "tp": 1},
        # vLLM V1 without its async scheduling (before 0.14.0), as the figures of benchmarks/README.md were
        # measured: the host's step time shows in every step.
        "engine": {"host_overlap": False},
        # Loopback: no network between client and server; the shipped corpus shows a character per token.
        "delivery": {"network_rtt": 0.0, "network_bw": "10 GB/s", "invisible_token_fraction": 0.0},
    }


def hidden_truth() -> dict[str, float]:
    return {name: default(name) * factor for name, factor in PERTURBATION.items()}


def load_overrides(args: argparse.Namespace) -> list[str]:
    """The check load as command-line options of simulate and bench."""
    return ["--request-rate", str(args.rate), "--input-len", str(args.input_len), "--input-sd", "0",
            "--set", f'workload.output={{kind="fixed",value={args.output_len}}}',
            "--set", f"workload.num_requests={args.requests}"]


def p50s(path: Path) -> dict[str, float]:
    latency = json.loads(path.read_text())["latency_s"]
    return {"ttft": latency["ttft"]["p50"], "tpot": latency["tpot"]["p50"]}


def one_repeat(folder: Path, url: str, check: list[str], k: int) -> dict[str, dict[str, float]]:
    scenario, calibration = folder / "scenario.toml", folder / f"calibration-{k}.toml"
    tokenpath("calibrate", "engine", str(scenario), "--base-url", url, "--model", MODEL, "--out", str(calibration))
    tokenpath("bench", str(scenario), "--base-url", url, "--model", MODEL, *check,
              "--results", str(folder / f"bench-{k}.jsonl"), "--json", str(folder / f"bench-{k}.json"))
    tokenpath("simulate", str(scenario), *check, "--set", f"assumptions.calibration={calibration}",
              "--json", str(folder / f"calibrated-{k}.json"))
    tokenpath("simulate", str(scenario), *check, "--json", str(folder / f"plain-{k}.json"))
    fitted = {name: table["value"] for name, table in tomllib.loads(calibration.read_text())["fitted"].items()}
    return {"measured": p50s(folder / f"bench-{k}.json"), "calibrated": p50s(folder / f"calibrated-{k}.json"),
            "uncalibrated": p50s(folder / f"plain-{k}.json"), "fitted": fitted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="calibrate-bench-simulate loops (medians kept)")
    parser.add_argument("--rate", type=float, default=6.0, help="the check's requests per second")
    parser.add_argument("--input-len", type=int, default=700)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    check = load_overrides(args)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "scenario.toml").write_text(tomli_w.dumps(scenario_table()))
        (folder / "served.toml").write_text(tomli_w.dumps({**scenario_table(), "assumptions": hidden_truth()}))
        with served(folder / "served.toml") as url:
            repeats = [one_repeat(folder, url, check, k) for k in range(args.repeats)]

    print(f"hidden truth: {', '.join(f'{k} = {v:.4g}' for k, v in hidden_truth().items())}")
    print(f"check load: {args.rate:g} req/s, {args.input_len}/{args.output_len} tokens, {args.requests} requests")
    errors: dict[str, dict[str, list[float]]] = {"calibrated": {"ttft": [], "tpot": []},
                                                 "uncalibrated": {"ttft": [], "tpot": []}}
    for k, repeat in enumerate(repeats):
        measured = repeat["measured"]
        fitted = ", ".join(f"{name} {value:.4g}" for name, value in repeat["fitted"].items())
        print(f"repeat {k + 1}: fitted {fitted}")
        for metric in ("ttft", "tpot"):
            line = [f"  {metric.upper()} p50 bench {measured[metric] * 1e3:7.2f} ms"]
            for side in ("calibrated", "uncalibrated"):
                error = repeat[side][metric] / measured[metric] - 1
                errors[side][metric].append(error)
                line.append(f"{side} {repeat[side][metric] * 1e3:7.2f} ms ({error:+.1%})")
            print("   ".join(line))
    medians = {side: {metric: statistics.median(values) for metric, values in by_metric.items()}
               for side, by_metric in errors.items()}
    for side, by_metric in medians.items():
        print(f"median error, {side}: TTFT {by_metric['ttft']:+.1%}, TPOT {by_metric['tpot']:+.1%}")
    within = all(abs(value) <= CLAIM for value in medians["calibrated"].values())
    print(f"calibrated within {CLAIM:.0%} on both: {'yes' if within else 'no'}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"repeats": repeats, "median_errors": medians,
                                                    "claim": CLAIM, "within": within}, indent=2))


if __name__ == "__main__":
    main()
