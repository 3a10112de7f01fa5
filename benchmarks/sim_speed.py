"""How fast simulate runs: simulated requests per wall-second on the default scenario.

Usage: python benchmarks/sim_speed.py [--sizes 10000 100000] [--repeats 3] [--json PATH]

Each size is simulated `repeats` times; the median wall time is reported (the machine is shared and
noisy). Workload drawing and result building are included: this is what `tokenpath simulate` costs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from tokenpath.sim.document import result_document
from tokenpath.sim.scenario import load_scenario
from tokenpath.sim.simulate import simulate


def measure(num_requests: int, repeats: int) -> dict:
    scenario = load_scenario("typical", {"workload.num_requests": num_requests})
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        sim = simulate(scenario)
        result_document(sim)
        walls.append(time.perf_counter() - start)
    wall = statistics.median(walls)
    return {
        "num_requests": num_requests,
        "wall_s_median": wall,
        "wall_s_all": walls,
        "requests_per_wall_s": num_requests / wall,
        "steps": int(sum(len(t.step_start_ns) for t in sim.traces)),
        "simulated_s": sim.run.e2e_ns.max() / 1e9 + sim.run.sent_ns.max() / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    rows = [measure(n, args.repeats) for n in args.sizes]
    print(f"{'requests':>10} {'median wall':>12} {'req/wall-s':>12} {'steps':>9} {'simulated':>10}")
    for r in rows:
        print(f"{r['num_requests']:>10,} {r['wall_s_median']:>11.2f}s {r['requests_per_wall_s']:>12,.0f} "
              f"{r['steps']:>9,} {r['simulated_s']:>9.0f}s")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump({"benchmark": "sim_speed", "python": platform.python_version(), "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
