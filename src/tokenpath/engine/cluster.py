"""Every data-parallel replica in one process, stepped in time order, so that a router can look at
them when each request comes (engine/routing.py).

The clock is shared: before a request is routed at time t, every replica whose next step starts
before t takes it. The router then sees each replica as of the end of its step in progress (an
engine's state changes at step boundaries; a request that reaches a replica mid-step joins its next
step, as in run_engine). Cost: replicas are no longer simulated in parallel processes, and each
routed request costs a look at every replica (O(replicas)).

With a concurrency cap the cap is the client's, over all replicas together.

Side work on the replicas' GPUs (`side`, engine/side_work.py): a request is routed when its job is ready,
its job runs on the replica chosen, and its model call goes to the same replica when the job is done.

Multi-turn sessions (`think_ns`): a session's next turn is sent its think time after the turn before
finishes at the client, and routed then, so under round_robin and the load-aware policies a session's
turns may land on different replicas (as with a real router that does not pin sessions).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from tokenpath.engine.loop import Client, EngineTrace, _trace
from tokenpath.engine.pipeline import Pipeline
from tokenpath.engine.protocols import StepCosts
from tokenpath.engine.replica import Replica
from tokenpath.engine.routing import Router
from tokenpath.engine.side_work import SideJobs, SideWork
from tokenpath.engine.spec import EngineSpec
from tokenpath.prefixes import Prefixes

_NEVER = 1 << 62


def _next_step_ns(replica: Replica, horizon_ns: int) -> int:
    """When the replica's next step starts (never if it has nothing to do), or a bound from `horizon_ns`, the
    next send, on (Replica.next_step_ns)."""
    start = replica.next_step_ns(horizon_ns)
    return _NEVER if start is None else start


def _next_event_ns(side: SideWork, replica: Replica, horizon_ns: int) -> int:
    start = side.next_event_ns(replica, horizon_ns)
    return _NEVER if start is None else start


def run_cluster(
    scheduled_ns: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    prefixes: Prefixes | None,
    costs: StepCosts,
    clients: Sequence[Client],
    spec: EngineSpec,
    kv_capacity_tokens: int,
    policy: str,
    max_concurrency: int | None = None,
    progress: Callable[[int], None] | None = None,
    think_ns: np.ndarray | None = None,
    side: SideJobs | None = None,
    pipeline_stages: int = 1,
    assigned: np.ndarray | None = None,
) -> tuple[np.ndarray, list[EngineTrace], list[np.ndarray]]:
    """Route and serve the requests (rows sorted by scheduled time) over len(clients) replicas.
    Returns the replica of each request, each replica's trace (its requests in routing order) and
    each replica's requests in that order (the input order, but for sessions' later turns).
    `think_ns`: as run_engine's (sessions; no concurrency cap). `side`: each request's job on its
    replica's GPU, routed when it is ready (open loop only). `pipeline_stages` > 1: the replicas are
    pipeline batches in flight, each `pipeline_stages` in a row sharing one pipeline's stages
    (engine/pipeline.py). `assigned`: each request's replica, decided up front (a static policy's)."""
    n, count = len(scheduled_ns), len(clients)
    replicas = [Replica(costs, client, spec, kv_capacity_tokens) for client in clients]
    if prefixes is not None and prefixes.warm is not None:
        if assigned is None:
            raise ValueError("a warm prefix cache is modelled for replicas routed statically, not by a live router")
        for r, replica in enumerate(replicas):  # each holds the warm segments of the requests it will serve
            replica.hold_warm(prefixes.take(np.flatnonzero(assigned == r)))
    if pipeline_stages > 1:
        pipelines = [Pipeline(pipeline_stages) for _ in range(count // pipeline_stages)]
        for r, replica in enumerate(replicas):
            replica.pipeline = pipelines[r // pipeline_stages]
    router = Router(policy, count, prefixes, assigned)
    prompt, out, scheduled = input_tokens.tolist(), output_tokens.tolist(), scheduled_ns.tolist()
    assignment = np.empty(n, np.int64)
    sent: list[list[int]] = [[] for _ in range(count)]
    outs: list[list[int]] = [[] for _ in range(count)]
    owner: list[list[int]] = [[] for _ in range(count)]  # each replica's requests, global index
    ready: list[int] = []  # closed loop: heap of times at which a slot frees
    if max_concurrency is not None:
        ready = [0] * min(n, max_concurrency)
    if think_ns is not None and max_concurrency is not None:
        raise ValueError("sessions are closed loops of their own: no concurrency cap")
    if side is not None and (think_ns is not None or max_concurrency is not None):
        raise ValueError("side work holds requests back itself: no concurrency cap, no sessions")
    sides = None if side is None else [SideWork(side, []) for _ in range(count)]
    local = [0] * n  # with side work: each request's row on its replica
    if side is not None:  # routed when its job is ready
        scheduled = side.ready_ns.tolist()
    # Requests sent at their scheduled time (all, or sessions' first turns), and a heap of
    # (send time, request) of sessions' next turns, pushed as the turn before finishes.
    firsts = list(range(n)) if think_ns is None else np.flatnonzero(think_ns < 0).tolist()
    if side is not None:
        firsts = np.argsort(side.ready_ns, kind="stable").tolist()
    think = [-1] * (n + 1) if think_ns is None else think_ns.tolist() + [-1]
    pending: list[tuple[int, int]] = []
    next_first = 0
    done = 0
    while done < n:
        if next_first < len(firsts):
            i = firsts[next_first]
            send_ns = scheduled[i] if max_concurrency is None else (max(scheduled[i], ready[0]) if ready else _NEVER)
        else:
            send_ns = _NEVER
        if pending and pending[0][0] < send_ns:
            send_ns, i = pending[0]
        starts = ([_next_step_ns(r, send_ns) for r in replicas] if sides is None else
                  [_next_event_ns(s, r, send_ns) for s, r in zip(sides, replicas)])
        first = min(range(count), key=starts.__getitem__)
        if starts[first] < send_ns or send_ns == _NEVER:
            replica = replicas[first]
            if sides is None:
                finished = replica.step()
            else:
                finished, jobs, done_ns = sides[first].advance(replica, send_ns)
                for g in jobs:
                    at_ns, upload_ns = side.release_ns(g, done_ns), clients[first].upload_ns(prompt[g])
                    sent[first][local[g]] = at_ns
                    replica.send(local[g], at_ns + upload_ns, upload_ns)
            if finished:
                done += len(finished)
                router.outstanding[first] -= len(finished)
                for f in finished:
                    if max_concurrency is not None:
                        freed_ns = clients[first].last_event_arrival_ns(replica.last_leave_ns, outs[first][f])
                        heapq.heappush(ready, freed_ns)
                    g = owner[first][f]
                    if think[g + 1] >= 0:
                        last_byte_ns = clients[first].last_event_arrival_ns(replica.last_leave_ns, outs[first][f])
                        heapq.heappush(pending, (last_byte_ns + think[g + 1], g + 1))
                if progress is not None:
                    progress(len(finished))
            continue
        if pending and pending[0][1] == i:
            heapq.heappop(pending)
        else:
            next_first += 1
        if max_concurrency is not None:
            heapq.heappop(ready)
        kv_used = [r.kv_used() for r in replicas]
        r = router.choose(i, prompt[i], kv_used)
        router.outstanding[r] += 1
        assignment[i] = r
        upload_ns = clients[r].upload_ns(prompt[i])
        prefix = None if prefixes is None else prefixes.segments(i)
        local[i] = replicas[r].submit(prompt[i], out[i], send_ns + upload_ns, upload_ns, 0, prefix, sides is not None)
        if sides is not None:  # its job first, on this replica; it is sent when the job is done
            sides[r].push(i)
        sent[r].append(send_ns)
        outs[r].append(out[i])
        owner[r].append(i)
    traces = [_trace(replica, sent[r], outs[r], kv_capacity_tokens) for r, replica in enumerate(replicas)]
    return assignment, traces, [np.array(rows, np.int64) for rows in owner]
