"""Write catalog/gemm_efficiency.csv: how fast a weight GEMM's multiply runs by its shape, relative to the
chip's large GEMMs, from AIConfigurator's measured GEMM tables.

The model runs a GEMM's FLOPs at the chip's measured large-GEMM rate (catalog/chips.toml's MAMF) times the
serving fraction. A tensor-parallel split narrows each GPU's GEMMs (Llama 3.1 70B's QKV projection is
10,240 outputs wide on one GPU, 1,280 on each of eight), and a prompt step's M is its tokens: narrow or
short GEMMs fill fewer of the chip's tiles and waves. `aiconfigurator-core` publishes each serving
engine's measured GEMM latencies per chip (`systems/data/<chip>/gemm/<engine>/<version>/gemm_perf.parquet`;
the newest version of each engine). For every GEMM of its grid with M of at least MIN_M, this takes:

- the compute time the model's own GEMM time needs to equal the measured latency: the latency less the
  chip's fixed time per GEMM (`measured_gemm_fixed`), then the p-norm the model blends compute and
  memory with (efficiency.GEMM_OVERLAP_NORM, p = 2) inverted against the weights and activations
  streamed at the chip's `measured_stream_bw`: compute = (t^p - memory^p)^(1/p);
- its rate, 2 M N K over that time, relative to the table's own large-GEMM rate (the REFERENCE_QUANTILE of
  its GEMMs with M, N and K all at least LARGE), which stands where MAMF stands for the chip.

A GEMM whose latency is within MEMORY_BOUND of its memory time says little about its multiply: it
takes the efficiency of the same N and K at the next M up. The file holds, for each chip, engine
and precision the tables measure, the efficiency at each M of M_GRID and each N and K of the table's
grid from MIN_WIDTH (compute/gemm_efficiency.py interpolates in log M, log N and log K).

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_gemm_efficiency.py [--data PATH/systems/data] [--out PATH]

Not a speed claim: it writes catalog data from its source. tests/test_gemm_efficiency.py checks the
shipped file against the tables when aiconfigurator-core is installed.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import pandas as pd
from aiconfigurator_stream_bw import CHIPS, default_data, newest_gemm_table

from tokenpath.compute.chip import load_chip
from tokenpath.compute.efficiency import GEMM_OVERLAP_NORM
from tokenpath.compute.precision import PRECISION_BYTES

ENGINES = ("vllm", "sglang", "trtllm")
# The tables' dtypes for the catalog's precisions (per-tensor fp8; NVFP4 for fp4 on Blackwell).
DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}
M_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384)
MIN_M = M_GRID[0]
# The N and K kept, of the tables' grid: from a TP8 shard of 8 KV heads of 128 (256 wide) up, about 1.5x apart.
WIDTHS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 65536)
LARGE = 4096           # the reference's GEMMs: M, N and K at least this
REFERENCE_QUANTILE = 0.9
MEMORY_BOUND = 1.5     # latency within this multiple of the memory time: memory-bound
ACTIVATION_BYTES = 2   # the inputs' and outputs' bytes, as the model counts them (activation_bytes)
OUT = Path(__file__).resolve().parent.parent / "src" / "tokenpath" / "catalog" / "gemm_efficiency.csv"


def efficiencies(df: pd.DataFrame, precision: str, stream_Bps: float, fixed_s: float) -> pd.DataFrame | None:
    """Each GEMM of M_GRID's efficiency (columns m, n, k, efficiency), or None if the table has no reference."""
    df = df[(df.m.isin(M_GRID)) | ((df.m >= LARGE) & (df.n >= LARGE) & (df.k >= LARGE))]
    m, n, k = (df[c].to_numpy(float) for c in ("m", "n", "k"))
    seconds = df.latency.to_numpy(float) * 1e-3 - fixed_s  # the tables hold milliseconds
    memory_s = (n * k * PRECISION_BYTES[precision] + (m * k + m * n) * ACTIVATION_BYTES) / stream_Bps
    p = GEMM_OVERLAP_NORM
    compute_s = np.where(seconds > MEMORY_BOUND * memory_s,
                         np.power(np.maximum(seconds ** p - memory_s ** p, 0.0), 1.0 / p), np.nan)
    rate = 2.0 * m * n * k / compute_s
    large = (m >= LARGE) & (n >= LARGE) & (k >= LARGE) & np.isfinite(rate)
    if not large.any():
        return None
    reference = float(np.quantile(rate[large], REFERENCE_QUANTILE))
    out = pd.DataFrame({"m": m, "n": n, "k": k, "efficiency": rate / reference})
    out = out[out.m.isin(M_GRID) & out.n.isin(WIDTHS) & out.k.isin(WIDTHS)]
    cube = out.groupby(["m", "n", "k"]).efficiency.median()
    values = cube.reindex(pd.MultiIndex.from_product([M_GRID, WIDTHS, WIDTHS], names=["m", "n", "k"]))
    grid = values.to_numpy().reshape(len(M_GRID), len(WIDTHS), len(WIDTHS))
    # A memory-bound GEMM takes the efficiency of the next M up (M beyond the table's, its largest), then
    # of the next N, then of the next K: a narrow GEMM with few inputs stays memory-bound at every M.
    for axis in (0, 1, 2):
        grid = _fill_from_above(grid, axis)
    return pd.DataFrame([(m, n, k, grid[a, b, c]) for a, m in enumerate(M_GRID) for b, n in enumerate(WIDTHS)
                         for c, k in enumerate(WIDTHS)], columns=["m", "n", "k", "efficiency"])


