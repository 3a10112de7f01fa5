"""Which layer holds the time users feel, and why, in one line; and, first, whether the run was
overloaded (offered more than it served), and then which serial resource limits its capacity.

What users feel is read against the scenario's SLOs: when a share of requests misses one (TTFT, TTFV,
TPOT or E2E), the verdict explains the metric missed most, by the layer that holds most of it; when none
is missed, the layer that holds most of E2E, with TTFT's own layer beside it when that differs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenpath.compute.roofline import ComputeModel
from tokenpath.config.units import format_duration, format_number
from tokenpath.diagnose.overload import Load

# The layer each attribution part belongs to, as the verdict names it.
LAYER_OF_PART = {"queue": "distribution", "compute": "compute", "traffic": "traffic", "delivery": "delivery",
                 "application": "application"}
# An SLO missed by at least this share of requests is what users feel first.
FELT_MISS_SHARE = 0.1
METRIC_NAMES = {"ttft": "TTFT", "ttfv": "TTFV", "tpot": "TPOT", "e2e": "E2E"}


@dataclass(frozen=True)
class Resource:
    """A serial resource every request of a replica shares, and how busy it was."""

    name: str           # e.g. "engine", "detokenizing worker"
    layer: str          # the attribution part its busy time belongs to
    utilization: float  # busy share of the run's window, of its busiest instance (replica, engine)
    why: str            # what keeps it busy, in words
    # True for a resource that serves one item at a time (a process, a link): busy all the time, it is
    # saturated. An engine batches: busy all the time, it still serves more with a larger batch.
    one_at_a_time: bool = True
    front_end: bool = False  # one of the front end's processes (delivery/frontend.py)

    def busy(self) -> str:
        """How busy it is, in words: a saturated front end says so."""
        if self.front_end and self.utilization >= SATURATED:
            return f"front end saturated ({self.utilization:.0%} busy): the {self.name}"
        return f"the {self.name} is busy {self.utilization:.0%} of the time"


# A one-at-a-time resource busy this share of the time is saturated, and limits before an engine does.
SATURATED = 0.9
# An engine whose batch holds this share of its max_num_seqs on average (over its time) has its batch
# slots held: a request waits for one.
SLOTS_HELD = 0.9
# An engine whose KV cache holds this share of its tokens on average (weighted by step time), and that
# preempts or runs a mean batch under SLOTS_HELD of its max_num_seqs, has its batch held by the cache: more KV
# memory batches more (sim/document.py's _resources).
KV_FULL = 0.85


@dataclass(frozen=True)
class Evidence:
    """Facts from a simulation that explain each layer's share."""

    busy_fraction: float           # share of the window the engine was running steps
    mean_batch_seqs: float
    preemptions: int
    memory_bound_fraction: float   # share of compute time in memory-bound ops (shares_of)
    traffic_detail: str            # what the fabric carries each step, e.g. "160 TP all-reduces over 8 chips"
    network_rtt_s: float
    detokenize: str                # the process that detokenizes: engine, api-server or detokenizer
    host_share_of_step: float      # share of step time the host blocked the device
    load: Load | None = None
    resources: list[Resource] = field(default_factory=list)
    # Mean seconds per part of each felt metric ("ttft", "ttfv", "tpot" per token, "e2e"), each part
    # one of queue, compute, traffic, delivery; and the network's seconds within delivery's.
    parts_s: dict[str, dict[str, float]] = field(default_factory=dict)
    network_s: dict[str, float] = field(default_factory=dict)
    # Mean seconds the front end's processes held a prompt before the engine had it (waiting for a busy
    # one, parsing, templating, tokenizing): the part of a first token's delivery that is theirs.
    front_in_s: float = 0.0
    slo_s: dict[str, float] = field(default_factory=dict)          # the SLOs that are set
    slo_miss_share: dict[str, float] = field(default_factory=dict)  # share of requests missing each
    # Mean seconds of E2E's delivery in each of its parts (summary's attribution_s.delivery_detail).
    delivery_detail_s: dict[str, float] = field(default_factory=dict)
    # With an application: mean seconds of each stage on the critical path (summary's
    # attribution_s.application_detail), and the stages that run before the model call (an agent's: its
    # last call, so the stages between its calls too).
    application_detail_s: dict[str, float] = field(default_factory=dict)
    application_before: frozenset[str] = frozenset()
    # Share of compute time in ops whose fixed per-kernel cost exceeds their roofline work (step_ops's
    # "fixed" bound): neither FLOPs nor HBM bandwidth limit them.
    fixed_bound_fraction: float = 0.0
    # Share of compute time the GPU waits on the host launching an eager step's kernels one by one, and on
    # the host's own time in a step (shares_of).
    launch_bound_fraction: float = 0.0
    host_bound_fraction: float = 0.0
    # shares_of the steps that hold a prompt, whose time is a first token's compute (empty: none).
    prompt_step_shares: dict[str, float] = field(default_factory=dict)
    # An agent loop's earlier model calls, whole (their decodes too), in its last call's TTFT: their mean
    # engine compute per request (0: no such calls).
    earlier_calls_compute_s: float = 0.0
    # What a queue's wait is for (_queue_clause): the engine's batch slots (max_num_seqs; 0: unknown) and
    # the share of them its steps hold on average, weighted by step time (a run's last steps, draining,
    # are short); the share of its KV cache its steps hold likewise (sim/document.py's _kv_full); and,
    # where prompts run in steps of their own while the decoding sequences pause
    # (EngineSpec.prefills_alone), those words.
    max_num_seqs: int = 0
    slots_held_fraction: float = 0.0
    kv_full_fraction: float = 0.0
    prompts_pause_decodes: str = ""

    @property
    def offered_rate_per_s(self) -> float:
        """Requests sent per second, first send to last: the load block's figure, so a closed loop's is
        the rate its sends reached, not its arrival schedule's (inf: all at once; nan: no load)."""
        return self.load.offered_per_s if self.load is not None else math.nan

    @property
    def shares(self) -> dict[str, float]:
        """The compute time's shares by what bounds them, as shares_of names them."""
        return {"memory": self.memory_bound_fraction, "fixed": self.fixed_bound_fraction,
                "launch": self.launch_bound_fraction, "host": self.host_bound_fraction}

    @property
    def bound(self) -> str:
        """What bounds the engine's compute (bound_of)."""
        return bound_of(self.shares)


