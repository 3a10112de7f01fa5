"""The deployment question in one call: of every way to deploy a scenario's model on N chips (layouts.py),
which serves the most requests at an SLO. Each candidate is checked as `simulate` would build it,
bounded from the step-cost model (bound.py), and only those that could still win get a capacity
search (capacity.py), ranked by an objective.

Candidates are judged in descending order of their bound. One whose bound is below the best
capacity found so far is skipped. The others are screened against the best: run at the two rates
that bracketed the best's capacity at the scenario's length (the highest rate it was accepted at,
less the stability margin, and the lowest it was refused at). Refused at the lower, a candidate
cannot beat it (a capacity found with more requests is no higher, capacity.py). Runs identical to
the best's change nothing that binds there (a limit never reached): a tie. Accepted at the lower and
refused at the upper, it is within the bracket and the margin of the best at that length: close,
listed without a search (`exhaustive` searches it). Accepted at both, it beats the best at that
length, and gets the full capacity search, which lengthens the runs until the answer is stable.

The layouts come first, each engine at its scenario's limits; then the grid of limits around them
(layouts.LIMIT_FACTORS) for the REFINE_LAYOUTS best layouts found.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenpath.compute.model import load_model
from tokenpath.config.errors import DoesNotFit, UserError
from tokenpath.delivery.calibration import CalibratedCost
from tokenpath.sim.overrides import apply_overrides
from tokenpath.sim.scenario import Scenario
from tokenpath.whatif.bound import capacity_bound_per_s, decode_tokens_per_step, step_limit_s
from tokenpath.whatif.capacity import (
    DEFAULT_STABILITY,
    DEFAULT_TOLERANCE,
    NoCapacity,
    Point,
    Target,
    ok,
    search,
)
from tokenpath.whatif.layouts import (
    LIMIT_FACTORS,
    Candidate,
    base_limits,
    enumerate_candidates,
    outside_domain,
    scaleup_domain,
    with_limits,
)
from tokenpath.whatif.objective import COST, Objective, Prices
from tokenpath.whatif.run import Base, simulate_many

SCHEMA = "tokenpath.search/1"
OBJECTIVES = {"rate-per-chip": "requests/s per chip at capacity", "cost": "USD per million output tokens at capacity",
              "goodput": "requests/s within the scenario's [slo] at capacity"}
DEFAULT_OBJECTIVE = "rate-per-chip"
# The grid of limits is tried on this many of the best layouts of the first pass.
REFINE_LAYOUTS = 2
# Where a candidate's judgement stopped: not buildable; short of memory; its bound below the best
# capacity; refused at the lower screening rate; its screening runs identical to the best's; accepted
# at the lower and refused at the upper (within the bracket's width of the best at the scenario's
# length); its capacity search found no rate meeting the SLO; searched in full.
STAGES = ("invalid", "memory", "bound", "screen", "tie", "close", "failed", "searched")


@dataclass(frozen=True)
class Question:
    """What a search is asked: N chips, an SLO, what "best" means, and which candidates to consider."""

    chips: int
    slo: dict[str, Target]
    objective: str = DEFAULT_OBJECTIVE
    engines: tuple[str, ...] = ()
    disaggregated: bool = False
    limits: bool = True          # also try the grid of engine limits around the best layouts
    exhaustive: bool = False     # search every valid candidate: no bound, no screen
    tolerance: float = DEFAULT_TOLERANCE
    stability: float = DEFAULT_STABILITY
    prices: Prices | None = None  # for the cost objective
    # the chips the scenario's application runs on besides the deployment's, priced with them
    application_chips: dict[str, int] = field(default_factory=dict)


@dataclass
class Entry:
    """One candidate as the search has judged it: where it stopped, why, and its capacity if searched."""

    candidate: Candidate
    phase: str                     # "layouts" or "limits"
    stage: str = "pending"         # one of STAGES
    reason: str | None = None
    screen: dict[str, Any] | None = None  # its runs at the best's two screening rates
    bound_per_s: float | None = None
    capacity: dict[str, Any] | None = None
    simulations: int = 0

    @property
    def rate_per_s(self) -> float:
        return self.capacity["request_rate"] if self.capacity else 0.0


@dataclass(frozen=True)
class Reference:
    """The best candidate's two screening runs: their rates, requests and result signatures."""

    layout: str
    num_requests: int
    rates_per_s: tuple[float, float]
    signatures: tuple[str, str]


@dataclass
class _State:
    best: Entry | None = None
    reference: Reference | None = None
    entries: list[Entry] = field(default_factory=list)


