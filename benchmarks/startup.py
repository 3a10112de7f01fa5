"""How long the command line takes before it simulates: `tokenpath run` end to end, and the import alone.

Usage: python benchmarks/startup.py [--repeats 7] [--src PATH]

Each command runs `repeats` times in a fresh Python process; the median wall time and the median CPU time
(user + system of the child, steadier on a shared machine) are printed. `--src` runs another checkout's
`src` folder instead of the installed package, so two trees can be compared in one sitting.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "import tokenpath.cli": ["-c", "import tokenpath.cli"],
    "tokenpath run": ["-m", "tokenpath", "run"],
}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one child process running `python ARGV`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--src", help="a checkout's src folder to run instead of the installed package")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([args.src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name, argv in COMMANDS.items():
        runs = [timed(argv, env) for _ in range(args.repeats)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:22s} wall {wall:.2f} s  CPU {cpu:.2f} s  (median of {args.repeats})")


if __name__ == "__main__":
    main()
