"""How fast `tokenpath sweep` runs points, against the same points run one by one through the CLI.

Usage: python benchmarks/sweep_speed.py [--requests 10000] [--rates 10 20 30] [--intervals 1 4] [--json PATH]

One run does both, side by side: `tokenpath sweep` on a grid (workload.arrival.rate x
delivery.stream_interval over the default scenario, `--requests` requests a point), then each point as
its own `tokenpath simulate --set KEY=VALUE ... --json` process, one after the other.
It checks that both give the same numbers, and prints points per minute and the ratio.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import tomli_w

from tokenpath.sim.forked import available_cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0, 30.0])
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    points = [{"workload.arrival.rate": r, "delivery.stream_interval": k}
              for r, k in itertools.product(args.rates, args.intervals)]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        spec = folder / "sweep.toml"
        spec.write_text(tomli_w.dumps({
            "scenario": "typical", "overrides": {"workload.num_requests": args.requests},
            "axes": {"workload.arrival.rate": args.rates, "delivery.stream_interval": args.intervals}}))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tokenpath", "sweep", str(spec), "--out", str(folder / "r.parquet")],
                       check=True, capture_output=True)
        sweep_s = time.perf_counter() - start
        rows = {(r["workload.arrival.rate"], r["delivery.stream_interval"]): r
                for r in pq.read_table(folder / "r.parquet").to_pylist()}

        one_by_one_s = 0.0
        for point in points:
            sets = [arg for key, value in ({"workload.num_requests": args.requests} | point).items()
                    for arg in ("--set", f"{key}={value!r}")]
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tokenpath", "simulate", *sets, "--json", str(folder / "p.json")],
                           check=True, capture_output=True)
            one_by_one_s += time.perf_counter() - start
            document = json.loads((folder / "p.json").read_text())
            row = rows[(point["workload.arrival.rate"], point["delivery.stream_interval"])]
            if row["latency_s.e2e.mean"] != document["latency_s"]["e2e"]["mean"]:
                raise SystemExit(f"point {point}: sweep and simulate disagree; the comparison is not fair")

    per_min = lambda seconds: len(points) / seconds * 60  # noqa: E731
    result = {
        "benchmark": "sweep_speed", "python": platform.python_version(), "cpus": available_cpus(),
        "points": len(points), "requests_per_point": args.requests,
        "sweep_s": sweep_s, "one_by_one_s": one_by_one_s,
        "sweep_points_per_min": per_min(sweep_s), "one_by_one_points_per_min": per_min(one_by_one_s),
        "ratio": one_by_one_s / sweep_s,
    }
    print(f"{len(points)} points x {args.requests:,} requests on {result['cpus']} CPUs")
    print(f"  tokenpath sweep            {sweep_s:7.1f} s  {result['sweep_points_per_min']:6.1f} points/min")
    print(f"  simulate, one by one (CLI) {one_by_one_s:7.1f} s  {result['one_by_one_points_per_min']:6.1f} points/min")
    print(f"  ratio: {result['ratio']:.2f}x")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