def signature(summary: dict[str, Any]) -> str:
    """What identifies a run's outcome: its latencies, throughput and load, as text."""
    return json.dumps([summary["latency_s"], summary["throughput"], summary["load"]], sort_keys=True)


def candidate_base(base: Base, overrides: dict[str, Any]) -> Base:
    """The base with a candidate's overrides applied: what its capacity search starts from."""
    return Base(apply_overrides(copy.deepcopy(base.table), overrides), base.source, base.base_dir)


def evaluate(base: Base, overrides: dict[str, Any], slo: dict[str, Target], reference: Reference | None,
             tolerance: float, stability: float, workers: int,
             progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Screen one candidate against `reference` (None: no screen), then search its capacity.
    Plain data in and out: a local call or a Ray task."""
    runs = 0
    if reference is not None:
        points = simulate_many(base, [{**overrides, "workload.arrival.rate": rate,
                                       "workload.num_requests": reference.num_requests}
                                      for rate in reference.rates_per_s], workers, progress)
        runs = len(points)
        failed = next((point.error for point in points if point.summary is None), None)
        if failed:
            return {"stage": "failed", "reason": failed, "simulations": runs}
        low_rate, high_rate = reference.rates_per_s
        screen = {"num_requests": reference.num_requests, "rates": list(reference.rates_per_s),
                  "accepted": [ok(Point(rate, point), slo) for rate, point in zip(reference.rates_per_s, points)]}
        at = f"({reference.num_requests:,} requests)"
        if tuple(signature(point.summary) for point in points) == reference.signatures:
            return {"stage": "tie", "simulations": runs, "screen": screen,
                    "reason": f"ties {reference.layout}: its runs at {low_rate:.4g} and {high_rate:.4g} req/s {at} "
                              "are identical (nothing it changes binds there)"}
        if not screen["accepted"][0]:
            return {"stage": "screen", "simulations": runs, "screen": screen,
                    "reason": f"refused at {low_rate:.4g} req/s {at}, where {reference.layout} is accepted"}
        if not screen["accepted"][1]:
            return {"stage": "close", "simulations": runs, "screen": screen,
                    "reason": f"close to {reference.layout}: accepted at {low_rate:.4g} req/s and refused at "
                              f"{high_rate:.4g} {at}, as it is"}
    try:
        document = search(candidate_base(base, overrides), slo, tolerance, workers, progress, stability)
    except NoCapacity as error:
        return {"stage": "failed", "reason": str(error), "simulations": runs + error.simulations}
    except UserError as error:
        return {"stage": "failed", "reason": str(error), "simulations": runs}
    return {"stage": "searched", "capacity": document, "simulations": runs + document["simulations"],
            **({"screen": screen} if reference is not None else {})}


def make_reference(base: Base, entry: Entry, stability: float, workers: int,
                   progress: Callable[[int], None] | None) -> Reference:
    """The screening runs of a new best: its last length's bracket, the lower end less `stability`. Its
    capacity is that length's answer: a shorter run's batches stay below limits that bind at steady state
    (a max_num_seqs twice the best's ran identically at the first length, 100 requests, and served 12%
    more at capacity)."""
    last = entry.capacity["convergence"][-1]
    rates = (last["request_rate"] * (1.0 - stability), last["above"])
    points = simulate_many(base, [{**entry.candidate.overrides(), "workload.arrival.rate": rate,
                                   "workload.num_requests": last["num_requests"]} for rate in rates],
                           workers, progress)
    entry.simulations += len(points)
    if any(point.summary is None for point in points):  # it ran before at these lengths: not expected
        raise UserError(f"search: {entry.candidate.layout} could not be run again: "
                        f"{next(p.error for p in points if p.summary is None)}")
    return Reference(entry.candidate.layout, last["num_requests"], rates,
                     tuple(signature(point.summary) for point in points))


class _Local:
    """Candidates one at a time in this process, each with `workers` simulations side by side."""

    slots = 1
    reports_progress = True

    def submit(self, *args: Any) -> object:
        return [evaluate(*args)]

    def wait(self, handles: list[object]) -> tuple[object, dict[str, Any]]:
        return handles[0], handles[0][0]  # type: ignore[index]

    def close(self) -> None:
        pass


class _Ray:
    """Candidates as Ray tasks, as many at once as the cluster has CPUs, each one simulation at a time."""

    def __init__(self, address: str | None) -> None:
        from tokenpath.sweep.run import join_ray

        ray, self.started = join_ray(address)
        self.ray = ray
        self.task = ray.remote(evaluate)
        self.slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.pending: set[object] = set()

    reports_progress = False

    def submit(self, base: Base, overrides: dict[str, Any], slo: dict[str, Target], reference: Reference | None,
               tolerance: float, stability: float, workers: int, progress: Callable[[int], None]) -> object:
        handle = self.task.remote(base, overrides, slo, reference, tolerance, stability, 1, None)
        self.pending.add(handle)
        return handle

    def wait(self, handles: list[object]) -> tuple[object, dict[str, Any]]:
        done, _ = self.ray.wait(list(handles), num_returns=1)
        self.pending.discard(done[0])
        return done[0], self.ray.get(done[0])

    def close(self) -> None:
        for handle in self.pending:
            self.ray.cancel(handle)
        if self.started:
            self.ray.shutdown()


def classify(base: Base, candidate: Candidate, domain: int, step_limit: float | None, phase: str) -> Entry:
    """A candidate checked as `simulate` builds it (invalid, or short of memory), else bounded."""
    entry = Entry(candidate, phase)
    reason = outside_domain(candidate, domain)
    if reason is None:
        from tokenpath.sim.simulate import prepare

        try:
            prepared = prepare(base.scenario(candidate.overrides()))
        except DoesNotFit as error:
            entry.stage, entry.reason = "memory", str(error)
            return entry
        except UserError as error:
            reason = str(error)
        else:
            entry.bound_per_s = capacity_bound_per_s(prepared, step_limit)
            return entry
    entry.stage, entry.reason = "invalid", reason
    return entry


def _judge(base: Base, question: Question, entries: list[Entry], state: _State, runner: Any, workers: int,
           decided: Callable[[int], None], simulated: Callable[[int], None]) -> None:
    """Bound, screen and search the valid `entries`, highest bound first, updating the best."""
    queue = sorted((e for e in entries if e.stage == "pending"), key=lambda e: -e.bound_per_s)
    for entry in entries:
        if entry.stage != "pending":
            decided(1)
    in_flight: dict[int, tuple[Any, Entry]] = {}  # by the handle's id
    while queue or in_flight:
        while queue and len(in_flight) < runner.slots:
            entry = queue.pop(0)
            best = state.best
            floor_per_s = None if best is None else pruning_floor_per_s(question, best)
            # The bound is a steady state's: it holds against a capacity whose runs were long enough to settle.
            if (best is not None and not question.exhaustive and best.capacity["converged"]
                    and entry.bound_per_s < floor_per_s):
                entry.stage = "bound"
                entry.reason = (f"its bound, {entry.bound_per_s:.4g} req/s, is below {best.candidate.layout}'s "
                                f"{_floor_name(question)}, {floor_per_s:.4g} req/s")
                decided(1)
                continue
            reference = None if question.exhaustive else state.reference
            if reference is not None and reference.rates_per_s[0] > floor_per_s:
                reference = None  # refused above the best's goodput, a candidate could still serve more within it
            handle = runner.submit(base, entry.candidate.overrides(), question.slo, reference, question.tolerance,
                                   question.stability, workers, simulated)
            in_flight[id(handle)] = (handle, entry)
        if not in_flight:
            break
        handle, result = runner.wait([handle for handle, _ in in_flight.values()])
        _, entry = in_flight.pop(id(handle))
        entry.stage, entry.reason = result["stage"], result.get("reason")
        entry.capacity, entry.simulations = result.get("capacity"), entry.simulations + result["simulations"]
        entry.screen = result.get("screen")
        if not runner.reports_progress:
            simulated(entry.simulations)
        decided(1)
        if entry.stage == "searched" and (state.best is None or _ahead(question, entry, state.best)):
            state.best = entry
            if not question.exhaustive:
                state.reference = make_reference(base, entry, question.stability, workers, simulated)
                # Those close to the best before are judged again against this one.
                again = [other for other in state.entries if other.stage == "close"]
                for other in again:
                    other.stage = "pending"
                    decided(-1)
                queue = sorted(queue + again, key=lambda e: -e.bound_per_s)


def pruning_floor_per_s(question: Question, best: Entry) -> float:
    """The request rate a candidate's must reach to beat `best` by the objective. Requests/s per chip and
    cost follow the capacity's rate at the question's chips: the best's rate. Goodput is that rate times the
    share of requests within the scenario's [slo], which --slo need not be: the best's goodput, which no
    candidate whose rate is lower can beat (its goodput is at most its rate)."""
    if question.objective == "goodput":
        return objective_value(question, best)
    return best.rate_per_s


def _floor_name(question: Question) -> str:
    return "goodput" if question.objective == "goodput" else "capacity"


def _ahead(question: Question, entry: Entry, best: Entry) -> bool:
    """Whether a searched `entry` beats the best so far: by goodput where that is the objective (the
    others follow the rate)."""
    if question.objective == "goodput":
        return objective_value(question, entry) > objective_value(question, best)
    return entry.rate_per_s > best.rate_per_s


def objective_value(question: Question, entry: Entry) -> float | None:
    """The candidate's value by the question's objective (None: cannot be priced). At capacity a deployment
    serves the rate the search found, a steady state; its run's throughputs are counts over the run's
    window, which the fill and the drain stretch by amounts that depend on how long the search made the
    run, so goodput and cost take the rate, with what the run measured per request (the share that met
    the SLO, the output tokens)."""
    if question.objective == "rate-per-chip":
        return entry.rate_per_s / entry.candidate.chips
    summary = entry.capacity["summary"]
    throughput = summary["throughput"]
    if question.objective == "goodput":
        served_per_s = throughput["requests_per_s"]
        return entry.rate_per_s * throughput["goodput_requests_per_s"] / served_per_s if served_per_s else 0.0
    tokens_per_s = entry.rate_per_s * summary["requests"]["output_tokens_mean"]
    steady = {**summary, "throughput": {**throughput, "output_tokens_per_s": tokens_per_s}}
    chips = dict(question.application_chips)
    chip = summary["resolved"]["deployment"]["chip"]
    chips[chip] = chips.get(chip, 0) + entry.candidate.chips
    return Objective(COST, prices=question.prices).value(steady, chips)


def ranked(question: Question, entries: list[Entry]) -> list[Entry]:
    """The searched entries, best first by the objective (cost low, the others high), then by rate."""
    sign = -1.0 if question.objective == "cost" else 1.0

    def key(entry: Entry) -> tuple[float, float]:
        value = objective_value(question, entry)
        return (-math.inf if value is None else sign * value, entry.rate_per_s)

    return sorted((e for e in entries if e.stage == "searched"), key=key, reverse=True)


def set_args(overrides: dict[str, Any]) -> list[str]:
    """Overrides as `--set KEY=VALUE` arguments (values as TOML writes them)."""
    def shown(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    return [f"{key}={shown(value)}" for key, value in overrides.items()]


def _row(question: Question, entry: Entry, rank: int | None = None) -> dict[str, Any]:
    candidate = entry.candidate
    row: dict[str, Any] = {"layout": candidate.layout, "engine": candidate.scheduler, "limits": candidate.limits,
                           "tp": candidate.tp, "pp": candidate.pp, "replicas": candidate.replicas,
                           "prefill_replicas": candidate.prefill_replicas,
                           "expert_parallel": candidate.expert_parallel, "moe_all_to_all": candidate.moe_all_to_all,
                           "attention_dp": candidate.attention_dp,
                           "max_num_seqs": candidate.max_num_seqs,
                           "max_num_batched_tokens": candidate.max_num_batched_tokens, "phase": entry.phase,
                           "overrides": candidate.overrides(), "set": set_args(candidate.overrides()),
                           "bound_requests_per_s": entry.bound_per_s}
    if entry.screen is not None:
        row["screen"] = entry.screen
    if entry.capacity is None:
        return {**row, "stage": entry.stage, "reason": entry.reason, "simulations": entry.simulations}
    capacity, summary = entry.capacity, entry.capacity["summary"]
    return {"rank": rank, **row,
            "request_rate": capacity["request_rate"],
            "request_rate_per_chip": capacity["request_rate"] / candidate.chips,
            "objective": objective_value(question, entry),
            "ttft_p99_s": summary["latency_s"]["ttft"]["p99"], "tpot_p99_s": summary["latency_s"]["tpot"]["p99"],
            "binding": capacity["binding"]["metric"], "converged": capacity["converged"],
            "num_requests": capacity["num_requests"], "convergence": capacity["convergence"],
            "simulations": entry.simulations,
            # `tokenpath simulate --set ...` with these reproduces the run at capacity
            "at_capacity": {"workload.arrival.rate": capacity["request_rate"],
                            "workload.num_requests": capacity["num_requests"]},
            "capacity": {key: value for key, value in capacity.items() if key not in ("summary", "above")},
            "summary": summary}


def run_search(base: Base, question: Question, workers: int, ray: bool = False, ray_address: str | None = None,
               decided: Callable[[int], None] | None = None, simulated: Callable[[int], None] | None = None,
               planned: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The search document (`tokenpath.search/1`). `planned(k)`: k more candidates to judge;
    `decided(k)`: k judged; `simulated(k)`: k more simulations run."""
    def nothing(_: int) -> None:
        pass

    decided, simulated, planned = decided or nothing, simulated or nothing, planned or nothing
    scenario = base.scenario({"deployment.chips": question.chips})
    if scenario.workload.trace is not None:
        raise UserError("search: the scenario replays a trace (workload.trace), whose arrival times are fixed; "
                        "search a scenario with a generated workload")
    if scenario.workload.max_concurrency is not None:
        raise UserError(f"search: the scenario's workload.max_concurrency holds at most "
                        f"{scenario.workload.max_concurrency} requests in flight, so the request rate it searches "
                        "cannot set the load; drop max_concurrency (or compare layouts at that concurrency in a sweep)")
    delivery = scenario.resolved_delivery()
    if delivery.calibration:  # every candidate runs on it: a missing or broken file is the search's error
        CalibratedCost.from_file(delivery.calibration, delivery.calibrated_server)
    engines = list(question.engines) or [scenario.engine.scheduler]
    moe = load_model(scenario.model_source()).is_moe
    domain, step_limit = scaleup_domain(scenario), step_limit_s(question.slo, decode_tokens_per_step(scenario))
    state = _State()
    runner = _Ray(ray_address) if ray else _Local()
    try:
        first = [classify(base, c, domain, step_limit, "layouts")
                 for c in enumerate_candidates(base, question.chips, engines, question.disaggregated, moe)]
        state.entries += first
        planned(len(first))
        _judge(base, question, first, state, runner, workers, decided, simulated)
        if question.limits:
            limits = {engine: base_limits(base, engine) for engine in engines}
            seen = {entry.candidate for entry in state.entries}
            second = [classify(base, variant, domain, step_limit, "limits")
                      for entry in ranked(question, first)[:REFINE_LAYOUTS]
                      for variant in with_limits(entry.candidate, limits[entry.candidate.scheduler])
                      if variant not in seen]
            state.entries += second
            planned(len(second))
            _judge(base, question, second, state, runner, workers, decided, simulated)
    finally:
        runner.close()
    return document(scenario, question, state.entries, 1 if ray else workers)


def document(scenario: Scenario, question: Question, entries: list[Entry], workers: int) -> dict[str, Any]:
    order = ranked(question, entries)
    candidates = [_row(question, entry, rank) for rank, entry in enumerate(order, 1)]
    pruned = [_row(question, entry) for entry in entries if entry.stage != "searched"]
    counts = {stage: sum(entry.stage == stage for entry in entries) for stage in STAGES}
    slo = {name: target.document() for name, target in question.slo.items()}
    return {
        "schema": SCHEMA,
        "question": {"scenario": scenario.name, "model": scenario.model.name, "precision": scenario.model.precision,
                     "chip": scenario.deployment.chip, "chips": question.chips, "slo": slo,
                     "objective": {"name": question.objective, "what": OBJECTIVES[question.objective],
                                   "better": "lower" if question.objective == "cost" else "higher"},
                     "engines": sorted({entry.candidate.scheduler for entry in entries}),
                     "disaggregated": question.disaggregated, "limit_factors": list(LIMIT_FACTORS),
                     "refined_layouts": REFINE_LAYOUTS if question.limits else 0,
                     "exhaustive": question.exhaustive, "tolerance": question.tolerance,
                     "stability": question.stability, "workers": workers},
        "counts": {"enumerated": len(entries), **counts,
                   "simulations": sum(entry.simulations for entry in entries)},
        "candidates": candidates,
        "pruned": pruned,
        "best": candidates[0] if candidates else None,
        "not_told_apart": [row["layout"] + f" ({row['engine']}, {row['limits']})" for row in candidates[1:]
                           if _within_stability(question, order[0], order[row["rank"] - 1])],
    }


def _within_stability(question: Question, best: Entry, other: Entry) -> bool:
    """Whether a searched candidate's value is within the capacity search's stability of the best's: its
    answer may move that much with the run's length, and a capacity moves by a few percent with the
    workload's draw, so the two are not told apart."""
    best_value, value = objective_value(question, best), objective_value(question, other)
    if best_value is None or value is None or best_value == 0:
        return False
    return abs(value / best_value - 1.0) <= question.stability


def best_scenario(base: Base, search_document: dict[str, Any]) -> Scenario:
    """The best candidate's scenario: the base with its overrides (what a launch-file writer takes)."""
    best = search_document.get("best")
    if best is None:
        raise UserError("search: no candidate met the SLO at any rate, so there is no best deployment")
    return base.scenario(best["overrides"])
