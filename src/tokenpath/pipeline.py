"""simulate: scenario -> workload -> engine(compute, fabric) -> delivery -> Run.

This is the only place that composes the engine with the delivery path; the layers stay leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tokenpath import continuity
from tokenpath.assumptions import Assumptions
from tokenpath.compute.chip import ChipSpec, load_chip
from tokenpath.compute.model import ModelSpec, load_model
from tokenpath.compute.roofline import ComputeModel
from tokenpath.delivery.lastmile import LastMile, first_visible_index
from tokenpath.engine.costs import GroupStepCosts
from tokenpath.engine.host_time import host_step_cost
from tokenpath.engine.cluster import run_cluster
from tokenpath.engine.loop import EngineTrace, run_engine
from tokenpath.engine.routing import static_assignment
from tokenpath.errors import UserError
from tokenpath.engine.placement import Placement, place
from tokenpath.fabric.build import build_topology, default_fabric
from tokenpath.fabric.collectives import Collectives
from tokenpath.fabric.spec import SwitchFabric
from tokenpath.fabric.topology import Topology
from tokenpath.forked import available_cpus, can_fork, map_forked
from tokenpath.run import Run, itl_gaps_ns
from tokenpath.scenario import Scenario
from tokenpath.summary import LogHistogram
from tokenpath.workload import Requests, generate

# Independent random streams derived from the scenario seed, so adding draws to one layer never
# shifts another's.
_WORKLOAD_STREAM, _DELIVERY_STREAM = 0, 1


def _rng(scenario: Scenario, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(scenario.seed).spawn(2)[stream])


@dataclass(frozen=True)
class Deployment:
    """The resolved hardware and models of a scenario, shared by every replica."""

    model: ModelSpec
    chip: ChipSpec
    compute: ComputeModel
    topology: Topology
    collectives: Collectives
    placement: Placement
    costs: GroupStepCosts
    kv_capacity_tokens: int   # per engine
    replicas: int             # engines: data-parallel replicas x pipeline batches in flight
    fabric_name: str = ""     # what the fabric is, and whether it is the chip's default


@dataclass(frozen=True)
class Simulation:
    scenario: Scenario
    deployment: Deployment
    requests: Requests
    run: Run
    traces: list[EngineTrace]


def build_deployment(scenario: Scenario, assumptions: Assumptions | None = None) -> Deployment:
    """Resolve names, check the configuration is possible, place the chips and size the KV cache,
    under the scenario's assumptions, or `assumptions` where given (the objects built keep the values they
    read).

    Pipeline parallelism runs as `pp` batches in flight per replica (vLLM's virtual engines): each is
    an engine of its own whose step crosses every stage, with 1/pp of the replica's KV cache.
    """
    with (assumptions or scenario.resolved_assumptions()).active():
        return _build_deployment(scenario)


def _build_deployment(scenario: Scenario) -> Deployment:
    dep = scenario.deployment
    group = dep.tp * dep.pp
    if group > dep.chips:
        raise UserError(f"deployment.tp: tp*pp = {group} is larger than deployment.chips ({dep.chips}); "
                        "lower --tp/pp or raise --chips")
    if dep.chips % group:
        raise UserError(f"deployment.chips: {dep.chips} chips do not split into replicas of tp*pp={group}; "
                        f"use a multiple of {group}")
    model = load_model(scenario.model_source())
    chip = load_chip(dep.chip)
    if model.num_heads % dep.tp:
        raise UserError(f"deployment.tp: {model.name} has {model.num_heads} attention heads, not divisible by tp={dep.tp}")
    if model.num_layers % dep.pp:
        raise UserError(f"deployment.pp: {model.name} has {model.num_layers} layers, not divisible by pp={dep.pp}")
    if dep.prefill_replicas and not dep.prefill_replicas < dep.replicas:
        raise UserError(f"deployment.prefill_replicas: {dep.prefill_replicas} of {dep.replicas} replicas leaves none "
                        "to decode; use fewer, or more chips")
    if dep.prefill_replicas and dep.pp > 1:
        raise UserError("deployment.prefill_replicas: disaggregated serving is modelled with pp = 1 only")
    if dep.prefill_replicas and dep.routing != "round_robin":
        raise UserError(f"deployment.routing: disaggregated serving routes round-robin only (got {dep.routing}); "
                        "set routing = \"round_robin\" or prefill_replicas = 0")
    if dep.prefill_replicas and scenario.workload.sessions is not None:
        raise UserError("deployment.prefill_replicas: disaggregated serving is modelled without multi-turn sessions; "
                        "remove workload.sessions or set prefill_replicas = 0")
    if dep.prefill_replicas and scenario.workload.max_concurrency is not None:
        raise UserError("deployment.prefill_replicas: disaggregated serving needs open-loop arrivals; "
                        "unset workload.max_concurrency")
    engine = scenario.engine
    host = host_step_cost(engine.scheduler, engine.host_overlap, engine.num_scheduler_steps)
    compute = ComputeModel(model, chip, dep.tp, scenario.model.precision, scenario.model.kv_precision(engine.scheduler),
                           pp=dep.pp, cuda_graphs=engine.cuda_graphs, cuda_graph_max_tokens=engine.cuda_graph_max_tokens,
                           expert_replicas=dep.replicas if dep.expert_parallel and model.is_moe else 1,
                           host_step_s=host.step_s, host_per_sequence_s=host.per_sequence_s,
                           host_overlapped=host.overlapped)
    kv_tokens = compute.kv_capacity_tokens(engine.gpu_memory_utilization, engine.max_num_batched_tokens,
                                           engine.max_num_seqs * dep.pp) // dep.pp
    fabric, fabric_name = dep.fabric, f"{dep.fabric.kind} given in deployment.fabric"
    if fabric == SwitchFabric():  # none given (or only its defaults): the chip's own, nodes beyond its domain
        fabric, fabric_name = default_fabric(chip.name, dep.chips, chip.scaleup_domain, chip.scaleup, chip.nic_bw_Bps)
    topology = build_topology(fabric, chip.scaleup_bw_Bps, dep.chips)
    placement = place(dep.placement, dep.replicas, dep.pp, dep.tp, topology.hosts)
    collectives = Collectives(topology, fabric.algorithm)
    costs = GroupStepCosts(compute, collectives, placement, dep.expert_parallel)
    return Deployment(model, chip, compute, topology, collectives, placement, costs, kv_tokens,
                      dep.replicas * dep.pp, fabric_name)


def _check_fits(requests: Requests, deployment: Deployment, scenario: Scenario) -> None:
    total = requests.input_tokens + requests.output_tokens
    worst = int(np.argmax(total))
    longest = int(total[worst])
    if longest > deployment.model.max_context:
        raise UserError(
            f"workload: request {worst} needs {longest} tokens of context but {deployment.model.name} holds "
            f"{deployment.model.max_context}; lower the input/output lengths (or their max)"
        )
    needed, held = longest, deployment.kv_capacity_tokens
    if scenario.engine.kv_admission == "reserve":  # TensorRT-LLM reserves whole blocks for the whole cache
        block = scenario.engine.block_size
        needed, held = -(-longest // block) * block, held // block * block
    if needed > held:
        raise UserError(
            f"workload: request {worst} needs {needed} tokens of KV cache but one replica holds "
            f"{held}; raise --tp, use fp8, or lower the lengths"
        )
    if not scenario.engine.chunked_prefill and longest > scenario.engine.max_num_batched_tokens:
        raise UserError(
            f"engine.max_num_batched_tokens: request {worst} needs {longest} tokens in one step without chunked "
            "prefill; enable engine.chunked_prefill or raise max_num_batched_tokens"
        )


# Token times are built this many at a time, so memory stays bounded however long the run.
CHUNK_TOKENS = 2_000_000
# Runs with more output tokens than this keep per-request results and an ITL histogram only.
KEEP_TOKENS_LIMIT = 20_000_000


@dataclass(frozen=True)
class Served:
    """What the server side did for a set of requests: per request (input order) the time it was sent
    and its summed compute, traffic and delivery (upload and host blocking) time, the end of the step
    that made its last token, and when each token left the server (`leave_ns(lo, hi)`: the flat token
    times of requests lo..hi-1)."""

    sent_ns: np.ndarray
    compute_ns: np.ndarray
    traffic_ns: np.ndarray
    delivery_ns: np.ndarray
    last_step_end_ns: np.ndarray
    token_offsets: np.ndarray
    leave_ns: Callable[[int, int], np.ndarray]
    first_step_start_ns: np.ndarray | None = None  # when each request's first step (its prefill) began
    times_preempted: np.ndarray | None = None

    @staticmethod
    def of(trace: EngineTrace) -> Served:
        return Served(trace.sent_ns, trace.compute_ns, trace.traffic_ns, trace.delivery_ns, trace.last_step_end_ns,
                      trace.token_offsets, lambda lo, hi: trace.step_leave_ns[trace.token_steps(lo, hi)],
                      trace.first_step_start_ns, trace.times_preempted)


def _replica_run(trace: Served, requests: Requests, scheduled_ns: np.ndarray, last_mile: LastMile,
                 visible: np.ndarray, keep_tokens: bool, itl: LogHistogram | None,
                 flow_spec: continuity.ContinuitySpec = continuity.DEFAULT) -> dict[str, np.ndarray]:
    """Per-request client-side timings of one replica, with exact attribution.

    With `keep_tokens` the result holds every token's arrival at the client ("token_client_ns");
    otherwise ITL gaps go into `itl`.
    """
    n = len(requests)
    offsets = trace.token_offsets
    first_leave, ttft, ttfv, last_client, stalls, stall_ns = (np.empty(n, np.int64) for _ in range(6))
    qoe = np.empty(n)
    tokens = np.empty(offsets[-1], np.int64) if keep_tokens else None
    lo = 0
    while lo < n:
        hi = min(n, max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + CHUNK_TOKENS, side="right")) - 1))
        local = offsets[lo:hi + 1] - offsets[lo]
        leave_ns = trace.leave_ns(lo, hi)
        client_ns = last_mile.client_times_ns(leave_ns, local)
        first = local[:-1]
        first_leave[lo:hi] = leave_ns[first]
        ttft[lo:hi] = client_ns[first]
        ttfv[lo:hi] = client_ns[first + visible[lo:hi]]
        last_client[lo:hi] = client_ns[local[1:] - 1]
        flow = continuity.per_request(client_ns, local, trace.sent_ns[lo:hi], ttfv[lo:hi], flow_spec)
        stalls[lo:hi], stall_ns[lo:hi], qoe[lo:hi] = flow["stalls"], flow["stall_ns"], flow["qoe"]
        if tokens is not None:
            tokens[offsets[lo]:offsets[hi]] = client_ns
        else:
            itl.add(itl_gaps_ns(client_ns, local))
        lo = hi
    e2e = last_client - trace.sent_ns
    delivery = trace.delivery_ns + (last_client - trace.last_step_end_ns)
    queue = e2e - trace.compute_ns - trace.traffic_ns - delivery
    if (queue < 0).any():
        raise AssertionError("attribution exceeds end-to-end time: the engine's accounting is broken")
    part = {
        "scheduled_ns": scheduled_ns,
        "sent_ns": trace.sent_ns,
        "input_tokens": requests.input_tokens,
        "output_tokens": requests.output_tokens,
        "ttft_ns": ttft - trace.sent_ns,
        "ttft_engine_ns": first_leave - trace.sent_ns,
        "ttfv_ns": ttfv - trace.sent_ns,
        "e2e_ns": e2e,
        "queue_ns": queue,
        "compute_ns": trace.compute_ns,
        "traffic_ns": trace.traffic_ns,
        "delivery_ns": delivery,
        "engine_done_ns": trace.last_step_end_ns,
        "stalls": stalls,
        "stall_ns": stall_ns,
        "qoe": qoe,
    }
    if trace.first_step_start_ns is not None:
        part["prefill_start_ns"] = trace.first_step_start_ns
    if trace.times_preempted is not None:
        part["preemptions"] = trace.times_preempted
    if tokens is not None:
        part["token_client_ns"] = tokens
    return part


def _merge(parts: list[dict[str, np.ndarray]], owners: list[np.ndarray], n: int, itl: LogHistogram | None) -> Run:
    """Put replica rows back in workload order and rebuild the flat token array."""
    fields: dict[str, np.ndarray] = {}
    for key in parts[0]:
        if key == "token_client_ns":
            continue
        merged = np.empty(n, dtype=parts[0][key].dtype)
        for part, rows in zip(parts, owners):
            merged[rows] = part[key]
        fields[key] = merged
    offsets = np.concatenate([[0], np.cumsum(fields["output_tokens"])]).astype(np.int64)
    if itl is not None:
        return Run(source="simulate", token_client_ns=None, token_offsets=offsets, itl_histogram=itl, **fields)
    tokens = np.empty(offsets[-1], np.int64)
    for part, rows in zip(parts, owners):
        lengths = part["output_tokens"]
        local_starts = np.cumsum(lengths) - lengths
        shift = np.repeat(offsets[rows] - local_starts, lengths)
        tokens[shift + np.arange(len(shift))] = part["token_client_ns"]
    return Run(source="simulate", token_offsets=offsets, token_client_ns=tokens, **fields)


@dataclass(frozen=True)
class Prepared:
    """A scenario checked and resolved, ready to simulate: every user error surfaces here."""

    scenario: Scenario
    deployment: Deployment
    requests: Requests


def prepare(scenario: Scenario) -> Prepared:
    """Resolve the deployment and draw the workload, checking that every request can be served."""
    deployment = build_deployment(scenario)
    requests = generate(scenario.resolved_workload(), _rng(scenario, _WORKLOAD_STREAM))
    _check_fits(requests, deployment, scenario)
    return Prepared(scenario, deployment, requests)


def simulate(scenario: Scenario | Prepared, progress: Callable[[int], None] | None = None,
             workers: int | None = None) -> Simulation:
    """Simulate the scenario end to end. `progress(k)` is called as k more requests finish.

    Data-parallel replicas are simulated by up to `workers` forked processes where the platform can
    fork (unset: one per available CPU when the run has at least PARALLEL_MIN_REQUESTS requests,
    else in this process). The result does not depend on the number of workers.
    """
    prepared = scenario if isinstance(scenario, Prepared) else prepare(scenario)
    scenario, deployment, requests = prepared.scenario, prepared.deployment, prepared.requests
    visible = first_visible_index(
        requests.output_tokens, scenario.resolved_delivery().invisible_token_fraction, _rng(scenario, _DELIVERY_STREAM)
    )
    scheduled_ns = np.rint(requests.arrival_s * 1e9).astype(np.int64)
    delivery = scenario.resolved_delivery()
    n, replicas = len(requests), deployment.replicas
    concurrency = scenario.workload.max_concurrency
    keep_tokens = int(requests.output_tokens.sum()) <= KEEP_TOKENS_LIMIT
    if scenario.deployment.prefill_replicas:
        itl = None if keep_tokens else LogHistogram()
        run, traces = _disaggregated(prepared, scheduled_ns, visible, keep_tokens, itl, progress)
        return Simulation(scenario, deployment, requests, replace(run, continuity=scenario.continuity.spec()), traces)

    policy = scenario.deployment.routing
    sessions = requests.sessions
    # Sessions' later turns wait for the turn before: -1 for a request sent at its scheduled time.
    think_ns = None if sessions is None else np.where(sessions.turn > 0, np.rint(sessions.think_s * 1e9), -1).astype(np.int64)
    # Round-robin moves a session's turns between replicas, so they must share a clock too.
    apart = policy == "session_affinity" or (policy == "round_robin" and sessions is None)
    if apart or replicas == 1:
        assignment = static_assignment(policy, n, replicas, requests.prefixes,
                                       None if sessions is None else sessions.session)
        joint: list[EngineTrace] = []
    else:  # the router looks at the replicas as requests come: all of them in this process
        last_miles = [LastMile(delivery) for _ in range(replicas)]
        assignment, joint, joint_rows = run_cluster(
            scheduled_ns, requests.input_tokens, requests.output_tokens, requests.prefixes, deployment.costs,
            last_miles, scenario.engine, deployment.kv_capacity_tokens, policy, concurrency, progress, think_ns)

    def routed(replica: int) -> np.ndarray:
        return joint_rows[replica] if joint else np.flatnonzero(assignment == replica)

    def serve(replica: int, progress: Callable[[int], None] | None) -> tuple[dict, EngineTrace, LogHistogram | None]:
        rows = routed(replica)
        itl = None if keep_tokens else LogHistogram()
        if joint:  # (its rows in routing order, which sessions' later turns can make other than the input order)
            sub = Requests(np.zeros(len(rows)), requests.input_tokens[rows], requests.output_tokens[rows])
            last_mile, trace = last_miles[replica], joint[replica]
        else:
            sub = requests.take(rows)
            # A concurrency cap is shared out evenly between the replicas.
            share = None if concurrency is None else max(1, concurrency // replicas + (replica < concurrency % replicas))
            last_mile = LastMile(delivery)
            trace = run_engine(
                scheduled_ns[rows], sub.input_tokens, sub.output_tokens, deployment.costs, last_mile,
                scenario.engine, deployment.kv_capacity_tokens, share, progress, prefixes=sub.prefixes,
                think_ns=None if think_ns is None else think_ns[rows],
            )
        scheduled = scheduled_ns[rows]
        if sessions is not None:  # a later turn is meant to go when it went: its think time after the last answer
            scheduled = np.where(think_ns[rows] >= 0, trace.sent_ns, scheduled)
        part = _replica_run(Served.of(trace), sub, scheduled, last_mile, visible[rows], keep_tokens, itl,
                            scenario.continuity.spec())
        part["prefix_hit_tokens"] = trace.prefix_hit_tokens
        part["replica"] = np.full(len(rows), replica, np.int64)
        return part, trace, itl

    serving = [r for r in range(replicas) if (assignment == r).any()]  # a replica with no requests does nothing
    workers = min(len(serving), _default_workers(n) if workers is None else workers)
    if workers > 1 and can_fork() and not joint:
        results = map_forked(serve, serving, workers, progress)
    else:
        results = [serve(replica, progress) for replica in serving]
    parts, traces, itls = zip(*results)
    owners = [routed(replica) for replica in serving]
    itl = None if keep_tokens else LogHistogram.merged(itls)
    run = replace(_merge(list(parts), owners, n, itl), continuity=scenario.continuity.spec())
    return Simulation(scenario, deployment, requests, run, list(traces))


# Below this many requests a run is over before forking workers would pay off.
PARALLEL_MIN_REQUESTS = 20_000


def _default_workers(num_requests: int) -> int:
    return available_cpus() if num_requests >= PARALLEL_MIN_REQUESTS else 1


class _Proxy:
    """The host side of a decode engine in disaggregated serving: requests come from the prefill
    engines (their KV transfer is traffic), so there is no client upload; the rest is the last mile's."""

    def __init__(self, last_mile: LastMile) -> None:
        self.last_mile = last_mile
        self.stream_interval = last_mile.stream_interval

    def upload_ns(self, input_tokens: int) -> int:
        return 0

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int]:
        return self.last_mile.on_step(gpu_end_ns, emitted, events)

    def last_event_arrival_ns(self, leave_ns: int, output_tokens: int) -> int:
        return self.last_mile.last_event_arrival_ns(leave_ns, output_tokens)


