"""How each constant that the latency rows set is fitted, as code: so any subset of the rows (a fold of
the cross-validation in validate/cross.py, or all of them) gives its value the same way.

A constant's `Procedure` names it (the registry's name), the rows it is fitted on (those whose metric it
moves: a predicate over rows, read off the engine profile the row runs), the metric (TTFT or the row's
decode metric) and its bounds. Its value minimizes a loss of that metric's errors over those rows (the
median |relative error|, or for the host time per step and per eager kernel the mean |log error|: see
PROCEDURES), searched over every point of a log grid (GRID_STEP apart, within the bounds). The median
of a few rows' errors is flat in places and has many local minima in the value, so the search scans the
grid rather than narrowing one bracket (golden section, or a coarse scan refined around its best, which
stopped a point or two from the grid's best); where several points tie, the middle one wins. The fit
on every row, which the registry holds, runs its grid through the registry's value (so it checks that
the value is the fit's fixed point). A fit that predicts rows it leaves out (a fold, `held_out`) must
take nothing from the registry, which was fitted on those rows too: its grid runs through
`Procedure.held_out_start`, the geometric middle of the bounds, its first pass starts there, and a
constant none of its rows informs stays there (every point of the grid ties, and the middle wins). The
grids are fixed, so folds share simulations: `RowErrors` simulates a row once per distinct values of the
constants that reach it.

Constants interact (an SGLang row's TTFT moves with both host costs), so they are fitted one after
another in PROCEDURES' order, each with those before it at their fitted values and those after at their
values from the pass before, in passes repeated until one moves none (fit_all; the shipped rows' folds
settle in a few). One pass alone would fit each constant against the starting values of those after it
(a fold's, the middle of their bounds): one grid step in vLLM V0's two moved one fold's TTFT median from
11% to 21% (the eager host time's comment in PROCEDURES). The order: first
the eager host time per kernel (the SGLang and vLLM V0 rows' TTFT; of them only
SGLang v0.3's four, run without overlap, also pay host_step_s in their path), then TensorRT-LLM's PyTorch
backend's (its rows' TTFT; no row pays both), then host_step_s, then
vLLM V0's two host parts (its rows also pay the eager host time): its part per scheduler call on the V0
rows run one step at a time, which pay both parts every step (given the part every step, it sets their
sum), then its part every step on the rows run in multi-step windows, which pay the other once a window,
given it. In the first pass the eager host time does not depend on a fold's other values, so every
fold shares those simulations.

GROUP_PROCEDURES are fitted the same way on a group of the published rows (validate/groups.py), from a
source none of the latency rows shares: the launch gap of an eager step, on TensorRT-LLM's batch-1 TTFTs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenpath.config.assumptions import lookup
from tokenpath.config.errors import UserError
from tokenpath.engine.host_time import eager_host_paid, host_overlapped
from tokenpath.engine.profiles import PROFILES, Profile
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.forked import can_fork, map_forked
from tokenpath.validate.latency import predict_row, relative_errors, row_engine, row_error

Row = dict[str, Any]
Errors = dict[str, float]  # {"ttft": signed relative error, "decode": ...}
# A row's errors under assumption values ({registry name: value in SI}, the registry's for the rest).
Predict = Callable[[Row, Mapping[str, float]], Errors]

# Neighbouring grid points differ by 15%. A finer grid resolves nothing the median can tell: over every
# row, the median |TTFT error| moves by 1-3 points, up and down, between values of eager_host_per_kernel_s
# 10% apart (13.9%, 11.3%, 13.1%, 15.9%, 12.4% at 14.9 to 21.8 us).
GRID_STEP = 1.15
# Scores closer than this are a tie (a median that did not move).
TIE = 1e-12
# Passes of fit_all over every procedure before it gives up on settling (the shipped rows' folds take 1-3).
MAX_PASSES = 10


def median_abs_error(errors: Sequence[float]) -> float:
    """The median |relative error|: robust to the few rows a mechanism misses by far."""
    return statistics.median(abs(e) for e in errors)


def mean_abs_log_error(errors: Sequence[float]) -> float:
    """The mean |log(predicted / measured)|: every row's move counts, so a constant that moves each row
    a little has a minimum where the median of the rows is flat."""
    return statistics.fmean(abs(math.log1p(e)) for e in errors)


@dataclass(frozen=True)
class Procedure:
    """How one constant is fitted: on the rows `informs` accepts, by `metric`, within [low, high];
    `reaches` accepts every row whose prediction reads the constant at all (a superset of `informs`,
    which keys the cache: a row it rejects is simulated once whatever the value)."""

    name: str
    metric: Literal["ttft", "decode", "throughput"]
    informs: Callable[[Row], bool]
    reaches: Callable[[Row], bool]
    low: float
    high: float
    center: float | None = None  # the registry's grid's centre; None: the registry's value
    step: float = GRID_STEP
    loss: Callable[[Sequence[float]], float] = median_abs_error  # of the informing rows' errors
    origin: float | None = None  # the held-out grid's centre; None: the geometric middle of [low, high]

    def start(self) -> float:
        """The value before any fit on every row: the centre of the registry's grid (the registry's value)."""
        return lookup(self.name).value if self.center is None else self.center

    def held_out_start(self) -> float:
        """The value before any fit that predicts rows left out of it, and where no row it is fitted on
        informs the constant: the centre of its grid, which no row sets (the registry's value is the fit
        on every row, the left-out ones too)."""
        return math.sqrt(self.low * self.high) if self.origin is None else self.origin

    def grid(self, through: float | None = None) -> list[float]:
        """The values searched: through * step^i within [low, high], ascending (through: start())."""
        start, log_step = self.start() if through is None else through, math.log(self.step)
        below = math.floor(math.log(start / self.low) / log_step + 1e-9)
        above = math.floor(math.log(self.high / start) / log_step + 1e-9)
        return [start * self.step ** i for i in range(-below, above + 1)]


def _profile(row: Row) -> Profile:
    return PROFILES[row_engine(row)["scheduler"]]


def _reads_host_step(row: Row) -> bool:
    return _profile(row).pays("host_step_s")


def _host_step_in_path(row: Row) -> bool:
    """The step waits for its host time (vLLM V1 before its async scheduling, and engines run without
    the overlap, as the row's [engine] resolves it: SGLang with a drafter turns it off in some releases);
    an overlapped engine hides it behind the GPU unless its steps are shorter."""
    engine = EngineSpec.model_validate(row_engine(row))
    return _reads_host_step(row) and not host_overlapped(engine.scheduler, engine.host_overlap)


def _reads_eager_host(name: str) -> Callable[[Row], bool]:
    """Whether a row's engine pays the host time per eager kernel `name` (its profile's, unless the row
    launches from compiled code: `eager_host = false`)."""
    def reads(row: Row) -> bool:
        engine = row_engine(row)
        return eager_host_paid(engine["scheduler"], engine.get("eager_host")) == name
    return reads


def _has_eager_steps(name: str) -> Callable[[Row], bool]:
    """The engine pays the host time per kernel `name` and replays no graph for some steps (its prompts,
    at least)."""
    reads = _reads_eager_host(name)

    def has(row: Row) -> bool:
        return reads(row) and row_engine(row).get("cuda_graphs", _profile(row).cuda_graphs) != "all"
    return has


def _reads_vllm_v0_host(row: Row) -> bool:
    """The row pays vLLM V0's host time (both parts: each reaches every V0 row)."""
    return _profile(row).pays("vllm_v0_host_window_s")


