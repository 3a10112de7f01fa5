"""Every data-parallel replica in one process, stepped in time order, so that a router can look at
them when each request comes (engine/routing.py).

The clock is shared: before a request is routed at time t, every replica whose next step starts
before t takes it. The router then sees each replica as of the end of its step in progress (an
engine's state changes at step boundaries; a request that reaches a replica mid-step joins its next
step, as in run_engine). Cost: replicas are no longer simulated in parallel processes, and each
routed request costs a look at every replica (O(replicas)).

With a concurrency cap the cap is the client's, over all replicas together.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np

from tokenpath.engine.loop import Client, EngineTrace, _trace
from tokenpath.engine.replica import _ID_BITS, Replica, StepCosts
from tokenpath.engine.routing import Router
from tokenpath.engine.spec import EngineSpec
from tokenpath.prefixes import Prefixes

_NEVER = 1 << 62


def _next_step_ns(replica: Replica) -> int:
    """When the replica's next step starts: now if it has work, else its next arrival (never if none)."""
    if replica.waiting or replica.decoding or replica.prefill:
        return replica.now
    if replica.arrivals:
        return max(replica.now, replica.arrivals[0] >> _ID_BITS)
    return _NEVER


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
) -> tuple[np.ndarray, list[EngineTrace]]:
    """Route and serve the requests (rows sorted by scheduled time) over len(clients) replicas.
    Returns the replica of each request and each replica's trace (its requests in routing order,
    which is the input order)."""
    n, count = len(scheduled_ns), len(clients)
    replicas = [Replica(costs, client, spec, kv_capacity_tokens) for client in clients]
    total_blocks = kv_capacity_tokens // spec.block_size
    router = Router(policy, count, prefixes)
    prompt, out, scheduled = input_tokens.tolist(), output_tokens.tolist(), scheduled_ns.tolist()
    assignment = np.empty(n, np.int64)
    sent: list[list[int]] = [[] for _ in range(count)]
    outs: list[list[int]] = [[] for _ in range(count)]
    owner: list[list[int]] = [[] for _ in range(count)]  # each replica's requests, global index
    ready: list[int] = []  # closed loop: heap of times at which a slot frees
    if max_concurrency is not None:
        ready = [0] * min(n, max_concurrency)
    next_to_send = 0
    done = 0
    while done < n:
        if next_to_send < n:
            send_ns = scheduled[next_to_send] if max_concurrency is None else (
                max(scheduled[next_to_send], ready[0]) if ready else _NEVER)
        else:
            send_ns = _NEVER
        starts = [_next_step_ns(r) for r in replicas]
        first = min(range(count), key=starts.__getitem__)
        if starts[first] < send_ns or send_ns == _NEVER:
            replica = replicas[first]
            finished = replica.step()
            if finished:
                done += len(finished)
                router.outstanding[first] -= len(finished)
                for f in finished:
                    if max_concurrency is not None:
                        heapq.heappush(ready, clients[first].last_event_arrival_ns(replica.last_leave_ns, outs[first][f]))
                if progress is not None:
                    progress(len(finished))
            continue
        i = next_to_send
        if max_concurrency is not None:
            heapq.heappop(ready)
        kv_used = [1 - r.free_blocks / total_blocks for r in replicas]
        r = router.choose(i, prompt[i], kv_used)
        router.outstanding[r] += 1
        assignment[i] = r
        upload_ns = clients[r].upload_ns(prompt[i])
        prefix = None if prefixes is None else prefixes.segments(i)
        replicas[r].submit(prompt[i], out[i], send_ns + upload_ns, upload_ns, 0, prefix)
        sent[r].append(send_ns)
        outs[r].append(out[i])
        owner[r].append(i)
        next_to_send += 1
    return assignment, [_trace(replica, sent[r], outs[r], kv_capacity_tokens) for r, replica in enumerate(replicas)]
