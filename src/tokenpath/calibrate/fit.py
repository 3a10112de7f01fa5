"""Fit the assumptions a deployment is sensitive to, so simulate reproduces what a probe measured.

Each measured phase is replayed in the simulator (its requests arriving when the probe sent them,
with the lengths the server saw; calibrate/measured.py) under candidate assumption values; the
residuals are the logs of (predicted + 5 ms) / (measured + 5 ms) of each phase's TTFT and TPOT
medians (or the statistics the measurement reported: a published row's means, its ITL). Which to fit:

1. screen `CANDIDATES` (most preferred first) by their effect at the starting values: each that moves
   the residuals enough and is not nearly collinear with one already kept (a constant cost per step
   is the same to the probe whether the host's or the kernels'), as many as MAX_FITTED allows;
2. fit them (bounded least squares over their logarithms, scipy.optimize.least_squares, from the best
   points of a Sobol search: a step's time is not smooth in them; each Jacobian by forward steps of
   STEP, the screen's over STEP either side);
3. drop, least preferred first, any the fit leaves undetermined (one sigma over MAX_RELATIVE_UNCERTAINTY
   of its value), then any it presses against an end of its range (within AT_BOUND: the figures ask for
   a value past it, and what they ask for lies elsewhere), and then any the residuals do not need
   (the fit without it within PARSIMONY, or within the medians' own noise, NOISE_FLOOR), and fit the rest
   again. Where every one is pressed against its range or left undetermined, none is fitted.

Each value's uncertainty (one sigma) comes from the Jacobian at the solution, with the residuals' own
scale, at least NOISE_FLOOR; infinite where the residuals do not move with it (`_sigma`). Where two
assumptions trade off (a step's fixed host time against the HBM efficiency of its weight streaming,
for a small model at small batches), the probe cannot tell which
it is; either predicts the probe's loads alike, and the file says which were left out and why. Where
the parts of a TTFT no fitted assumption changes (the client's network, the front end when it is not
fitted) already take as long as a phase's measured TTFT, the fit cannot reproduce that phase, and
`Fit.warnings` says which part and what sets it.

With a deadline (`calibrate engine --budget`), the fit stops refining when it passes it: each fit keeps
its first local fit, and step 3's drops stop, the Fit's warnings saying what was left out. The local
fit in progress finishes, so the fit ends within one local fit of the deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenpath.calibrate.measured import Measured, statistics_s
from tokenpath.compute.chip import load_chip
from tokenpath.config.assumptions import lookup
from tokenpath.config.errors import UserError
from tokenpath.config.units import format_duration
from tokenpath.delivery.lastmile import LastMile
from tokenpath.fabric.tuner import runs_rccl
from tokenpath.sim.deployment import build_deployment, check_fits
from tokenpath.sim.scenario import Scenario
from tokenpath.sim.simulate import Prepared, simulate

# The assumptions an engine probe can see, most preferred first: a server's own overheads (its host
# time per step, its time to launch an eager step's kernels, its front end) and its kernels' rate, then
# the fixed cost of a kernel (one H100 table's shortest GEMM, compute/efficiency.py; a software stack's
# own: ROCm's near 12 us), and last the HBM efficiency, which on a chip that measures it
# (ChipSpec.measured: catalog/chips.toml's measured_stream_bw) is fitted only where the probe sees no
# candidate before it (a single request's decode, say). Where the probe cannot tell two apart,
# the one earlier here is fitted. At one load a slow decode step is fitted by a slow weight stream as
# well as by a fixed cost per kernel or per step, and where the project has checked, the stream was the
# wrong one: the SGLang cookbook's DeepSeek-V3 on 8 x MI300X, fitted at concurrency 1, read its heavier
# loads' TPOT +123% to +178% with an HBM efficiency of 0.10, and within 3% with 12 us a kernel
# (`tokenpath validate --calibrated`); `tokenpath serve` with four times the host time per step, fitted
# on one closed loop, took an HBM efficiency of 0.65 and put another load's TPOT outside its band
# (tests/test_calibrate_engine.py). The host time per eager kernel moves only the engines that pay it
# (SGLang's and vLLM V0's profiles; TensorRT-LLM's PyTorch backend its own): a light-load prompt of
# theirs waits on its launches, which no rate of the GPU's shortens.
CANDIDATES = ("host_step_s", "vllm_v0_host_window_s", "vllm_v0_host_step_s", "eager_host_per_kernel_s",
              "trtllm_eager_host_per_kernel_s", "serving_gemm_fraction", "frontend_per_request_s",
              "host_per_sequence_s", "base_latency_s", "rccl_base_latency_s", "kernel_fixed_s",
              "hbm_bw_efficiency", "attention_query_overhead_pairs")
# Least change of the residuals (in log units) per log unit of an assumption for it to be fitted: a
# 10% change of it must move the phases' medians by about 1% together.
MIN_SENSITIVITY = 0.1
# Every Jacobian's step, in log units: the screen's either side of the starting values, the fit's
# forward. A simulated median is not smooth at a step of a few percent, where a step of one assumption
# can move which requests share a prefill, and with them the median, by as much as a real effect. On
# DataCrunch's 1 req/s SGLang run, 2% more host_step_s moved the median TTFT by 0.5% (and 10% more by
# -1.7%), though 0.6 ms of host time a step, overlapped, cannot reach a 91 ms TTFT; and on its first 40
# requests 2% more host time per eager kernel shortened the median TTFT, so a fit from the registry's
# value stayed there. A 10% step is also the change MIN_SENSITIVITY is stated for.
STEP = math.log(1.1)
# The chip's measured values (ChipSpec.measured) fitted only where the probe sees no other candidate: its
# memory's streaming rate is the chip's, which a serving stack barely changes. A measured fixed time per
# kernel (catalog/chips.toml's measured_kernel_fixed) is not among them: it starts the fit (`_Model.start`),
# and the stack's own kernels may take longer (ROCm's near 12 us, above).
FITTED_LAST_WHERE_MEASURED = ("hbm_bw_efficiency",)
# Two assumptions whose Jacobian columns are this aligned cannot be told apart by the probe.
MAX_COSINE = 0.9
# At most this many are fitted, and no more than the probe has figures (a phase's TTFT and TPOT): one
# phase, a single load measured, fits two and reproduces both of its figures.
MAX_FITTED = 4
# Why a value the fit leaves that uncertain is not fitted (Fit.not_fitted), followed by its spread.
UNDETERMINED = "not determined by this probe"
# J'J's eigenvalues this small against its largest are directions the residuals do not move in, and a value
# with a component over FLAT_COMPONENT along one is not determined at all (_sigma). Numerical zero, not tuned.
FLAT_EIGENVALUE = 1e-12
FLAT_COMPONENT = 1e-6
# An assumption the fit leaves this uncertain (one sigma over its value) is not determined by the probe:
# the least preferred of such keeps its value and the others are fitted again without it.
MAX_RELATIVE_UNCERTAINTY = 0.75
MAX_EVALUATIONS = 60  # of each local fit
# Each local fit stops when a step changes the residuals' cost, or the values, by less than this share
# (least_squares' ftol and xtol; its defaults, 1e-8, ask the noisy medians for precision they do not
# have, NOISE_FLOOR: refitting the perturbed-serve probe of docs/assumptions.md took 94 s at 1e-8 and
# 50 s at 1e-3, to the same values within 0.01%).
TOLERANCE = 1e-3
# A fitted value this close to an end of its range (in log units: within 1% of it), where the fit pressed it
# and its tolerance (TOLERANCE) stopped it, is not one the figures settle: they ask for a value past the range.
# A GEMM rate beyond the chip's measured one (a fraction over 1) or a host time twenty times its start is not
# what the server does, and kept, it bends every other load's prediction. Fitted at their lightest loads, the
# SGLang cookbook's A100 run of 8,000-token prompts took `serving_gemm_fraction` to 0.9986, and AIConfigurator's
# vLLM run on 8 H100s to 1.0 with a kernel's fixed time: their runs at concurrency 64 read -17.3% and -11.3%
# TTFT so, -10.0% and -4.1% without it (`tokenpath validate --calibrated`, docs/validation.md).
AT_BOUND = 0.01
PRESSED = "pressed against an end of its range: the figures ask for a value past it (what they ask for lies elsewhere)"
# A fitted assumption is dropped again, least preferred first, when the fit without it is at most this
# share worse (in rms), or no worse than NOISE_FLOOR: the probe's noise (a few % per median) explains that
# much. (Two fits both far inside the noise, 0.02% and 0.03% rms, differ by half and by nothing the probe
# can tell.)
PARSIMONY = 0.05
# Relative scale of a median's error when the fit leaves less: bench's timestamps and a server's
# run-to-run spread on a few requests per phase (about 1-2% on loopback in this project's tests).
NOISE_FLOOR = 0.02
# Bounds: fractions of a rate stay within (0.02, 1]; everything else within 1/20 to 20 times its start.
SPAN = 20.0
# Residuals compare log(predicted + this) with log(measured + this): a median of a few milliseconds
# weighs less, as a server's HTTP and front-end time (which the model does not hold) is a larger share of it.
ABSOLUTE_FLOOR_S = 5e-3
# An assumption that starts at zero (a server's front end) is fitted as REFERENCE_S * (e^x - 1), up to
# MAX_FROM_ZERO_S: a few ms is the order of a server's HTTP and tokenization.
REFERENCE_S = 5e-3
MAX_FROM_ZERO_S = 0.1
SEARCH_SPAN = 8.0     # the global search looks within 1/8 to 8 times the starting values
SEARCH_POINTS = 16    # Sobol points of that search (a power of 2)
# A figure the fitted model still misses by more than this share is named in a warning: twelve times the
# noise of a median (NOISE_FLOOR), and more than twice the calibrated published rows' median error.
FAR_AFTER_FIT = 0.25
# Local fits, from the best points found. On a probe of the perturbed-serve loop of docs/assumptions.md
# ("The loop, shown") refitted with --from, two stop in a valley at 5.7% rms and one at 7.6%; the third
# start reaches 3.2%, for 74 s of fit against 43 s.
LOCAL_FITS = 3


@dataclass
class Fit:
    names: list[str]
    start: dict[str, float]
    values: dict[str, float]
    uncertainty: dict[str, float]
    rms_before: float
    rms_after: float
    predicted_before: list[tuple[float, float]]
    predicted_after: list[tuple[float, float]]
    not_fitted: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # What the deadline left undone (empty: the whole fit ran); the warnings say it in a line.
    cut_by_budget: list[str] = field(default_factory=list)


class _Model:
    """Residuals of the phases for assumption values given as log multipliers of their start."""

    def __init__(self, scenario: Scenario, measured: list[Measured], names: list[str]):
        self.scenario = _with_concurrency(scenario, None)
        self.base = scenario.resolved_assumptions()
        self.measured = measured
        self.names = names
        # What the chip measures (`held`) is what the scenario runs with, so each fit starts there (passed
        # as an override, the registry's value would replace it), and the screen takes it last.
        self.held = load_chip(scenario.deployment.chip, self.base).measured_assumptions()
        self.start = {n: self.held.get(n, self.base.value(n)) for n in names}
        deployment = build_deployment(scenario)
        for m in measured:  # a request the deployment cannot serve stops the fit here, naming the file
            check_fits(m.requests, deployment, scenario, measured_in=m.results)
        self.targets = np.array([v for m in measured for v in (m.ttft_s, m.decode_s)])
        self.used = np.isfinite(self.targets) & (self.targets > 0)
        self._last: tuple[tuple, np.ndarray] | None = None  # the latest residuals, by (names, x)

    def predict(self, values: dict[str, float]) -> list[tuple[float, float]]:
        scenario = self.scenario.model_copy(update={"assumptions": {**self.scenario.assumptions, **values}})
        scenario._base_dir = self.scenario._base_dir
        deployment = build_deployment(scenario)
        figures = []
        for m in self.measured:
            prepared = Prepared(_with_concurrency(scenario, m.replay_concurrency()), deployment, m.requests)
            # (the tokens' times only where the phase's decode figure is ITL, their gaps)
            run = simulate(prepared, workers=1, continuity=False, token_times=m.statistic.decode_metric == "itl").run
            figures.append(statistics_s(run, m.counted, m.statistic))
        return figures

    def values(self, x: np.ndarray, names: list[str]) -> dict[str, float]:
        return {n: _value(self.start[n], v) for n, v in zip(names, x)}

    def residuals(self, x: np.ndarray, names: list[str]) -> np.ndarray:
        key = (tuple(names), x.tobytes())
        if self._last is None or self._last[0] != key:  # a Jacobian follows the residuals at its point
            predicted = np.array([v for pair in self.predict(self.values(x, names)) for v in pair])
            floor = ABSOLUTE_FLOOR_S
            self._last = key, np.log((predicted[self.used] + floor) / (self.targets[self.used] + floor))
        return self._last[1].copy()

    def jacobian(self, x: np.ndarray, names: list[str]) -> np.ndarray:
        """The residuals' Jacobian at x by forward steps of STEP in each coordinate. Not least_squares'
        own: its `diff_step` is relative to x (a step of diff_step * x), so near the starting values (x = 0)
        its steps are far below what moves a simulated median smoothly, and the Jacobian is noise."""
        at = self.residuals(x, names)
        return np.array([(self.residuals(self._moved(x, k, STEP), names) - at) / STEP
                         for k in range(len(names))]).T

    def sensitivities(self, x: np.ndarray, names: list[str]) -> np.ndarray:
        """The screen's Jacobian at x: differences over STEP either side, or from x up where the
        side below leaves the assumption's bounds (one that starts at zero). A column that the step up
        alone moves by less than MIN_SENSITIVITY keeps that one-sided difference: the screen leaves it
        out either way, unless a jump of the median hides a real effect, and it saves a simulation."""
        at = self.residuals(x, names)
        columns = []
        for k, name in enumerate(names):
            up = self.residuals(self._moved(x, k, STEP), names)
            column = (up - at) / STEP
            below = max(-STEP, _bounds(name, self.start[name])[0] - x[k])
            if np.linalg.norm(column) >= MIN_SENSITIVITY and below < 0:
                column = (up - self.residuals(self._moved(x, k, below), names)) / (STEP - below)
            columns.append(column)
        return np.array(columns).T

    @staticmethod
    def _moved(x: np.ndarray, k: int, step: float) -> np.ndarray:
        moved = x.copy()
        moved[k] += step
        return moved


def _with_concurrency(scenario: Scenario, concurrency: int | None) -> Scenario:
    """The scenario with its workload's concurrency cap set: a replay sends each phase's requests at
    their arrival times, capped only where the phase's times are not the measured sends."""
    copy = scenario.model_copy(update={"workload": scenario.workload.model_copy(
        update={"max_concurrency": concurrency})})
    copy._base_dir = scenario._base_dir
    return copy