def _multi_step(row: Row) -> bool:
    return row_engine(row).get("num_scheduler_steps", 1) > 1


def _vllm_v0_single_step(row: Row) -> bool:
    """A V0 row run one step at a time: every step calls the scheduler and pays both host parts."""
    return _reads_vllm_v0_host(row) and not _multi_step(row)


def _vllm_v0_multi_step(row: Row) -> bool:
    """A V0 row run in multi-step windows: its steps pay the part every step, its windows the other once."""
    return _reads_vllm_v0_host(row) and _multi_step(row)


# In the order they are fitted (the module's docstring says why).
PROCEDURES: tuple[Procedure, ...] = (
    # SGLang's and vLLM V0's host time per kernel of a step that replays no graph: their prompts run
    # eagerly, so TTFT. From about a C++ runtime's launch gap (EAGER_KERNEL_LAUNCH_S, 5.6 us) to three
    # times an eager all-reduce call on A100 hosts (41-50 us in AIConfigurator's tables,
    # docs/validation.md). By the mean |log error|, as host_step_s: the median of its 53 rows' errors is
    # flat between grid points, and its lowest point moved with the registry's values of vLLM V0's two
    # host parts (which it is fitted before): with those one grid step over, one fold's fit went from
    # 72.7 to 83.6 us, the host_step_s fitted after it from 0.575 to 0.107 ms, and that fold's TTFT
    # from 11.1% to 21.3%.
    Procedure("eager_host_per_kernel_s", "ttft", _has_eager_steps("eager_host_per_kernel_s"),
              _reads_eager_host("eager_host_per_kernel_s"), 5e-6, 150e-6, loss=mean_abs_log_error),
    # TensorRT-LLM's PyTorch backend's, over the kernels engine/eager_launches.py counts: the same
    # bounds and loss. Its rows run no engine that pays the other, so the two are fitted apart.
    Procedure("trtllm_eager_host_per_kernel_s", "ttft", _has_eager_steps("trtllm_eager_host_per_kernel_s"),
              _reads_eager_host("trtllm_eager_host_per_kernel_s"), 5e-6, 150e-6, loss=mean_abs_log_error),
    # The fixed host time per step of vLLM V1, SGLang and TensorRT-LLM, in the path of the steps of vLLM
    # V1 and of engines run without overlap: a cost per step, so TPOT / ITL. From a tenth of a
    # millisecond to above V0's 2.5 ms a step run alone. It moves each of its rows by a few percent, so
    # the median of their |errors| is flat within a point from 0.1 to 0.5 ms and its lowest point
    # jumped between folds (0.12 ms or 1.76 ms); the mean |log error| adds every row's move (lowest at
    # 0.875 ms on every row; each fold's in docs/validation.md).
    Procedure("host_step_s", "decode", _host_step_in_path, _reads_host_step, 0.1e-3, 5e-3, loss=mean_abs_log_error),
    # vLLM V0's host time per scheduler call (scheduling, preparing the inputs) and every step besides,
    # both in the step's path: TPOT / ITL. Each from a tenth of a millisecond to 10 ms: the single-step
    # V0 rows want the two to sum to about 2.5 ms, the multi-step rows (windows of 10 steps) about
    # 0.8 ms a decode step, so either part may take most of the sum.
    Procedure("vllm_v0_host_window_s", "decode", _vllm_v0_single_step, _reads_vllm_v0_host, 0.1e-3, 10e-3),
    Procedure("vllm_v0_host_step_s", "decode", _vllm_v0_multi_step, _reads_vllm_v0_host, 0.1e-3, 10e-3),
)


