"""Large-GEMM rates on each chip from AIConfigurator's measured GEMM tables, beside the chip's catalog figure.

ml-engineering's MAMF (the best rate over a sweep of large GEMMs) gives catalog/chips.toml its
`measured_matmul_tflops`; it publishes no bf16 figure for the H200 and no fp4 figure for any chip.
`aiconfigurator-core` publishes each serving engine's measured GEMM latencies per chip
(`systems/data/<chip>/gemm/<engine>/<version>/gemm_perf.parquet`). For every GEMM of a precision (bf16,
fp8 with one scale per tensor, nvfp4 for fp4) with M, N and K all at least 2048 this takes the rate it
reached, 2 M N K / latency; per table it prints the 90th percentile of those rates, and per chip the
median over its tables next to the catalog's figure. Where MAMF is published, bf16 agrees within 8%
(A100 and H100 within 1%); the H200's bf16 and the B200's and GB200's fp4 `measured_matmul_tflops` are
this median. fp8's MAMF stays in the catalog though the engines' GEMMs reach less of it (the median p90
is 8% under MAMF on H200, 14% on H100, 20-21% on B200 and GB200): the serving fraction the latency rows
were fitted with multiplies MAMF, and these medians in its place moved `validate --group latency` from
17.6% to 18.1% TTFT (NIM's fp8 rows on H100 from 8.8% to 16.3%) and AIConfigurator's held-out runs from
28.5% / 10.9% to 28.4% / 10.6%, with the fraction left as fitted.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_matmul.py [--data PATH/systems/data]

Not a speed claim: it reproduces a catalog figure from its source.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd
from aiconfigurator_stream_bw import CHIPS, default_data

from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import SERVING_GEMM_FRACTION

MIN_DIMENSION = 2048   # large, well-shaped: each of M, N and K at least this
PERCENTILE = 0.9       # near the best rate, as MAMF is, without one table's outlier


# The tables' dtype for each catalog precision.
DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}


def large_gemm_tflops(table: Path, dtype: str) -> pd.Series:
    """The TFLOP/s of each large GEMM of `dtype` in one engine's table."""
    df = pd.read_parquet(table)
    df = df[(df.gemm_dtype == dtype) & (df.m >= MIN_DIMENSION) & (df.n >= MIN_DIMENSION) & (df.k >= MIN_DIMENSION)]
    return 2 * df.m * df.n * df.k / (df.latency * 1e-3) / 1e12   # the tables hold milliseconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    for folder, chip_name in CHIPS.items():
        chip = load_chip(chip_name)   # matmul_efficiency holds the serving fraction too
        for precision, dtype in DTYPES.items():
            rates = []
            for table in sorted((data / folder / "gemm").glob("*/*/gemm_perf.parquet")):
                tflops = large_gemm_tflops(table, dtype)
                if len(tflops):
                    rates.append(float(tflops.quantile(PERCENTILE)))
                    print(f"  {folder}/{table.parent.parent.name} {table.parent.name} {dtype}: {len(tflops)} GEMMs, "
                          f"p90 {rates[-1]:.0f} TFLOP/s")
            if rates and precision in chip.peak_flops:
                catalog_tflops = (chip.peak_flops[precision] * chip.matmul_efficiency[precision]
                                  / SERVING_GEMM_FRACTION / 1e12)
                print(f"{chip_name} {precision}: median of the tables' p90 {statistics.median(rates):.0f} TFLOP/s; "
                      f"catalog/chips.toml {catalog_tflops:.1f}")


if __name__ == "__main__":
    main()