def _fill_from_above(grid: np.ndarray, axis: int) -> np.ndarray:
    """Each missing value along `axis` from the next present one above it, else the last present below."""
    moved = np.moveaxis(grid.copy(), axis, 0)
    for j in range(len(moved) - 2, -1, -1):
        moved[j] = np.where(np.isnan(moved[j]), moved[j + 1], moved[j])
    for j in range(1, len(moved)):
        moved[j] = np.where(np.isnan(moved[j]), moved[j - 1], moved[j])
    return np.moveaxis(moved, 0, axis)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = args.data or default_data()
    rows, sources = [], []
    for folder, chip_name in CHIPS.items():
        chip = load_chip(chip_name)
        for engine in ENGINES:
            table = newest_gemm_table(data / folder / "gemm" / engine)
            if table is None:
                continue
            df = pd.read_parquet(table)
            for precision, dtype in DTYPES.items():
                if precision not in chip.peak_flops:
                    continue
                found = efficiencies(df[df.gemm_dtype == dtype], precision, chip.effective_hbm_bw_Bps,
                                     chip.gemm_fixed_s)
                if found is None:
                    continue
                source = f"{folder}/gemm/{engine}/{table.parent.name}"
                wide = found.pivot_table(index=["m", "n"], columns="k", values="efficiency", dropna=False)
                for (m, n), values in wide.reindex(columns=list(WIDTHS)).iterrows():
                    cells = ["" if np.isnan(e) else f"{e:.3g}" for e in values]
                    if any(cells):
                        rows.append((chip_name, engine, precision, int(m), int(n), *cells))
                if source not in sources:
                    sources.append(source)
                print(f"{chip_name:6} {engine:7} {precision:5} {source}: {found.efficiency.notna().sum()} GEMMs")
    with open(args.out, "w", newline="") as out:
        out.write("# A weight GEMM's multiply rate by its shape on one GPU (M tokens, N outputs, one column per K\n"
                  "# inputs), relative to its table's large GEMMs (M, N, K >= 4096: the 0.9 quantile), the memory\n"
                  "# time and fixed time the model adds taken out. Source: AIConfigurator's measured GEMM tables\n"
                  "# (aiconfigurator-core 0.12.0, systems/data/<table>/gemm_perf.parquet):\n")
        for source in sources:
            out.write(f"#   {source}\n")
        out.write("# Written by benchmarks/aiconfigurator_gemm_efficiency.py; read by compute/gemm_efficiency.py.\n")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(("chip", "engine", "precision", "m", "n", *(f"k{k}" for k in WIDTHS)))
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
