"""First-come-first-served queues in front of a served stage: each request's end from its arrival, in
integer nanoseconds, simulated request by request in arrival order (O(n log n)).

Requests that arrive at the same time are taken in their row order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np


def servers_end_ns(arrival_ns: np.ndarray, service_ns: np.ndarray, servers: int) -> np.ndarray:
    """`servers` identical servers, each serving one request at a time: a request starts when it arrives
    or when a server frees, whichever is later, and ends its service time after."""
    end = np.empty(len(arrival_ns), np.int64)
    arrival, service = arrival_ns.tolist(), service_ns.tolist()
    free: list[int] = []  # heap of the busy servers' free times
    for i in np.argsort(arrival_ns, kind="stable").tolist():
        start = arrival[i]
        if len(free) == servers:
            first = heapq.heappop(free)
            start = first if first > start else start
        end[i] = start + service[i]
        heapq.heappush(free, int(end[i]))
    return end


def batches_end_ns(arrival_ns: np.ndarray, max_batch: int, batch_ns: Callable[[np.ndarray], int]) -> np.ndarray:
    """One server taking up to `max_batch` waiting requests at a time: when it frees (or, idle, when the
    next request arrives) it starts a batch of the requests that have arrived by then, in arrival order;
    they all end when the batch does, `batch_ns(rows)` later."""
    n = len(arrival_ns)
    end = np.empty(n, np.int64)
    order = np.argsort(arrival_ns, kind="stable")
    arrived = arrival_ns[order]
    free, k = None, 0
    while k < n:
        start = int(arrived[k]) if free is None or free < arrived[k] else free
        stop = min(k + max_batch, int(np.searchsorted(arrived, start, side="right")))
        rows = order[k:stop]
        free = start + batch_ns(rows)
        end[rows] = free
        k = stop
    return end
