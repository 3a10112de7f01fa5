"""The replica's queue of waiting requests, behind the few operations the replica uses, so that a
profile's admission order (Profile.queue_policy) is one class: first come first served today, a
priority or shortest-first order possible. Each operation must stay O(1) (abort's `remove` aside,
a scan), since the replica calls them on every step.
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
