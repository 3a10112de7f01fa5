"""How fast a weight GEMM's multiply runs by its shape, relative to the chip's large GEMMs.

The chip's measured matmul rate (catalog/chips.toml's MAMF) is what large, well-shaped GEMMs reach. A
serving step's GEMMs are M tokens by a tensor-parallel shard of N outputs over K inputs: narrow or
short ones fill fewer of the chip's tiles and waves (Llama 3.1 70B's QKV projection is 1,280 outputs
wide on each of eight GPUs, 10,240 on one). catalog/gemm_efficiency.csv holds, for each chip, engine
and precision AIConfigurator measured, the multiply's rate at each M, N and K of a grid relative to
its table's large GEMMs, the memory and fixed times the model adds to a GEMM taken out (written by
benchmarks/aiconfigurator_gemm_efficiency.py, which says how). A GEMM between the grid's points takes
the efficiency interpolated in log M, log N and log K, and beyond its edges the edge's.

A chip, engine or precision the file does not hold runs every GEMM at its chip's one rate.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

FILE = "gemm_efficiency.csv"


@dataclass(frozen=True)
class ShapeCurve:
    """One GEMM's efficiency by its M (N and K fixed): at each of `log_m` (ascending), `efficiency`."""

    log_m: tuple[float, ...]
    efficiency: tuple[float, ...]

    def at(self, m: float) -> float:
        """The efficiency at M tokens: interpolated in log M (as np.interp does, which costs more than the
        rest of a GEMM's time on one number: a step of a new size reads every GEMM's), the edge's beyond
        the grid."""
        log_m, efficiency = self.log_m, self.efficiency
        x = math.log(m) if m > 0 else log_m[0]
        if x <= log_m[0]:
            return efficiency[0]
        if x >= log_m[-1]:
            return efficiency[-1]
        j = bisect.bisect_right(log_m, x) - 1
        slope = (efficiency[j + 1] - efficiency[j]) / (log_m[j + 1] - log_m[j])
        return slope * (x - log_m[j]) + efficiency[j]


@dataclass(frozen=True)
class ShapeTable:
    """One chip's, engine's and precision's efficiencies on a grid of M, N and K (logs ascending)."""

    log_m: np.ndarray
    log_n: np.ndarray
    log_k: np.ndarray
    efficiency: np.ndarray  # [m, n, k]

    def curve(self, n: float, k: float) -> ShapeCurve:
        """The efficiency by M of a GEMM N wide over K inputs: bilinear in log N and log K."""
        (n0, n1, wn), (k0, k1, wk) = _bracket(self.log_n, n), _bracket(self.log_k, k)
        e = self.efficiency
        values = ((1 - wn) * ((1 - wk) * e[:, n0, k0] + wk * e[:, n0, k1])
                  + wn * ((1 - wk) * e[:, n1, k0] + wk * e[:, n1, k1]))
        return ShapeCurve(tuple(self.log_m.tolist()), tuple(float(v) for v in values))


def _bracket(axis: np.ndarray, value: float) -> tuple[int, int, float]:
    """The grid points either side of `value` (by its log) and its weight on the upper; clamped at the ends."""
    x = math.log(max(value, 1.0))
    if x <= axis[0]:
        return 0, 0, 0.0
    if x >= axis[-1]:
        last = len(axis) - 1
        return last, last, 0.0
    j = int(np.searchsorted(axis, x, side="right"))
    return j - 1, j, float((x - axis[j - 1]) / (axis[j] - axis[j - 1]))


def shape_table(chip: str, engine: str, precision: str) -> ShapeTable | None:
    """The file's table for a catalog chip, an engine's GEMM kernels (vllm, sglang or trtllm) and a
    precision; None where it holds none."""
    return _tables().get((chip, engine, precision))


@functools.cache
def _tables() -> dict[tuple[str, str, str], ShapeTable]:
    text = resources.files("tokenpath.catalog").joinpath(FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    reader = csv.reader(lines)
    header = next(reader)
    widths = [int(name[1:]) for name in header[5:]]
    cells: dict[tuple[str, str, str], dict[tuple[int, int], Sequence[str]]] = {}
    for chip, engine, precision, m, n, *values in reader:
        cells.setdefault((chip, engine, precision), {})[int(m), int(n)] = values
    return {key: _table(grid, widths) for key, grid in cells.items()}


def _table(grid: dict[tuple[int, int], Sequence[str]], widths: list[int]) -> ShapeTable:
    """A table from its rows, (M, N) -> a value per K column: the whole grid the script writes."""
    ms, ns = sorted({m for m, _ in grid}), sorted({n for _, n in grid})
    values = np.array([[[float(v) for v in grid[m, n]] for n in ns] for m in ms])
    return ShapeTable(np.log(np.array(ms, float)), np.log(np.array(ns, float)), np.log(np.array(widths, float)),
                      values)
