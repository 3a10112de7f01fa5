"""The HBM bandwidth decode-sized GEMMs sustain on each chip, from AIConfigurator's measured GEMM tables.

A decode step of a dense model streams its weights through GEMMs whose M is the step's few sequences.
`aiconfigurator-core` publishes each serving engine's measured GEMM latencies per chip
(`systems/data/<chip>/gemm/<engine>/<version>/gemm_perf.parquet`). For every bf16 GEMM of M <= 16
whose weights are at least 64 MB (so that a kernel's fixed cost is a few percent of it), this prints
the bandwidth it sustained, weight bytes / (latency - efficiency.KERNEL_FIXED_S), as a fraction of the
chip's peak, per engine table and as the median over all of them: the `measured_stream_bw` of
catalog/chips.toml is that median x the chip's peak.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_stream_bw.py [--data PATH/systems/data]

Not a speed claim: it reproduces a catalog figure from its source.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

import pandas as pd

from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import KERNEL_FIXED_S

CHIPS = {"a100_sxm": "a100", "h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
MAX_M = 16                  # decode-sized: a step of up to 16 sequences
MIN_WEIGHT_BYTES = 64e6     # the fixed cost per kernel is under ~5% of streaming this much
BF16_BYTES = 2


def default_data() -> Path:
    try:
        return Path(str(resources.files("aiconfigurator_core") / "systems" / "data"))
    except ModuleNotFoundError:
        sys.exit("aiconfigurator-core is not installed: pip install aiconfigurator-core, or pass --data PATH")


def stream_fractions(table: Path, peak_Bps: float) -> list[float]:
    """Each qualifying GEMM's sustained bandwidth over the chip's peak."""
    df = pd.read_parquet(table)
    df = df[(df.gemm_dtype == "bfloat16") & (df.m <= MAX_M)]
    df = df[df.n * df.k * BF16_BYTES >= MIN_WEIGHT_BYTES]
    weight_bytes = df.n * df.k * BF16_BYTES
    seconds = df.latency * 1e-3 - KERNEL_FIXED_S   # the tables hold milliseconds
    return list(weight_bytes / seconds / peak_Bps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    for folder, chip_name in CHIPS.items():
        peak = load_chip(chip_name).hbm_bw_Bps
        every = []
        for table in sorted((data / folder / "gemm").glob("*/*/gemm_perf.parquet")):
            fractions = stream_fractions(table, peak)
            if fractions:
                every += fractions
                print(f"  {folder}/{table.parent.parent.name} {table.parent.name}: {len(fractions)} GEMMs, "
                      f"median {statistics.median(fractions):.3f}")
        if every:
            median = statistics.median(every)
            print(f"{chip_name}: median {median:.3f} of {peak / 1e12:g} TB/s = {median * peak / 1e12:.2f} TB/s "
                  f"over {len(every)} GEMMs")


if __name__ == "__main__":
    main()