def _value(start: float, x: float) -> float:
    """An assumption's value at fit coordinate x: start * e^x, or from zero REFERENCE_S * (e^x - 1)."""
    return start * math.exp(x) if start > 0 else REFERENCE_S * math.expm1(x)


def _slope(start: float, x: float) -> float:
    """d value / d x at x, to carry an uncertainty in x over to the value."""
    return start * math.exp(x) if start > 0 else REFERENCE_S * math.exp(x)


def _bounds(name: str, start: float) -> tuple[float, float]:
    if start == 0:
        return 0.0, math.log1p(MAX_FROM_ZERO_S / REFERENCE_S)
    if lookup(name).unit == "1" and name != "attention_query_overhead_pairs":
        return math.log(0.02 / start), math.log(1.0 / start)
    return -math.log(SPAN), math.log(SPAN)


def _starts(model: _Model, names: list[str], low: np.ndarray, high: np.ndarray) -> list[np.ndarray]:
    """Where the local fits start: the best few of the starting values and a scrambled Sobol sample of
    the box within SEARCH_SPAN of them. A step's time is not smooth in the assumptions (a prefill that
    fits one step more or less changes the batching), so a fit from one start can stop in a dip."""
    from scipy.stats import qmc

    box_low = np.maximum(low, -math.log(SEARCH_SPAN))
    box_high = np.minimum(high, math.log(SEARCH_SPAN))
    sample = qmc.scale(qmc.Sobol(len(names), seed=0).random(SEARCH_POINTS), box_low, box_high)
    points = [np.clip(np.zeros(len(names)), low, high), *sample]
    costs = [float(np.sum(model.residuals(x, names) ** 2)) for x in points]
    return [points[k] for k in np.argsort(costs, kind="stable")[:LOCAL_FITS]]


