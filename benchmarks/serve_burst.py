"""Does `simulate` predict what `bench` measures against `serve` under a saturating burst (TTFT p50 within 15%)?

Usage: python benchmarks/serve_burst.py [--requests 200] [--input-len 128] [--output-len 32] [--repeats 5]
                                        [--max-num-batched-tokens 1024] [--calibration FILE] [--json PATH]

One run does both sides on the same work. It measures this machine's front-end costs with
`tokenpath calibrate delivery` (or takes --calibration), then builds a scenario where the front end
matters in a burst: Llama-3.1-8B on one H100 (TP 1), a small fast engine, so that the API server's work
per request is a visible share of TTFT; N requests sent at once (arrival rate inf) with fixed lengths;
no network (round trip 0, `serve --no-network-delay`, everything on loopback); the scenario's
`delivery.calibration` names the measured file. The engine takes 1,024 tokens a step (vLLM's
max_num_batched_tokens), so a burst's prompts are prefilled 8 at a time in steps of about 20 ms and
TTFT grows smoothly with a request's place in the burst: at 8,192 a step takes 64 prompts and about
116 ms, and the median TTFT jumps by a whole step when a few requests cross from one step to the
next (measured bursts' p50 jumped between 305 and 497 ms), too coarse for a 15% comparison. Then:

- `tokenpath serve` on 127.0.0.1 with that scenario (its process is the front end: real HTTP, tokenizing,
  detokenizing, SSE) and `--send-log`, and `tokenpath bench` against it, `--repeats` bursts one after the
  other (the median of their figures is kept; each burst is its own bench run);
- `tokenpath simulate` on the same scenario, whose front end is the model of delivery/frontend.py with
  the calibrated costs.

It prints TTFT p50/p90 and TPOT p50 of both, the simulated front end's wait and work, bench's client
block (whether the client, which shares the machine's CPUs with serve, kept up) and the TTFT p50 ratio
bench / simulate. To say where a gap comes from it also prints when requests reached serve's handlers
(the send log's arrivals, on the clock bench stamps with) beside when the simulated front end passed
them to the engine, and simulates the engine alone (a trace, no front-end cost) on serve's own arrivals
at its engine: if that agrees with bench, the engine and the token path are right and any gap is in when
the front end lets requests through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tomli_w

from tokenpath import load_scenario
from tokenpath.delivery.lastmile import LastMile
from tokenpath.sim.front_end import layout

MODEL = "llama-3.1-8b"
CLAIM = 0.15  # bench's TTFT p50 within 15% of simulate's
# Long enough for serve to load its tokenizer and corpus and build the deployment on a busy machine.
SERVE_START_S = 120.0


def scenario_table(requests: int, input_len: int, output_len: int, step_tokens: int, calibration: str) -> dict:
    return {
        "name": "serve-burst", "seed": 0,
        "model": {"name": MODEL, "precision": "fp8"},
        "deployment": {"chip": "h100", "chips": 1, "tp": 1},
        "engine": {"max_num_batched_tokens": step_tokens},
        "workload": {"num_requests": requests, "input": {"kind": "fixed", "value": input_len},
                     "output": {"kind": "fixed", "value": output_len}, "arrival": {"rate": float("inf")}},
        # Loopback: no network between client and server; the shipped corpus shows a character per token.
        # The calibration priced as serve's own front end (aiohttp, its framer), not an engine's.
        "delivery": {"network_rtt": 0.0, "network_bw": "10 GB/s", "invisible_token_fraction": 0.0,
                     "calibration": calibration, "calibrated_server": "serve"},
    }


def tokenpath(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenpath", *args], check=True, capture_output=True, text=True,
                          **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVE_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve exited with status {server.returncode}: {server.stderr.read()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"serve did not answer /health within {SERVE_START_S:g} s")


@contextlib.contextmanager
def served(scenario: Path, *options: str) -> Iterator[str]:
    """`tokenpath serve SCENARIO --no-network-delay OPTIONS` on a free 127.0.0.1 port, in its own process,
    until the block ends: its base URL once it answers /health."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "tokenpath", "serve", str(scenario), "--port", str(port),
                               "--no-network-delay", *options],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, server)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_run(scenario: Path, url: str, folder: Path, k: int) -> dict:
    """One burst measured by bench: its summary, and when its requests were sent (monotonic ns)."""
    results, summary = folder / f"bench-{k}.jsonl", folder / f"bench-{k}.json"
    tokenpath("bench", str(scenario), "--base-url", url, "--model", MODEL, "--json", str(summary),
              "--results", str(results))
    rows = read_jsonl(results)
    t0_ns = rows[0]["t0_monotonic_ns"]
    sent_ns = np.array([row["sent_ns"] for row in rows[1:] if "sent_ns" in row], dtype=np.int64) + t0_ns
    return {"summary": json.loads(summary.read_text()), "sent_ns": sent_ns}


