"""The requests a replica was given, a row each in submission order, and the heaps of those still on
their way to the engine: to the server's front end, then from it to the engine."""

from __future__ import annotations

import heapq
from array import array

import numpy as np

# Arrival heap keys pack (time, request) into one int, which compares far faster than a tuple.
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1

_CACHED_ERROR = "cached_tokens must leave at least one prompt token to compute"


class Requests:
    """Per request (index = submission order): set at submission, as compact int64 columns (a run can
    hold millions), except the ones updated as it runs."""

    def __init__(self, front: bool = False) -> None:
        """`front`: requests reach a front end first (`at_front`); the replica passes each on to
        `arrivals` when the front end is done with it, adding its time there to `upload`."""
        self.prompt = array("q")
        self.cached = array("q")        # prompt tokens whose KV arrived with the request (0 after preemption)
        self.out = array("q")           # output tokens (an aborted request's: those it made)
        self.arrival = array("q")
        self.upload = array("q")        # time spent on the way in, counted as delivery (the front end's too)
        self.front_queue = array("q")   # of which waiting for the front end's CPU
        self.front_work = array("q")    # and the front end's work on it
        self.generated: list[int] = []  # tokens sampled and sent so far
        self.times_preempted = array("q")  # how often it lost its cache and went back to wait
        self.arrivals: list[int] = []   # heap of arrival at the engine << _ID_BITS | request
        # With a front end, the heap of arrival at the server << _ID_BITS | request (`arrivals` then
        # holds those the front end has passed on); without, `arrivals` is it.
        self.at_front: list[int] = []
        self._incoming = self.at_front if front else self.arrivals

    def add(self, input_tokens: int, output_tokens: int, arrival_ns: int, delivery_ns: int, cached_tokens: int,
            held: bool = False) -> int:
        """A request that reaches the server at `arrival_ns` (`held`: when `send` names it); returns its index."""
        if not 0 <= cached_tokens < input_tokens:
            raise ValueError(_CACHED_ERROR)
        i = len(self.prompt)
        if i > _ID_MASK:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, value in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                              (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.append(int(value))
        self.generated.append(0)
        self.times_preempted.append(0)
        self.front_queue.append(0)
        self.front_work.append(0)
        if not held:
            heapq.heappush(self._incoming, int(arrival_ns) << _ID_BITS | i)
        return i

    def add_all(self, input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_ns: np.ndarray,
                delivery_ns: np.ndarray, cached_tokens: np.ndarray, held: np.ndarray | None = None) -> int:
        """`add` for many requests at once (int64 arrays, one row per request), in one pass; rows where
        `held` is true do not arrive until `send` names them. Returns the index of the first."""
        if not ((0 <= cached_tokens) & (cached_tokens < input_tokens)).all():
            raise ValueError(_CACHED_ERROR)
        first, n = len(self.prompt), len(input_tokens)
        if first + n > _ID_MASK + 1:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, values in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                               (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.frombytes(np.ascontiguousarray(values, np.int64).tobytes())
        self.generated.extend([0] * n)
        for column in (self.times_preempted, self.front_queue, self.front_work):
            column.frombytes(bytes(8 * n))
        incoming = self._incoming
        if held is None:
            incoming.extend([t << _ID_BITS | i for i, t in enumerate(arrival_ns.tolist(), first)])
        else:
            rows = np.flatnonzero(~held)
            sent = zip((rows + first).tolist(), arrival_ns[rows].tolist())
            incoming.extend([t << _ID_BITS | i for i, t in sent])
        heapq.heapify(incoming)
        return first

    def send(self, i: int, arrival_ns: int, delivery_ns: int) -> None:
        """Request i, added held, reaches the server at `arrival_ns` after `delivery_ns` on the way."""
        self.arrival[i], self.upload[i] = arrival_ns, delivery_ns
        heapq.heappush(self._incoming, arrival_ns << _ID_BITS | i)

    def withdraw(self, i: int) -> bool:
        """Take request i off its way to the engine; False if it is not on it. A C-level scan of a heap."""
        to_engine = self.arrival[i] + self.front_queue[i] + self.front_work[i]
        for heap, at_ns in ((self.arrivals, to_engine), (self.at_front, self.arrival[i])):
            key = at_ns << _ID_BITS | i
            if key in heap:
                heap.remove(key)
                heapq.heapify(heap)
                return True
        return False
