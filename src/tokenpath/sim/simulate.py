"""simulate: scenario -> deployment, workload -> engines (routed across replicas) -> client side -> Run.

This is the only place that composes the engine with the delivery path (through served.py); the
layers stay leaves. deployment.py resolves the hardware, disaggregated.py runs prefill and decode
pools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from tokenpath.application.timeline import Timeline
from tokenpath.config.memory import KEEP_TOKENS_LIMIT
from tokenpath.delivery.lastmile import LastMile, first_visible_index
from tokenpath.engine.cluster import run_cluster
from tokenpath.engine.loop import EngineTrace, run_engine
from tokenpath.engine.routing import static_assignment
from tokenpath.sim.agent import AgentPlan, check_calls, last_calls
from tokenpath.sim.application import model_calls, question_tokens, with_application
from tokenpath.sim.deployment import Deployment, build_deployment, check_fits
from tokenpath.sim.disaggregated import simulate_disaggregated
from tokenpath.sim.document import result_document
from tokenpath.sim.forked import available_cpus, can_fork, map_forked
from tokenpath.sim.run import Run
from tokenpath.sim.scenario import Scenario
from tokenpath.sim.served import Served, client_side, merge_parts
from tokenpath.sim.shared_stage import SharedStage, shared_calls, shared_stage
from tokenpath.sim.summary import LogHistogram
from tokenpath.workload import Requests, generate

# Independent random streams derived from the scenario seed, so adding draws to one layer never
# shifts another's.
_WORKLOAD_STREAM, _DELIVERY_STREAM, _APPLICATION_STREAM = 0, 1, 2


def _rng(scenario: Scenario, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(scenario.seed).spawn(3)[stream])


@dataclass(frozen=True)
class Simulation:
    """A finished simulation: the scenario, its resolved deployment, the requests drawn, each request's
    timings (`run`) and each engine's steps (`traces`)."""

    scenario: Scenario
    deployment: Deployment
    requests: Requests  # with an agent loop, each user request's last call: a row per row of `run`
    run: Run
    traces: list[EngineTrace]
    # Disaggregated runs: how long each replica's links were busy moving KV caches (a serial resource).
    kv_link_busy_ns: np.ndarray | None = None

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The result document (`tokenpath simulate --json`: the summary schema, docs/design.md), built on
        first use."""
        return result_document(self)[0]


@dataclass(frozen=True)
class Prepared:
    """A scenario checked and resolved, ready to simulate: every user error surfaces here."""

    scenario: Scenario
    deployment: Deployment
    requests: Requests  # as the engine sees them: with an [application], the model calls
    # per request (the requests' order), the stages around the model call; with an agent loop, around its calls
    application: Timeline | AgentPlan | None = None
    # With a stage on the deployment's GPU: its jobs, and `requests` are the user's sends, in their order,
    # each model call sent as the engine runs (sim/shared_stage.py); the timeline comes after the run.
    shared: SharedStage | None = None


def prepare(scenario: Scenario) -> Prepared:
    """Resolve the deployment and draw the workload, checking that every request can be served."""
    deployment = build_deployment(scenario)
    app = scenario.application
    requests = generate(scenario.resolved_workload(), _rng(scenario, _WORKLOAD_STREAM),
                        check=None if app else lambda drawn: check_fits(drawn, deployment, scenario))
    if app is None:
        return Prepared(scenario, deployment, requests)
    assumptions = scenario.resolved_assumptions()  # served stages' and retrieval indexes' times read them
    rng = _rng(scenario, _APPLICATION_STREAM)
    # (the stages run once a request has reached the server: the engine's way there, LastMile.upload_ns)
    upload_ns = LastMile(scenario.resolved_delivery(), deployment.front_end).upload_ns
    with assumptions.active():
        if shared_stage(app) is not None:
            requests, jobs = shared_calls(app, requests, rng, scenario, deployment.chip, assumptions, upload_ns)
            check_fits(requests, deployment, scenario)
            return Prepared(scenario, deployment, requests, shared=jobs)
        requests, laid = model_calls(app, requests, rng, assumptions, question_tokens(requests, scenario.workload),
                                     upload_ns)
    if isinstance(laid, AgentPlan):
        check_calls(scenario, requests, deployment)
    else:
        check_fits(requests, deployment, scenario)
    return Prepared(scenario, deployment, requests, laid)


def simulate(scenario: Scenario | Prepared, progress: Callable[[int], None] | None = None,
             workers: int | None = None, continuity: bool = True, token_times: bool = True) -> Simulation:
    """Simulate the scenario end to end. `progress(k)` is called as k more requests finish.

    Data-parallel replicas are simulated by up to `workers` forked processes where the platform can
    fork (unset: one per available CPU when the run has at least PARALLEL_MIN_REQUESTS requests,
    else in this process). The result does not depend on the number of workers. `continuity`: judge
    each request's stalls and QoE as it is simulated (sim/continuity.py); a caller that reads only
    latencies and throughput passes False, and a summary judges them from the token times if asked.
    `token_times`: keep every token's arrival at the client in the run (up to KEEP_TOKENS_LIMIT output
    tokens; beyond, their gaps go into an ITL histogram); a caller that reads only per-request figures
    (TTFT, TPOT, E2E, throughput) passes False, and the run holds neither (on a run of millions of tokens,
    writing them takes much of the time).
    """
    prepared = scenario if isinstance(scenario, Prepared) else prepare(scenario)
    simulation = _simulate(prepared, progress, workers, continuity, token_times)
    laid = prepared.application if prepared.shared is None else prepared.shared.laid()
    if laid is None:
        return simulation
    simulation = replace(simulation, run=with_application(simulation.run, laid))
    if isinstance(laid, AgentPlan):  # a row per user request, as the run's: its last call
        simulation = replace(simulation, requests=last_calls(simulation.requests, laid))
    return simulation


def _warmup_rows(application: Timeline | AgentPlan | None, rows: int, skipped: int) -> np.ndarray:
    """Per model call's row, whether it belongs to one of the user's first `skipped` sends (the warm-up, whose
    gaps an ITL histogram leaves out; an agent's: all its calls). With an application the rows are in the
    order the calls reach the server (model_calls' `request_index`), which its stages can change (Run.after
    drops the same requests)."""
    if application is None:
        return np.arange(rows) < skipped
    if isinstance(application, AgentPlan):
        return np.repeat(application.outer.request_index < skipped, application.calls)
    return application.request_index < skipped


def _simulate(prepared: Prepared, progress: Callable[[int], None] | None, workers: int | None,
              continuity: bool = True, token_times: bool = True) -> Simulation:
    scenario, deployment, requests = prepared.scenario, prepared.deployment, prepared.requests
    delivery = scenario.resolved_delivery()  # reads the scenario's calibration files: once
    visible = first_visible_index(requests.output_tokens, delivery.invisible_token_fraction,
                                  _rng(scenario, _DELIVERY_STREAM))
    scheduled_ns = np.rint(requests.arrival_s * 1e9).astype(np.int64)
    n, replicas = len(requests), deployment.replicas
    concurrency = scenario.workload.max_concurrency
    keep_tokens = token_times and int(requests.output_tokens.sum()) <= KEEP_TOKENS_LIMIT
    gaps_only = token_times and not keep_tokens  # the tokens' gaps in a histogram, their times not kept
    warmup = _warmup_rows(prepared.application, n, scenario.workload.warmup_requests)
    # With an application, the user sent each request before its model call was scheduled.
    user_sent_ns = None if prepared.application is None else scheduled_ns - prepared.application.pre_ns
    if prepared.shared is not None:  # (its requests are the user's sends)
        user_sent_ns = scheduled_ns
    if scenario.deployment.prefill_replicas:
        itl = LogHistogram() if gaps_only else None
        run, traces, link_busy_ns = simulate_disaggregated(scenario, deployment, requests, scheduled_ns, visible,
                                                           keep_tokens, itl, warmup, progress, user_sent_ns,
                                                           continuity)
        return Simulation(scenario, deployment, requests, replace(run, continuity=scenario.continuity.spec()), traces,
                          link_busy_ns)

    policy = scenario.deployment.routing
    sessions = requests.sessions
    shared = prepared.shared  # its jobs hold each request back until they are done on its replica's GPU
    # Sessions' later turns wait for the turn before: -1 for a request sent at its scheduled time.
    think_ns = (None if sessions is None
                else np.where(sessions.turn > 0, np.rint(sessions.think_s * 1e9), -1).astype(np.int64))
    # Round-robin moves a session's turns between replicas, so they must share a clock too; and a closed
    # loop's client sends as a request finishes on any replica, so its cap is shared the same way. A
    # replica's pipeline batches in flight share its stages (engine/pipeline.py): one clock as well.
    # So is session affinity's under a cap: its router hashes a request to a replica whatever that replica
    # holds (vLLM production-stack's SessionRouter, src/vllm_router/routers/routing_logic.py: a HashRing
    # over the session key, no count of what each engine runs), so one replica can hold the whole cap.
    static = policy == "session_affinity" or (policy == "round_robin" and sessions is None and concurrency is None)
    apart = static and scenario.deployment.pp == 1 and concurrency is None
    if apart or replicas == 1:
        assignment = static_assignment(policy, n, replicas, requests.prefixes,
                                       None if sessions is None else sessions.session)
        joint: list[EngineTrace] = []
    else:  # the router looks at the replicas as requests come: all of them in this process
        last_miles = [LastMile(delivery, deployment.front_end) for _ in range(replicas)]
        # (a static policy's routing decided up front, as when served apart)
        assigned = (static_assignment(policy, n, replicas, requests.prefixes,
                                      None if sessions is None else sessions.session) if static else None)
        assignment, joint, joint_rows = run_cluster(
            scheduled_ns, requests.input_tokens, requests.output_tokens, requests.prefixes, deployment.costs,
            last_miles, deployment.engine, deployment.kv_capacity_tokens, policy, concurrency, progress, think_ns,
            shared, scenario.deployment.pp, assigned)

    def routed(replica: int) -> np.ndarray:
        return joint_rows[replica] if joint else np.flatnonzero(assignment == replica)

    def serve(replica: int, progress: Callable[[int], None] | None) -> tuple[dict, EngineTrace, LogHistogram | None]:
        rows = routed(replica)
        itl = LogHistogram() if gaps_only else None
        if joint:  # (its rows in routing order, which sessions' later turns can make other than the input order)
            template = None if requests.template_tokens is None else requests.template_tokens[rows]
            sub = Requests(np.zeros(len(rows)), requests.input_tokens[rows], requests.output_tokens[rows],
                           template_tokens=template)
            last_mile, trace = last_miles[replica], joint[replica]
        else:
            sub = requests.take(rows)
            # (a cap is the client's over every replica: here one replica has it all, or there is none)
            last_mile = LastMile(delivery, deployment.front_end)
            trace = run_engine(
                scheduled_ns[rows], sub.input_tokens, sub.output_tokens, deployment.costs, last_mile,
                deployment.engine, deployment.kv_capacity_tokens, concurrency, progress, prefixes=sub.prefixes,
                think_ns=None if think_ns is None else think_ns[rows],
                side=None if shared is None else shared.rows(rows),
            )
        scheduled = scheduled_ns[rows]
        if sessions is not None:  # a later turn is meant to go when it went: its think time after the last answer
            scheduled = np.where(think_ns[rows] >= 0, trace.sent_ns, scheduled)
        if shared is not None:  # a model call is meant to go when its job lets it
            scheduled = trace.sent_ns
        part = client_side(Served.of(trace), sub, scheduled, last_mile, visible[rows], keep_tokens, itl, warmup[rows],
                            scenario.continuity.spec() if continuity else None,
                            None if user_sent_ns is None else user_sent_ns[rows])
        part["prefix_hit_tokens"] = trace.prefix_hit_tokens
        part["engine_input_tokens"] = sub.input_tokens
        part["replica"] = np.full(len(rows), replica, np.int64)
        return part, trace, itl

    serving = [r for r in range(replicas) if (assignment == r).any()]  # a replica with no requests does nothing
    workers = min(len(serving), _default_workers(n) if workers is None else workers)
    if workers > 1 and can_fork() and not joint and shared is None:  # (shared: its jobs record in this process)
        results = map_forked(serve, serving, workers, progress)
    else:
        results = [serve(replica, progress) for replica in serving]
    parts, traces, itls = zip(*results)
    owners = [routed(replica) for replica in serving]
    itl = LogHistogram.merged(itls) if gaps_only else None
    run = replace(merge_parts(list(parts), owners, n, itl), continuity=scenario.continuity.spec())
    return Simulation(scenario, deployment, requests, run, list(traces))


# Below this many requests a run is over before forking workers would pay off.
PARALLEL_MIN_REQUESTS = 20_000


def _default_workers(num_requests: int) -> int:
    return available_cpus() if num_requests >= PARALLEL_MIN_REQUESTS else 1