def _disaggregated(prepared: Prepared, scheduled_ns: np.ndarray, visible: np.ndarray, keep_tokens: bool,
                   itl: LogHistogram | None, progress: Callable[[int], None] | None) -> tuple[Run, list[EngineTrace]]:
    """Prefill replicas make each request's KV cache and first token; the KV crosses the fabric to a
    decode replica, which makes the remaining tokens with the prompt (and the first token) cached.

    Requests go round-robin to the prefill replicas, and round-robin again to the decode replicas.
    The client's stream carries the first token from the prefill replica and the rest from the decode
    replica, each through the last mile. The KV transfer, waiting for its links included, is traffic.
    """
    scenario, deployment, requests = prepared.scenario, prepared.deployment, prepared.requests
    n = len(requests)
    prefills = scenario.deployment.prefill_replicas
    decodes = deployment.replicas - prefills
    delivery, engine, costs = scenario.resolved_delivery(), scenario.engine, deployment.costs
    inputs, outputs = requests.input_tokens, requests.output_tokens
    traces: list[EngineTrace] = []

    # Prefill: every request for one token.
    sent, compute, traffic, host_ns, prefill_start, preempted = (np.zeros(n, np.int64) for _ in range(6))
    first_end, first_leave = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for p in range(prefills):
        rows = np.arange(p, n, prefills)
        if len(rows) == 0:
            continue
        prefixes = None if requests.prefixes is None else requests.prefixes.take(rows)
        trace = run_engine(scheduled_ns[rows], inputs[rows], np.ones(len(rows), np.int64), costs,
                           LastMile(delivery), engine, deployment.kv_capacity_tokens, prefixes=prefixes)
        traces.append(trace)
        sent[rows], compute[rows], traffic[rows] = trace.sent_ns, trace.compute_ns, trace.traffic_ns
        host_ns[rows] = trace.delivery_ns
        prefill_start[rows], preempted[rows] = trace.first_step_start_ns, trace.times_preempted
        first_end[rows] = trace.last_step_end_ns
        first_leave[rows] = trace.step_leave_ns[trace.token_steps()]
    if progress is not None:
        progress(int((outputs == 1).sum()))

    # KV transfer, then decode of the remaining tokens.
    # Only requests with tokens left to make move their KV cache; one whose only token came from the
    # prefill replica is finished there.
    prefill_of = np.arange(n) % prefills
    decode_of = prefills + np.arange(n) % decodes
    moving = np.flatnonzero(outputs > 1)
    decode_arrival = first_end.copy()
    decode_arrival[moving] = _kv_transfers(first_end[moving], inputs[moving], prefill_of[moving], decode_of[moving],
                                           costs, deployment.replicas)
    transfer = decode_arrival - first_end
    last_end = first_end.copy()
    rest_leave = np.zeros(int(outputs.sum()) - n, np.int64)
    rest_offsets = np.concatenate([[0], np.cumsum(outputs - 1)]).astype(np.int64)
    for d in range(prefills, deployment.replicas):
        rows = np.flatnonzero((decode_of == d) & (outputs > 1))
        if len(rows) == 0:
            continue
        rows = rows[np.argsort(decode_arrival[rows], kind="stable")]
        trace = run_engine(decode_arrival[rows], inputs[rows] + 1, outputs[rows] - 1, costs,
                           _Proxy(LastMile(delivery)), engine, deployment.kv_capacity_tokens,
                           progress=progress, cached_tokens=inputs[rows])
        traces.append(trace)
        compute[rows] += trace.compute_ns
        traffic[rows] += trace.traffic_ns
        host_ns[rows] += trace.delivery_ns
        preempted[rows] += trace.times_preempted
        last_end[rows] = trace.last_step_end_ns
        leave = trace.step_leave_ns[trace.token_steps()]
        local = trace.token_offsets
        for k, i in enumerate(rows):  # place each request's tokens at its own offset
            rest_leave[rest_offsets[i]:rest_offsets[i + 1]] = leave[local[k]:local[k + 1]]
    traffic += transfer

    offsets = np.concatenate([[0], np.cumsum(outputs)]).astype(np.int64)
    leave_all = np.empty(offsets[-1], np.int64)
    leave_all[offsets[:-1]] = first_leave
    rest_positions = np.setdiff1d(np.arange(offsets[-1]), offsets[:-1], assume_unique=True)
    leave_all[rest_positions] = rest_leave
    served = Served(sent, compute, traffic, host_ns, last_end, offsets,
                    lambda lo, hi: leave_all[offsets[lo]:offsets[hi]], prefill_start, preempted)
    part = _replica_run(served, requests, scheduled_ns, LastMile(delivery), visible, keep_tokens, itl,
                        prepared.scenario.continuity.spec())
    # A request's replica is the one that made its last token: its decode replica, unless it had one token.
    part["replica"] = np.where(outputs > 1, decode_of, prefill_of)
    return _merge([part], [np.arange(n)], n, itl), traces


def _kv_transfers(ready_ns: np.ndarray, prompt_tokens: np.ndarray, src: np.ndarray, dst: np.ndarray,
                  costs: GroupStepCosts, replicas: int) -> np.ndarray:
    """When each request's KV cache has reached its decode replica.

    Transfers start when the prefill is done, in that order, and queue first come first served for
    the sending replica's links and the receiving replica's: one transfer at a time leaves a prefill
    replica and one arrives at a decode replica. Links further inside the network are not shared
    between transfers of different replica pairs.
    """
    done = np.empty(len(ready_ns), np.int64)
    free_ns = [0] * replicas  # when each replica's links are next free
    for i in np.argsort(ready_ns, kind="stable").tolist():
        s, d = int(src[i]), int(dst[i])
        start = max(int(ready_ns[i]), free_ns[s], free_ns[d])
        done[i] = free_ns[s] = free_ns[d] = start + round(costs.kv_transfer_s(int(prompt_tokens[i]), s, d) * 1e9)
    return done