def served_ns(send_log: Path, runs: list[dict], key: str) -> list[np.ndarray]:
    """Each run's requests' times in serve's send log (`arrival_ns`: their handler began; `submitted_ns`:
    handed to the engine), sorted, by the run they were sent in (after its first send, before the next's)."""
    times = np.sort(np.array([line[key] for line in read_jsonl(send_log) if key in line], dtype=np.int64))
    starts = [int(run["sent_ns"].min()) for run in runs] + [np.iinfo(np.int64).max]
    return [times[(times >= a) & (times < b)] for a, b in zip(starts, starts[1:])]


def engine_alone(scenario: dict, arrivals_s: np.ndarray, input_len: int, output_len: int, folder: Path,
                 name: str) -> np.ndarray:
    """Each request's first-token time (s) from an engine that sees it at `arrivals_s` (s, in order; the
    time origin is the requests' send), with no front-end cost: the engine and the token path alone."""
    trace = folder / f"{name}.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": (t - arrivals_s[0]) * 1e3, "input_length": input_len,
                                         "output_length": output_len}) + "\n" for t in arrivals_s))
    table = json.loads(json.dumps(scenario))
    table["workload"] = {"num_requests": len(arrivals_s), "trace": {"path": str(trace), "format": "mooncake"}}
    table["delivery"] = {key: value for key, value in table["delivery"].items()
                         if key not in ("calibration", "calibrated_server")}
    table["delivery"].update(frontend_per_request=0.0, chat_template_per_request=0.0, tokenize_per_token=0.0,
                             detokenize_per_token=0.0, frame_per_event=0.0)
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(table))
    tokenpath("simulate", str(path), "--results", str(folder / f"{name}-rows.jsonl"))
    # A trace's arrivals count from its first row.
    return np.array([row["first_token_s"] for row in read_jsonl(folder / f"{name}-rows.jsonl")]) + arrivals_s[0]


