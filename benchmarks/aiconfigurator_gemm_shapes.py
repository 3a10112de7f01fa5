"""How fast a tensor-parallel split's weight GEMMs run by their shape, from AIConfigurator's measured GEMM
tables, beside the chip's one serving rate for a precision.

A tensor-parallel split narrows each GPU's weight GEMMs: Llama 3.1 70B's QKV projection is 10,240 outputs
wide on one GPU and 1,280 on each of eight. `aiconfigurator-core` publishes vLLM's measured GEMM latencies
per chip (`systems/data/<chip>/gemm/vllm/<version>/gemm_perf.parquet`). For the four weight GEMMs of a
Llama 3.1 70B layer (QKV, output, gate-up, down) at TP1 to TP8 this reads each one's rate, 2 M N K /
latency, at M tokens from the table's grid of N and K (interpolated in log N and log K), and prints the
layer's rate (its FLOPs over the sum of the four GEMMs' times) beside the chip's serving rate for the
precision (`ChipSpec.effective_flops`: the serving fraction of the chip's measured matmul rate, which the
model scales by each GEMM's shape efficiency: aiconfigurator_gemm_efficiency.py). docs/validation.md
("A weight GEMM's rate by its shape") quotes the H100's fp8 rows at M = 1,024.

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_gemm_shapes.py [--m 1024] [--data PATH/systems/data]

An accuracy check of one part of a prompt step, not a speed claim.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from aiconfigurator_stream_bw import CHIPS, default_data, newest_gemm_table
from scipy.interpolate import RegularGridInterpolator

from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model

# The tables' dtypes for the catalog's precisions (per-tensor fp8).
DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
TP_SIZES = (1, 2, 4, 8)


def layer_shapes(model_name: str, tp: int) -> list[tuple[str, int, int]]:
    """(name, N outputs, K inputs) of a dense layer's four weight GEMMs on one of `tp` GPUs."""
    model = load_model(model_name)
    h, d = model.hidden_size, model.head_dim
    heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
    inter = model.intermediate_size // tp
    return [("qkv", (heads + 2 * kv_heads) * d, h), ("o", h, heads * d), ("gate_up", 2 * inter, h),
            ("down", h, inter)]


def rate_grid(df: pd.DataFrame, m: int) -> RegularGridInterpolator | None:
    """TFLOP/s by (log N, log K) of a table's GEMMs of `m` tokens, over the grid's full rows and columns."""
    rows = df[df.m == m]
    if rows.empty:
        return None
    rows = rows.assign(tflops=2 * rows.m * rows.n * rows.k / (rows.latency * 1e-3) / 1e12)  # milliseconds
    grid = rows.pivot_table(index="n", columns="k", values="tflops").dropna(axis=0, how="any").dropna(axis=1, how="any")
    return RegularGridInterpolator((np.log(grid.index.to_numpy(float)), np.log(grid.columns.to_numpy(float))),
                                   grid.to_numpy())


def layer_tflops(grid: RegularGridInterpolator, shapes: list[tuple[str, int, int]]) -> tuple[float, dict[str, float]]:
    """The layer's rate (FLOPs over time) and each GEMM's, read at its shape (clamped to the grid's edges)."""
    n_axis, k_axis = grid.grid
    rates = {}
    for name, n, k in shapes:
        point = (float(np.clip(np.log(n), n_axis[0], n_axis[-1])), float(np.clip(np.log(k), k_axis[0], k_axis[-1])))
        rates[name] = float(grid([point])[0])
    flops = {name: n * k for name, n, k in shapes}
    return sum(flops.values()) / sum(flops[name] / rates[name] for name in flops), rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="aiconfigurator-core's systems/data folder")
    parser.add_argument("--m", type=int, default=1024, help="tokens of the GEMMs read (a row of the tables' grid)")
    parser.add_argument("--model", default="llama-3.1-70b")
    args = parser.parse_args()
    data = args.data or default_data()
    for folder, chip_name in CHIPS.items():
        chip = load_chip(chip_name)
        path = newest_gemm_table(data / folder / "gemm" / "vllm")
        if path is None:
            continue
        df = pd.read_parquet(path)
        for precision, dtype in DTYPES.items():
            grid = rate_grid(df[df.gemm_dtype == dtype], args.m)
            if grid is None or precision not in chip.peak_flops:
                continue
            model_tflops = chip.effective_flops(precision) / 1e12
            cells = []
            for tp in TP_SIZES:
                layer, rates = layer_tflops(grid, layer_shapes(args.model, tp))
                cells.append(f"TP{tp} {layer:,.0f} (qkv {rates['qkv']:,.0f})")
            print(f"{chip_name:6} {precision:5} vLLM {path.parent.name:7} M {args.m}: {'; '.join(cells)}; "
                  f"the chip's serving rate {model_tflops:,.0f}")


if __name__ == "__main__":
    main()