# The bound each part of bound_times_s names, as the verdict words it.
BOUND_NAMES = {"memory": "HBM-bandwidth", "fixed": "kernel-overhead", "launch": "kernel-launch", "host": "host"}


def bound_of(shares: Mapping[str, float]) -> str:
    """What bounds compute time split as bound_times_s splits it (shares_of): "HBM-bandwidth", "kernel-overhead",
    "kernel-launch", "host" or "FLOP", whichever holds the largest share (ops bound by their fixed
    per-kernel cost are no FLOP-bound ops, nor is the time the GPU waits on its host: FLOP's share is the
    rest)."""
    named = {BOUND_NAMES[key]: shares.get(key, 0.0) for key in BOUND_NAMES}
    named["FLOP"] = max(0.0, 1.0 - sum(named.values()))
    return max(named, key=named.get)


def capacity_resource(evidence: Evidence) -> Resource:
    """The serial resource that limits how many requests per second the deployment serves: a saturated
    one-at-a-time resource (the busiest of them), else the busiest resource."""
    if not evidence.resources:
        return Resource("engine", "compute", evidence.busy_fraction, "", one_at_a_time=False)
    saturated = [r for r in evidence.resources if r.one_at_a_time and r.utilization >= SATURATED]
    return max(saturated or evidence.resources, key=lambda resource: resource.utilization)


def bottleneck(attribution_s: dict[str, Any], evidence: Evidence) -> tuple[str, str]:
    """(layer, reason). An overloaded run names the serial resource that limits capacity, the reason
    starting with "overloaded: offered X req/s, served Y req/s"; otherwise the layer that holds most of
    the metric users feel (module docstring). A saturated front end is named either way."""
    attribution_s = {part: attribution_s[part] for part in LAYER_OF_PART if part in attribution_s}
    load = evidence.load
    if load is not None and load.overloaded:
        return _overloaded(attribution_s, evidence, load)
    parts, metric = attribution_s, "e2e"
    missed = {name: share for name, share in evidence.slo_miss_share.items() if share >= FELT_MISS_SHARE}
    worst = max(missed, key=missed.get) if missed else None
    if worst in evidence.parts_s:  # else E2E's parts explain it (a run without the split of its metric)
        parts, metric = evidence.parts_s[worst], worst
    part = max(parts, key=parts.get)
    why = _explain(part, metric, parts, evidence)
    if worst is not None:
        why += (f"; {missed[worst]:.0%} of requests miss the {METRIC_NAMES[worst]} SLO of "
                f"{format_duration(evidence.slo_s[worst])}")
    elif "ttft" in evidence.parts_s:
        ttft = evidence.parts_s["ttft"]
        first = max(ttft, key=ttft.get)
        prompts = evidence.prompt_step_shares  # (a first token's compute: said where its bound is another)
        if first != part or (part == "compute" and prompts and bound_of(prompts) != evidence.bound):
            why += f"; TTFT: {_explain(first, 'ttft', ttft, evidence)}"
    saturated = [r for r in evidence.resources if r.front_end and r.utilization >= SATURATED]
    if saturated:
        why += f"; {max(saturated, key=lambda r: r.utilization).busy()}"
    if load is not None and load.caveat():
        why += f" ({load.caveat()})"
    return LAYER_OF_PART[part], why


