"""The HBM bandwidth decode-sized GEMMs sustain on each chip, and the fixed time each such GEMM adds,
from AIConfigurator's measured GEMM tables.

A decode step of a dense model streams its weights through GEMMs whose M is the step's few sequences.
`aiconfigurator-core` publishes each serving engine's measured GEMM latencies per chip
(`systems/data/<chip>/gemm/<engine>/<version>/gemm_perf.parquet`). The model times such a GEMM as a
fixed cost plus its weights streamed at the chip's bandwidth; this fits both to every bf16 GEMM of
M <= 16 whose weights are at least 1 MB (a router of 4096 x 128, the smallest decode GEMM of the
catalog's models at tensor-parallel 8), each table on its own, by the least mean |log(model / measured)|
(so that a 2 MB GEMM counts as much as a 2 GB one). It prints each table's pair and the chip's medians
over its tables: catalog/chips.toml's `measured_stream_bw` and `measured_gemm_fixed` are those
medians, and the H100's fixed time is compute/efficiency.GEMM_FIXED_S, the default of chips that
AIConfigurator does not measure. Last, the model's median |error| over the chip's GEMMs under the
fitted pair and under a fixed cost of efficiency.KERNEL_FIXED_S with the bandwidth fitted alone.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_stream_bw.py [--data PATH/systems/data]

Not a speed claim: it reproduces catalog figures from their source.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from packaging.version import Version
from scipy import optimize

from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import KERNEL_FIXED_S

CHIPS = {"a100_sxm": "a100", "h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
MAX_M = 16                  # decode-sized: a step of up to 16 sequences
MIN_WEIGHT_BYTES = 1e6      # a router of 4096 x 128 bf16 weights
BF16_BYTES = 2


def default_data() -> Path:
    try:
        return Path(str(resources.files("aiconfigurator_core") / "systems" / "data"))
    except ModuleNotFoundError:
        sys.exit("aiconfigurator-core is not installed: pip install aiconfigurator-core, or pass --data PATH")


def newest_gemm_table(folder: Path) -> Path | None:
    """The newest release's GEMM table under an engine's folder (`<chip>/gemm/<engine>`), by version."""
    tables = list(folder.glob("*/gemm_perf.parquet"))
    return max(tables, key=lambda path: Version(path.parent.name)) if tables else None


def decode_gemms(table: Path) -> tuple[np.ndarray, np.ndarray]:
    """Weight bytes and measured seconds of one engine table's decode-sized bf16 GEMMs."""
    df = pd.read_parquet(table)
    df = df[(df.gemm_dtype == "bfloat16") & (df.m <= MAX_M)]
    df = df[df.n * df.k * BF16_BYTES >= MIN_WEIGHT_BYTES]
    return (df.n * df.k * BF16_BYTES).to_numpy(float), df.latency.to_numpy(float) * 1e-3  # tables hold ms


def log_error(fixed_s: float, bw_Bps: float, weight_bytes: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """|log(model / measured)| of each GEMM under a fixed time and a bandwidth."""
    return np.abs(np.log((fixed_s + weight_bytes / bw_Bps) / seconds))


def fit(weight_bytes: np.ndarray, seconds: np.ndarray, fixed_s: float | None = None) -> tuple[float, float]:
    """(fixed s, bandwidth B/s) of least mean |log error|; with `fixed_s` given, the bandwidth alone."""
    def loss(x: np.ndarray) -> float:
        fixed = x[0] * 1e-6 if fixed_s is None else fixed_s
        return float(np.mean(log_error(fixed, np.exp(x[-1]), weight_bytes, seconds)))
    start = [np.log(np.median(weight_bytes / seconds))]
    best = optimize.minimize(loss, ([3.0] if fixed_s is None else []) + start, method="Nelder-Mead",
                             options={"xatol": 1e-5, "fatol": 1e-9, "maxiter": 4000})
    return (best.x[0] * 1e-6 if fixed_s is None else fixed_s), float(np.exp(best.x[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    data = parser.parse_args().data or default_data()
    for folder, chip_name in CHIPS.items():
        peak = load_chip(chip_name).hbm_bw_Bps
        fixed, bandwidth, every = [], [], []
        for table in sorted((data / folder / "gemm").glob("*/*/gemm_perf.parquet")):
            weight_bytes, seconds = decode_gemms(table)
            if len(seconds) == 0:
                continue
            fixed_s, bw_Bps = fit(weight_bytes, seconds)
            fixed.append(fixed_s)
            bandwidth.append(bw_Bps)
            every.append((weight_bytes, seconds))
            print(f"  {folder}/{table.parent.parent.name} {table.parent.name}: {len(seconds)} GEMMs, "
                  f"{fixed_s * 1e6:.2f} us + weights at {bw_Bps / peak:.3f} of peak")
        if not every:
            continue
        fixed_s, bw_Bps = statistics.median(fixed), statistics.median(bandwidth)
        weight_bytes, seconds = (np.concatenate(parts) for parts in zip(*every, strict=True))
        _, bw_alone = fit(weight_bytes, seconds, KERNEL_FIXED_S)
        joint = np.median(np.expm1(log_error(fixed_s, bw_Bps, weight_bytes, seconds)))
        alone = np.median(np.expm1(log_error(KERNEL_FIXED_S, bw_alone, weight_bytes, seconds)))
        print(f"{chip_name}: measured_gemm_fixed {fixed_s * 1e6:.2f} us, measured_stream_bw {bw_Bps / 1e12:.3f} TB/s "
              f"({bw_Bps / peak:.3f} of {peak / 1e12:g}); median |error| over {len(seconds)} GEMMs {joint:.1%}, "
              f"against {alone:.1%} at {KERNEL_FIXED_S * 1e6:g} us a kernel")


if __name__ == "__main__":
    main()