def _every_row(row: Row) -> bool:
    return True


# Constants fitted on a group of the published rows (validate/groups.py; the group's `fits` names its
# constant) rather than on the latency rows: a source none of the latency rows shares, so every fold of
# their cross-validation uses the value as fitted outside it.
GROUP_PROCEDURES: dict[str, Procedure] = {p.name: p for p in (
    # The GPU's gap per kernel of an eager step, where the host launches from a C++ runtime and pays no
    # time per kernel of its own: TensorRT-LLM v0.6.1's context phase at batch 1, whose short prompts'
    # kernels are short enough for the gaps to be a third of TTFT. From 2 us, about what a kernel queued
    # behind another waits on a busy stream, to 12 us, twice what its rows fit (4.9-7.5 us, each left
    # out in turn). By the mean |log error|: two of its four rows (the 2048-token prompts) move a few
    # percent over the range, and the median of four is the mean of the middle two.
    Procedure("eager_kernel_launch_s", "ttft", _every_row, _every_row, 2e-6, 12e-6, loss=mean_abs_log_error),
    # The share of the shape's measured GEMM rate a serving step's GEMMs reach (compute/chip.py): TensorRT-LLM's
    # offline throughput on H100, H200 and B200, whose large batches make their steps' GEMMs most of their
    # time. From 0.78 to 1 (a step's GEMMs at their table's rate) in steps of 5%: its rows' median moves a
    # point or two a step (5.5%, 3.9% and 6.4% at 0.80, 0.85 and 0.90), and each point simulates its 28 rows.
    Procedure("serving_gemm_fraction", "throughput", _every_row, _every_row, 0.78, 1.0, step=1.05),
)}


def latency_predictor(sharegpt: dict[str, Any], base: Mapping[str, float] | None = None) -> Predict:
    """The latency group's row predictor: a row simulated under the values (over `base`, values set
    outside the latency rows' fits), its signed relative errors."""
    def predict(row: Row, values: Mapping[str, float]) -> Errors:
        return relative_errors(row, predict_row(row, sharegpt, {**(base or {}), **values}))
    return predict