def model_arrivals_s(scenario: Path, requests: int, input_len: int) -> np.ndarray:
    """When the simulated front end hands a burst's requests to the engine: the model's own FrontEnd
    (delivery/frontend.py) on the calibrated costs, every request arriving at t = 0, before any step's
    tokens are ready."""
    loaded = load_scenario(str(scenario))
    last_mile = LastMile(loaded.resolved_delivery(), layout(loaded, 1))
    return np.array([w.done_ns for w in last_mile.requests([0] * requests, [input_len] * requests)]) / 1e9


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024, help="the engine's tokens per step")
    parser.add_argument("--repeats", type=int, default=5, help="bursts measured by bench (medians kept)")
    parser.add_argument("--calibration", help="a file from `tokenpath calibrate delivery` (default: measure now)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        calibration = Path(args.calibration).resolve() if args.calibration else folder / "delivery-calibration.toml"
        calibrate_s = None
        if not args.calibration:
            start = time.perf_counter()
            tokenpath("calibrate", "delivery", "--out", str(calibration))
            calibrate_s = time.perf_counter() - start
        table = scenario_table(args.requests, args.input_len, args.output_len, args.max_num_batched_tokens,
                               str(calibration))
        scenario = folder / "burst.toml"
        scenario.write_text(tomli_w.dumps(table))

        send_log = folder / "send.jsonl"
        with served(scenario, "--send-log", str(send_log)) as url:
            runs = [bench_run(scenario, url, folder, k) for k in range(args.repeats)]
        handlers, submitted = served_ns(send_log, runs, "arrival_ns"), served_ns(send_log, runs, "submitted_ns")

        tokenpath("simulate", str(scenario), "--json", str(folder / "sim.json"))
        sim = json.loads((folder / "sim.json").read_text())
        sim_engine_s = model_arrivals_s(scenario, args.requests, args.input_len)

        # The engine alone, seeing requests when serve's engine got them in the burst with the median TTFT
        # p50, from its send (a burst's requests leave within a few milliseconds: their median is the origin).
        p50s = [run["summary"]["latency_s"]["ttft"]["p50"] for run in runs]
        middle = int(np.argsort(p50s)[len(p50s) // 2])
        served_s = (submitted[middle] - int(np.median(runs[middle]["sent_ns"]))) / 1e9
        replay_ttft_s = engine_alone(table, served_s, args.input_len, args.output_len, folder, "serve-arrivals")
        load_after = os.getloadavg()

    def median_of(path: list[str]) -> float:
        values = []
        for run in runs:
            value = run["summary"]
            for key in path:
                value = value[key]
            values.append(value)
        return statistics.median(values)

    measured = {"ttft_p50_s": median_of(["latency_s", "ttft", "p50"]),
                "ttft_p90_s": median_of(["latency_s", "ttft", "p90"]),
                "tpot_p50_s": median_of(["latency_s", "tpot", "p50"])}
    latency = sim["latency_s"]
    predicted = {"ttft_p50_s": latency["ttft"]["p50"], "ttft_p90_s": latency["ttft"]["p90"],
                 "tpot_p50_s": latency["tpot"]["p50"]}
    detail = sim["attribution_s"]["delivery_detail"]
    ratio = measured["ttft_p50_s"] / predicted["ttft_p50_s"]
    serve_front = []
    for run, began, got in zip(runs, handlers, submitted):
        sent_ns = int(np.median(run["sent_ns"]))
        began_s, got_s = (began - sent_ns) / 1e9, (got - sent_ns) / 1e9
        serve_front.append({"requests": len(got), "first_handler_s": began_s[0], "last_handler_s": began_s[-1],
                            "first_to_engine_s": got_s[0], "median_to_engine_s": float(np.median(got_s)),
                            "last_to_engine_s": got_s[-1]})
    result = {
        "benchmark": "serve_burst", "python": platform.python_version(), "cpus": os.cpu_count(),
        "requests": args.requests, "input_len": args.input_len, "output_len": args.output_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "repeats": args.repeats, "calibrate_s": calibrate_s, "wall_s": time.perf_counter() - started,
        "bench": measured, "bench_runs_ttft_p50_s": p50s,
        "bench_client": [run["summary"]["bench"]["client"] for run in runs],
        "simulate": predicted,
        "simulate_front_end_mean_s": {"wait": detail["frontend_queue"], "work": detail["frontend_work"]},
        "simulate_engine_arrivals_s": {"first": float(sim_engine_s.min()), "median": float(np.median(sim_engine_s)),
                                       "last": float(sim_engine_s.max())},
        "serve_front_end_s": serve_front,
        "engine_on_serve_arrivals": {"ttft_p50_s": float(np.median(replay_ttft_s)),
                                     "ttft_p90_s": float(np.percentile(replay_ttft_s, 90)), "run": middle},
        "load_average": {"before": load_before, "after": load_after},
        # serve counts the prompt with the tokenizer bench builds it with: the same work on both sides
        "serve_prompt_tokens_mean": [run["summary"]["bench"]["server_prompt_tokens_mean"] for run in runs],
        "output_tokens_mean": [run["summary"]["requests"]["output_tokens_mean"] for run in runs],
        "ttft_p50_ratio": ratio, "within_claim": abs(ratio - 1) <= CLAIM,
    }

    print(f"{args.requests} requests at once, input {args.input_len}, output {args.output_len} tokens, {MODEL} on "
          f"1 H100 (TP 1, {args.max_num_batched_tokens} tokens a step), loopback; {args.repeats} bursts on "
          f"{result['cpus']} CPUs, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'':30s} {'TTFT p50':>10s} {'TTFT p90':>10s} {'TPOT p50':>10s}")
    for label, row in (("bench against serve (median)", measured), ("simulate, calibrated", predicted)):
        print(f"  {label:28s} {ms(row['ttft_p50_s'])} {ms(row['ttft_p90_s'])} {ms(row['tpot_p50_s'])}")
    replay = result["engine_on_serve_arrivals"]
    print(f"  {'engine on serve arrivals':28s} {ms(replay['ttft_p50_s'])} {ms(replay['ttft_p90_s'])}")
    print(f"bench TTFT p50 per burst: {', '.join(ms(p).strip() for p in p50s)}")
    print(f"simulated front end, mean per request: wait {ms(detail['frontend_queue']).strip()}, "
          f"work {ms(detail['frontend_work']).strip()}")
    engine = result["simulate_engine_arrivals_s"]
    print(f"simulated front end passes requests to the engine from {ms(engine['first']).strip()} to "
          f"{ms(engine['last']).strip()} (median {ms(engine['median']).strip()}) after they were sent")
    for k, front in enumerate(serve_front):
        began, got = (ms(front[f"{key}_handler_s"]).strip() for key in ("first", "last")), \
            [ms(front[f"{key}_to_engine_s"]).strip() for key in ("first", "median", "last")]
        print(f"serve, burst {k + 1}: handlers began from {' to '.join(began)}; handed to the engine from {got[0]} "
              f"to {got[2]} (median {got[1]})")
    for k, client in enumerate(result["bench_client"]):
        lag, threshold = ms(client["loop_lag_s"]["p99"]).strip(), ms(client["lag_threshold_s"]).strip()
        print(f"bench client, burst {k + 1}: CPU {client['cpu_busy_fraction']:.0%} busy, "
              f"{client['cpu_wait_fraction']:.0%} waiting for a CPU, loop lag p99 {lag} (threshold {threshold}), "
              f"saturated: {client['saturated']}")
    print(f"serve counted {', '.join(f'{t:g}' for t in result['serve_prompt_tokens_mean'])} prompt tokens and "
          f"streamed {', '.join(f'{t:g}' for t in result['output_tokens_mean'])} tokens per request")
    verdict = "holds" if result["within_claim"] else "does not hold"
    print(f"TTFT p50 ratio bench / simulate: {ratio:.3f} (the {CLAIM:.0%} claim {verdict})")
    print(f"whole run {result['wall_s']:.1f} s" + (f", calibration {calibrate_s:.1f} s" if calibrate_s else ""))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
