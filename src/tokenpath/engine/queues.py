"""The replica's queue of waiting requests, behind the few operations the replica uses, so that a
profile's admission order (Profile.queue_policy) is one class: first come first served today, a
priority or shortest-first order possible. Each operation must stay O(1) (abort's `remove` aside,
a scan), since the replica calls them on every step. Under attention data-parallel each rank's
scheduler has a queue of its own (`RankQueues`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol


class WaitingQueue(Protocol):
    """Requests (ints) waiting to be admitted. Empty is false."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> int:
        """[0]: the request to admit next."""
        ...

    def append(self, request: int) -> None:
        """A request reaches the server."""
        ...

    def extendleft(self, requests: Iterable[int]) -> None:
        """Preempted requests, the newest first, go back ahead of the others (the oldest first)."""
        ...

    def popleft(self) -> int:
        """The request admitted next leaves the queue."""
        ...

    def remove(self, request: int) -> None:
        """An aborted request leaves the queue."""
        ...


class FcfsQueue(deque):
    """First come first served, as vLLM, SGLang and TensorRT-LLM admit by default: a deque, whose
    operations run in C."""


QUEUES: dict[str, type[WaitingQueue]] = {"fcfs": FcfsQueue}


class RankQueues:
    """Under attention data-parallel, a waiting queue per rank: each rank is a scheduler of its own, with a
    waiting queue of its own (SGLang: a scheduler process per DP rank, managers/scheduler.py's
    waiting_queue; vLLM: an engine core per DP rank; TensorRT-LLM: an executor per rank). Request i is
    held by rank i % ranks (engine/replica.py). Admission reads `queues`, rank by rank; the replica's
    other operations see one queue."""

    def __init__(self, queue: type[WaitingQueue], ranks: int) -> None:
        self.queues = [queue() for _ in range(ranks)]

    def __len__(self) -> int:
        return sum(map(len, self.queues))

    def __bool__(self) -> bool:
        return any(self.queues)

    def append(self, request: int) -> None:
        self.queues[request % len(self.queues)].append(request)

    def extendleft(self, requests: Iterable[int]) -> None:
        for request in requests:  # (one at a time, newest first: each rank keeps the order extendleft gives)
            self.queues[request % len(self.queues)].extendleft((request,))

    def remove(self, request: int) -> None:
        self.queues[request % len(self.queues)].remove(request)