def _collective_latencies_not_run(scenario: Scenario, candidates: tuple[str, ...]) -> dict[str, str]:
    """The collectives' base latencies among `candidates` that the deployment does not pay, with why: both
    on one chip (no tensor-parallel group), and the other runtime's elsewhere (RCCL's on the chips it runs
    on, fabric/tuner.py's runs_rccl; NCCL's on the rest)."""
    names = {"base_latency_s", "rccl_base_latency_s"} & set(candidates)
    if scenario.deployment.tp == 1:
        return {n: "one chip runs no collective" for n in names}
    chip = load_chip(scenario.deployment.chip, scenario.resolved_assumptions())
    rccl = runs_rccl(chip.generation)
    runtime, other = ("RCCL", "base_latency_s") if rccl else ("NCCL", "rccl_base_latency_s")
    return {n: f"the {scenario.deployment.chip}'s collectives run on {runtime}" for n in names if n == other}


def fit_engine(scenario: Scenario, measured: list[Measured], candidates: tuple[str, ...] = CANDIDATES,
               deadline_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> Fit:
    """Choose and fit the assumptions; see the module's docstring. `deadline_s` is a time of `clock`
    (None: no deadline)."""

    def out_of_time() -> bool:
        return deadline_s is not None and clock() >= deadline_s

    if not measured:
        raise UserError("calibrate engine: no phase measured anything; check the server, or give --from files")
    unpaid = [n for n in candidates if not scenario.engine.pays(n)]  # they move nothing
    unrun = _collective_latencies_not_run(scenario, candidates)
    usable = [n for n in candidates if n not in unpaid and n not in unrun]
    model = _Model(scenario, measured, usable)
    r0 = model.residuals(np.zeros(len(usable)), usable)
    columns = list(model.sensitivities(np.zeros(len(usable)), usable).T)
    chosen: list[int] = []
    not_fitted: dict[str, str] = {n: "the engine's profile does not pay it (engine/profiles.py)" for n in unpaid}
    not_fitted.update(unrun)
    limit = min(MAX_FITTED, len(r0))
    for k, name in enumerate(usable):
        norm = float(np.linalg.norm(columns[k]))
        if norm < MIN_SENSITIVITY:
            not_fitted[name] = f"the probe barely sees it (sensitivity {norm:.2g})"
            continue
        if name in model.held and name in FITTED_LAST_WHERE_MEASURED and chosen:
            not_fitted[name] = (f"measured for the {scenario.deployment.chip} (catalog/chips.toml): fitted only "
                                "where nothing else is")
            continue
        twin = next((usable[j] for j in chosen if abs(float(columns[j] @ columns[k])) /
                     (norm * float(np.linalg.norm(columns[j]))) > MAX_COSINE), None)
        if twin is not None:
            not_fitted[name] = f"indistinguishable from {twin} in this probe"
            continue
        if len(chosen) == limit:
            not_fitted[name] = f"at most {limit} fitted from {len(r0)} measured figures"
            continue
        chosen.append(k)
    names = [usable[k] for k in chosen]
    if not names:
        raise UserError("calibrate engine: the probe's figures do not depend on any candidate assumption; "
                        "probe longer prompts or more concurrency")
    result, sigma, stopped = _fit(model, names, out_of_time)
    cut = ["kept the first of its local fits"] if stopped else []  # what the deadline left undone
    while names:  # what the fit leaves loose is not determined: the least preferred goes, the last one too
        spread = {n: _slope(model.start[n], float(x)) * float(s) / max(_value(model.start[n], float(x)), 1e-30)
                  for n, x, s in zip(names, result.x, sigma)}
        loose = [n for n in names if spread[n] > MAX_RELATIVE_UNCERTAINTY]
        if not loose or (len(names) == 1 and _pressed(model, names, result.x)):
            break  # (the last one, pressed against an end of its range, is dropped as that below)
        if out_of_time():
            cut.append(f"left {', '.join(loose)} in though the probe leaves them loose")
            break
        not_fitted[loose[-1]] = f"{UNDETERMINED} (+/- {spread[loose[-1]]:.0%} when fitted)"
        names = [n for n in names if n != loose[-1]]
        if names:
            result, sigma, _ = _fit(model, names, out_of_time)
    while names:  # a value pressed against an end of its range: the least preferred goes
        pressed = _pressed(model, names, result.x)
        if not pressed:
            break
        if out_of_time():
            cut.append(f"kept {', '.join(pressed)} though the fit pressed it against an end of its range")
            break
        not_fitted[pressed[-1]] = PRESSED
        names = [n for n in names if n != pressed[-1]]
        if names:
            result, sigma, _ = _fit(model, names, out_of_time)
    for name in names[::-1]:  # the simplest explanation: drop what the medians do not need
        if len(names) == 1:
            break
        if out_of_time():
            cut.append("did not check whether each fitted assumption is needed")
            break
        rest = [n for n in names if n != name]
        simpler, simpler_sigma, _ = _fit(model, rest, out_of_time)
        if _rms(simpler.fun) <= max(_rms(result.fun) * (1 + PARSIMONY), NOISE_FLOOR):
            not_fitted[name] = (f"not needed: the fit without it is as good ({_rms(simpler.fun):.1%} against "
                                f"{_rms(result.fun):.1%} rms)")
            names, result, sigma = rest, simpler, simpler_sigma
    values = model.values(result.x, names)  # (none where every one was pressed against its range)
    predicted_after = model.predict(values)
    return Fit(
        names=names, start={k: model.start[k] for k in names}, values=values,
        uncertainty={k: _slope(model.start[k], float(x)) * float(s) for k, x, s in zip(names, result.x, sigma)},
        rms_before=_rms(r0), rms_after=_rms(result.fun) if names else _rms(r0),
        predicted_before=model.predict({}), predicted_after=predicted_after, not_fitted=not_fitted,
        warnings=([] if names else [_nothing_fitted_warning(not_fitted)])
        + fixed_part_warnings(scenario, measured, names) + far_figure_warnings(measured, predicted_after, bool(names))
        + _budget_warnings(cut),
        cut_by_budget=cut,
    )


def _pressed(model: _Model, names: list[str], x: np.ndarray) -> list[str]:
    """Of `names`, those whose fitted coordinate in `x` lies within AT_BOUND of an end of its range."""
    pressed = []
    for name, at in zip(names, x):
        low, high = _bounds(name, model.start[name])
        if at <= low + AT_BOUND or at >= high - AT_BOUND:
            pressed.append(name)
    return pressed


def _nothing_fitted_warning(not_fitted: dict[str, str]) -> str:
    """The line of a fit that kept nothing: each candidate it fitted went to an end of its range, or was
    left undetermined by the figures."""
    pressed = [n for n, why in not_fitted.items() if why == PRESSED]
    loose = [n for n, why in not_fitted.items() if why.startswith(UNDETERMINED)]
    why = ([f"{', '.join(pressed)} went to an end of its range, so the measured figures ask for what no candidate "
            "assumption gives"] if pressed else []) + (
        [f"the measured figures leave {', '.join(loose)} undetermined"] if loose else [])
    return f"nothing fitted: {'; '.join(why)}; every value stays at its start"


def _budget_warnings(cut: list[str]) -> list[str]:
    """A line on what the deadline left undone, if anything."""
    if not cut:
        return []
    return [f"the fit reached the end of its budget and {', and '.join(cut)}; give a longer --budget for the whole fit"]


def fixed_part_warnings(scenario: Scenario, measured: list[Measured], fitted: list[str]) -> list[str]:
    """A line on the phase whose measured TTFT the unfitted parts of TTFT come closest to, where they
    reach it: the client's network (a round trip plus the bytes, lastmile.py) and the front end when it
    is not fitted. Its usual cause is the default 20 ms round trip against a server on this machine."""
    delivery = scenario.resolved_delivery()
    last_mile = LastMile(delivery)
    reached = []  # (floor / measured, floor, phase)
    for m in measured:
        prompt = float(m.requests.input_tokens.mean())
        frontend_s = 0.0 if "frontend_per_request_s" in fitted else last_mile.request_cost_s(round(prompt))
        network_ns = last_mile.upload_ns(prompt) + last_mile.event_network_ns(1)
        floor_s = network_ns / 1e9 + frontend_s
        if 0 < m.ttft_s <= floor_s:
            reached.append((floor_s / m.ttft_s, floor_s, m))
    if not reached:
        return []
    _, worst_floor_s, worst = max(reached, key=lambda entry: entry[0])
    parts = f"a {format_duration(delivery.network_rtt)} client round trip (delivery.network_rtt)"
    if "frontend_per_request_s" not in fitted:
        frontend_s = last_mile.request_cost_s(round(float(worst.requests.input_tokens.mean())))
        parts += (f" and a {format_duration(frontend_s)} front end (delivery.frontend_per_request, "
                  "chat_template_per_request, tokenize_per_token)")
    return [(f"the scenario's fixed parts, {parts}, alone take {format_duration(worst_floor_s)} of a TTFT, where "
             f"phase {worst.name} measured {format_duration(worst.ttft_s)}: no fitted assumption can make up for "
             "it; for a server on this machine give --network-rtt 0")]


def far_figure_warnings(measured: list[Measured], predicted: list[tuple[float, float]],
                        fitted: bool = True) -> list[str]:
    """A line on the figure the fitted model misses by most, where that is more than FAR_AFTER_FIT. With
    one phase, the candidates that would reach it may move both of its figures as those fitted do, which
    a second load tells apart; with nothing `fitted`, none reached it within its range."""
    misses = [(abs(p / m - 1.0), p, m, key, phase.name)
              for phase, pair in zip(measured, predicted)
              for p, m, key in zip(pair, (phase.ttft_s, phase.decode_s), phase.statistic.keys())
              if math.isfinite(m) and m > 0 and math.isfinite(p)]
    if not misses or max(misses)[0] <= FAR_AFTER_FIT:
        return []
    _, predicted_s, measured_s, key, name = max(misses)
    why = ("no candidate assumption reaches it within its range" if not fitted else
           "at one load no candidate assumption reaches it apart from those fitted; a second run at another "
           "load (another --from) can tell them apart" if len(measured) == 1 else
           "no candidate assumption reaches it: the model lacks what this server does there")
    return [f"after the fit, phase {name}'s {key} is {format_duration(predicted_s)} against "
            f"{format_duration(measured_s)} measured ({predicted_s / measured_s - 1:+.0%}): {why}"]


def _rms(residuals: np.ndarray) -> float:
    return float(np.sqrt(np.mean(residuals ** 2)))


def _local_fit(model: _Model, names: list[str], x0: np.ndarray, low: np.ndarray, high: np.ndarray):
    """scipy's bounded least squares from x0, on the model's own Jacobian."""
    from scipy.optimize import least_squares

    return least_squares(model.residuals, x0, jac=model.jacobian, bounds=(low, high), args=(names,), x_scale=1.0,
                         max_nfev=MAX_EVALUATIONS, ftol=TOLERANCE, xtol=TOLERANCE)


def _fit(model: _Model, names: list[str], out_of_time: Callable[[], bool] = lambda: False):
    """Bounded least squares over `names` from the best starts of a search: (scipy's result, one sigma
    of each x, whether the deadline (`out_of_time`) stopped it before its last local fit)."""
    low, high = (np.array(b) for b in zip(*(_bounds(n, model.start[n]) for n in names)))
    result, stopped = None, False
    for x0 in _starts(model, names, low, high):
        if result is not None and out_of_time():
            stopped = True
            break
        trial = _local_fit(model, names, x0, low, high)
        if result is None or trial.cost < result.cost:
            result = trial
    m, n = len(result.fun), len(names)
    scale2 = max(float(result.fun @ result.fun) / (m - n), NOISE_FLOOR ** 2) if m > n else NOISE_FLOOR ** 2
    return result, _sigma(result.jac, scale2), stopped


def _sigma(jac: np.ndarray, scale2: float) -> np.ndarray:
    """One sigma of each value from the Jacobian at the solution: the diagonal of (J'J)^-1 times the residuals'
    variance `scale2`, infinite for a value along a direction the residuals do not move in (a zero eigenvalue
    of J'J: a value that changes nothing, or two that trade off exactly), which a pseudo-inverse would give
    no variance at all."""
    eigenvalues, vectors = np.linalg.eigh(jac.T @ jac)
    flat = eigenvalues <= max(float(eigenvalues.max(initial=0.0)), 1e-300) * FLAT_EIGENVALUE
    variance = (vectors[:, ~flat] ** 2 / eigenvalues[~flat]).sum(axis=1) * scale2
    variance[(np.abs(vectors[:, flat]) > FLAT_COMPONENT).any(axis=1)] = np.inf
    return np.sqrt(variance)