def _overloaded(attribution_s: dict[str, float], evidence: Evidence, load: Load) -> tuple[str, str]:
    limit = capacity_resource(evidence)
    offered = _offered(load.offered_per_s)
    others = [f"the {r.name} {r.utilization:.0%}" for r in evidence.resources if r is not limit]
    reason = (f"overloaded: offered {offered}, served {format_number(load.served_per_s)} req/s; "
              f"{LAYER_OF_PART[limit.layer]} limits capacity: {limit.busy()}"
              f"{', ' + limit.why if limit.why else ''}" + (f" ({', '.join(others)})" if others else ""))
    reason += f"; signs: {', '.join(load.signs())}"
    total = sum(attribution_s.values()) or 1.0
    if max(attribution_s, key=attribution_s.get) == "queue":
        reason += f"; requests wait {attribution_s['queue'] / total:.0%} of E2E" + _queue_clause(
            "e2e", attribution_s["queue"], evidence)
    if load.caveat():
        reason += f" ({load.caveat()})"
    return LAYER_OF_PART[limit.layer], reason


def _offered(rate_per_s: float) -> str:
    return "all at once" if math.isinf(rate_per_s) else f"{format_number(rate_per_s)} req/s"


def _offered_at(rate_per_s: float) -> str:
    return "with every request sent at once" if math.isinf(rate_per_s) else \
        f"at {format_number(rate_per_s)} req/s offered"


def _bound_clause(shares: Mapping[str, float], time: str, are: str) -> str:
    """What bounds a share of compute time, in words: its memory-bound share, the one that bounds it where
    that is neither memory nor FLOPs."""
    bound = bound_of(shares)
    clause = f"{shares['memory']:.0%} of {time} is in memory-bound ops"
    if bound == "kernel-overhead":
        clause += f", {shares['fixed']:.0%} in fixed per-kernel costs"
    elif bound == "kernel-launch":
        clause += f", {shares['launch']:.0%} waiting on the host to launch eager steps' kernels one by one"
    elif bound == "host":
        clause += f", {shares['host']:.0%} waiting on the engine's host (scheduling, outputs)"
    return clause + f", so {are} {bound}-bound"


def _queue_clause(metric: str, queue_s: float, e: Evidence) -> str:
    """What `metric`'s `queue_s` of waiting is for, in words that follow "requests wait N% of METRIC": the
    request's first step (a TTFT's wait, felt.py), or the steps it sits out after its first token (TPOT's);
    E2E's holds both, and is said by the larger. A first step waits for a batch slot where the batch holds
    nearly every one (SLOTS_HELD), for KV cache where the cache is that full (KV_FULL), and otherwise
    behind the step in progress and the prompts ahead; a running request sits out the prompt steps an
    engine runs without its decodes, and its preemptions."""
    first_s = {"ttft": queue_s, "ttfv": queue_s, "tpot": 0.0}.get(
        metric, min(queue_s, e.parts_s.get("ttft", {}).get("queue", queue_s)))
    later_s = queue_s - first_s
    busy = f"the engine was busy {e.busy_fraction:.0%} of the time {_offered_at(e.offered_rate_per_s)}"
    preempted = f"{e.preemptions} preemptions"

    def of_it(part_s: float) -> str:  # the part's share of the wait, unless it is (nearly) all of it
        return "" if part_s >= 0.995 * queue_s else f", {part_s / queue_s:.0%} of it"

    if first_s < later_s:
        why = [e.prompts_pause_decodes] if e.prompts_pause_decodes else []
        return f"{of_it(later_s)} sitting out steps after their first token: " + ", ".join([*why, busy, preempted])
    if e.slots_held_fraction >= SLOTS_HELD:
        wait = (f"for a batch slot, {e.slots_held_fraction:.0%} of the engine's {e.max_num_seqs:,} held over its "
                "time")
    elif e.kv_full_fraction >= KV_FULL:
        wait = f"for KV cache, the cache {e.kv_full_fraction:.0%} full over the engine's time"
    else:
        wait = "for their first step, behind the step in progress and the prompts ahead"
    return f"{of_it(first_s)} {wait}: {busy}, {preempted}"