class RowErrors:
    """Each row's errors under the constants' values, each row simulated once per distinct values of
    the constants that reach it (`Procedure.reaches`); misses are simulated in up to `workers` forked
    processes, `progress` told how many."""

    def __init__(self, rows: Sequence[Row], predict: Predict, procedures: Sequence[Procedure] = PROCEDURES,
                 workers: int = 1, progress: Callable[[int], None] | None = None):
        self.rows = rows
        self.predict = predict
        self.procedures = procedures
        self.workers = workers
        self.progress = progress
        self.simulated = 0
        self._cache: dict[tuple, Errors] = {}

    def _key(self, k: int, values: Mapping[str, float]) -> tuple:
        return k, tuple((p.name, values[p.name]) for p in self.procedures
                        if p.name in values and p.reaches(self.rows[k]))

    def get(self, wanted: Sequence[tuple[int, Mapping[str, float]]]) -> list[Errors]:
        """Errors of each (row index, values) pair."""
        keys = [self._key(k, values) for k, values in wanted]
        missing = list(dict.fromkeys(key for key in keys if key not in self._cache))
        if missing:
            def work(key: tuple, progress: Callable[[int], None]) -> Errors:
                k, values = key
                try:
                    errors = self.predict(self.rows[k], dict(values))
                except UserError as error:
                    raise row_error(k, self.rows[k], error) from None
                progress(1)
                return errors

            if self.workers > 1 and len(missing) > 1 and can_fork():
                results = map_forked(work, missing, min(self.workers, len(missing)))
            else:
                results = [work(key, lambda _: None) for key in missing]
            self._cache.update(zip(missing, results))
            self.simulated += len(missing)
            if self.progress is not None:
                self.progress(len(missing))
        return [self._cache[key] for key in keys]


@dataclass(frozen=True)
class Fit:
    name: str
    value: float
    rows: int         # the rows it was fitted on
    loss: float       # the procedure's loss at the value


@dataclass(frozen=True)
class FitAll:
    """Every procedure's constant fitted on some rows (fit_all): the values used (the registry's where no
    row informs one), each one's Fit of the last pass (None where no row informs it), the passes made,
    and whether the last one left every value where it was."""

    values: dict[str, float]
    fits: dict[str, Fit | None]
    passes: int
    converged: bool


def _best(scores: Mapping[int, float]) -> int:
    """The grid index of the lowest score; the middle one of those that tie."""
    low = min(scores.values())
    tied = sorted(i for i, score in scores.items() if score <= low + TIE)
    return tied[(len(tied) - 1) // 2]


def fit(procedure: Procedure, train: Sequence[int], values: Mapping[str, float], errors: RowErrors,
        held_out: bool = False) -> Fit | None:
    """The procedure's constant fitted on the rows of `train` (indices) it informs, the other constants at
    `values` (missing ones at the registry's); None when no row of `train` informs it. `held_out`: the
    fit predicts rows outside `train`, so its grid runs through `held_out_start()`, which no row sets,
    not through the registry's value, the fit on every row."""
    informing = [k for k in train if procedure.informs(errors.rows[k])]
    if not informing:
        return None
    grid = procedure.grid(procedure.held_out_start() if held_out else None)
    got = errors.get([(k, {**values, procedure.name: value}) for value in grid for k in informing])
    scores = {i: procedure.loss([e[procedure.metric] for e in got[i * len(informing):(i + 1) * len(informing)]])
              for i in range(len(grid))}
    best = _best(scores)
    return Fit(procedure.name, grid[best], len(informing), scores[best])


def fit_all(train: Sequence[int], errors: RowErrors, procedures: Sequence[Procedure] = PROCEDURES,
            held_out: bool = False) -> FitAll:
    """Every procedure's constant fitted on `train`: a pass fits each in order, the ones before it at their
    fits and the ones after at their values from the pass before (the registry's, first); passes repeat
    until one leaves every value where it was, at most MAX_PASSES (the module's docstring says why).
    `held_out`: the values predict rows outside `train` (a fold of the cross-validation), so nothing in
    the fit may come from the registry, whose values were fitted on every row: each constant starts at,
    and its grid runs through, its `held_out_start()`, where it stays if no row of `train` informs it."""
    values = {p.name: p.held_out_start() if held_out else p.start() for p in procedures}
    seen = {tuple(values.values())}
    for passes in range(1, MAX_PASSES + 1):
        before = dict(values)
        fits: dict[str, Fit | None] = {}
        for procedure in procedures:
            fits[procedure.name] = fit(procedure, train, values, errors, held_out)
            if fits[procedure.name] is not None:
                values[procedure.name] = fits[procedure.name].value
        if values == before:
            return FitAll(values, fits, passes, converged=True)
        state = tuple(values.values())
        if state in seen:  # a cycle: no pass will settle
            break
        seen.add(state)
    return FitAll(values, fits, passes, converged=False)