def _explain(part: str, metric: str, parts: dict[str, float], e: Evidence) -> str:
    """Why `part` holds its share of `metric`, in words."""
    share = parts[part] / (sum(parts.values()) or 1.0)
    of = f"{share:.0%} of {METRIC_NAMES[metric]}"
    if part == "queue":
        return f"requests wait {of}" + _queue_clause(metric, parts[part], e)
    if part == "compute":
        first_token = metric in ("ttft", "ttfv")
        if first_token and e.earlier_calls_compute_s >= 0.5 * parts[part]:  # (an agent's earlier calls, whole)
            return (f"{of} is engine compute, {e.earlier_calls_compute_s / parts[part]:.0%} of it the earlier "
                    f"model calls of each request's loop, decoding included, at a mean batch of "
                    f"{e.mean_batch_seqs:.0f} sequences; " + _bound_clause(e.shares, "compute time", "steps are"))
        if first_token and e.prompt_step_shares:  # (a first token's compute is its prompt's steps)
            return f"{of} is engine compute in steps that hold prompts; " + _bound_clause(
                e.prompt_step_shares, "their time", "they are")
        return (f"{of} is engine compute at a mean batch of {e.mean_batch_seqs:.0f} sequences; "
                + _bound_clause(e.shares, "compute time", "steps are"))
    if part == "traffic":
        return f"{of} is fabric traffic: {e.traffic_detail}"
    if part == "application":
        stages = {name: time_s for name, time_s in e.application_detail_s.items()
                  if metric == "e2e" or name in e.application_before}
        where = "the application's stages" + ("" if metric == "e2e" else " before the model call")
        if not stages or not any(stages.values()):
            return f"{of} is {where}"
        name = max(stages, key=stages.get)
        return f"{of} is {where}, most of it {name} ({format_duration(stages[name])} mean on the critical path)"
    rtt = f"a {format_number(e.network_rtt_s * 1e3)} ms client round trip"
    host = f"detokenizing in the {e.detokenize}, the host blocking {e.host_share_of_step:.0%} of each step"
    front_s = e.delivery_detail_s.get("frontend_queue", 0.0) + e.delivery_detail_s.get("frontend_work", 0.0)
    if metric == "e2e" and front_s >= 0.5 * parts[part]:
        queue_s = e.delivery_detail_s.get("frontend_queue", 0.0)
        return (f"{of} is the last mile, {front_s / parts[part]:.0%} of it the front end's processes "
                f"({queue_s / front_s:.0%} of that waiting for a busy one); {rtt}")
    network_s = e.network_s.get(metric, 0.0)
    if metric in ("ttft", "ttfv") and e.front_in_s >= 0.5 * parts[part]:
        return (f"{of} is the last mile, {e.front_in_s / parts[part]:.0%} of it the front end's processes taking "
                f"the prompt in (parse, template, tokenize, and waiting for a busy one); {rtt}")
    if network_s >= 0.5 * parts[part]:
        return f"{of} is the last mile, {network_s / parts[part]:.0%} of it the network: {rtt}; {host}"
    return f"{of} is the last mile: {rtt}, and {host}"


def sample_steps(steps: np.ndarray, samples: int = 100) -> np.ndarray:
    """Up to `samples` evenly spaced of the step indices `steps`."""
    return steps[::max(1, len(steps) // samples)]


# The parts bound_times_s splits compute time into: ops by the bound step_ops gives them, then the host's.
TIME_PARTS = ("compute", "memory", "fixed", "launch", "host")


def bound_times_s(compute: ComputeModel, steps: list[tuple]) -> dict[str, float]:
    """The compute time of the given steps in parts: their ops by the bound step_ops gives them ("compute",
    "memory", "fixed"), the time an eager step waits on its host's launches ("launch") and on the host's own
    time ("host"), as step_time_s makes the step (ComputeModel.step_parts_s; `steps` rows are its
    arguments)."""
    times = dict.fromkeys(TIME_PARTS, 0.0)
    for step in steps:
        ops, launch_s, host_s = compute.step_parts_s(*step)
        for op in ops:
            times[op.bound] += op.time_s
        times["launch"] += launch_s
        times["host"] += host_s
    return times


def shares_of(times_s: dict[str, float]) -> dict[str, float]:
    """Each part's share of the time (bound_times_s's parts); none of none."""
    total_s = sum(times_s.values())
    return {bound: time_s / total_s if total_s else 0.0 for bound, time_s in times_s.items()}
