"""The replica's queue of waiting requests, behind the few operations the replica uses, so that a
profile's admission order (Profile.queue_policy) is one class: first come first served today, a
priority or shortest-first order possible. Each operation must stay O(1) (abort's `remove` aside,
a scan), since the replica calls them on every step. Under attention data-parallel each rank's
scheduler has a queue of its own (`RankQueues`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
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

    def extend(self, requests: Iterable[int]) -> None:
        """Preempted requests go back behind the others, in the order given (Profile.preempted_requeue)."""
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
    waiting_queue; vLLM: an engine core per DP rank; TensorRT-LLM: an executor per rank). A request goes to
    a rank when it reaches the engine, by the profile's routing (Profile.attention_dp_routing), and stays
    there: `rank_of`. The queues also count each rank's running requests (`running`, which the replica
    raises as it admits them and `finished` lowers) and its requests' prompt tokens, which routing reads.
    Admission reads `queues`, rank by rank; the replica's other operations see one queue.

    Routing reads the counts as they are: vLLM's client reads its engine cores' counts as the
    coordinator last published them (every 100 ms), raising a core's waiting count as it sends to it."""

    def __init__(self, queue: type[WaitingQueue], ranks: int, routing: str, prompt_tokens: Sequence[int]) -> None:
        self.queues = [queue() for _ in range(ranks)]
        self.rank_of: dict[int, int] = {}  # each request's rank, from arrival until it finishes
        self.running = [0] * ranks         # each rank's admitted requests
        self.tokens = [0] * ranks          # the prompt tokens of each rank's requests, waiting or running
        self.prompt_tokens = prompt_tokens  # each request's (the replica's column)
        self.routed = 0                     # requests routed so far (round robin's counter)
        self._route = {"round_robin": self._round_robin, "least_loaded": self._least_loaded,
                       "fewest_tokens": self._fewest_tokens}[routing]

    def __len__(self) -> int:
        return sum(map(len, self.queues))

    def __bool__(self) -> bool:
        return any(self.queues)

    def append(self, request: int) -> None:
        """A request reaches the engine: to the rank its routing picks."""
        rank = self._route()
        self.routed += 1
        self.rank_of[request] = rank
        self.tokens[rank] += self.prompt_tokens[request]
        self.queues[rank].append(request)

    def extendleft(self, requests: Iterable[int]) -> None:
        """Preempted requests go back to the front of their rank's queue."""
        for request in requests:  # (one at a time, newest first: each rank keeps the order extendleft gives)
            rank = self.rank_of[request]
            self.running[rank] -= 1
            self.queues[rank].extendleft((request,))

    def extend(self, requests: Iterable[int]) -> None:
        """Preempted requests go back to the back of their rank's queue, in the order given."""
        for request in requests:
            rank = self.rank_of[request]
            self.running[rank] -= 1
            self.queues[rank].append(request)

    def remove(self, request: int) -> None:
        """A waiting request is aborted."""
        rank = self.rank_of.pop(request)
        self.tokens[rank] -= self.prompt_tokens[request]
        self.queues[rank].remove(request)

    def finished(self, request: int) -> None:
        """A running request finished (or was aborted): its rank holds it no more."""
        rank = self.rank_of.pop(request)
        self.running[rank] -= 1
        self.tokens[rank] -= self.prompt_tokens[request]

    def _round_robin(self) -> int:
        return self.routed % len(self.queues)

    def _least_loaded(self) -> int:
        """The rank of least 4 x waiting + running, the lowest on a tie."""
        queues, running = self.queues, self.running
        return min(range(len(queues)), key=lambda r: 4 * len(queues[r]) + running[r])

    def _fewest_tokens(self) -> int:
        """The rank whose requests hold the fewest prompt tokens, then the fewest requests, then the lowest."""
        queues, running, tokens = self.queues, self.running, self.tokens
        return min(range(len(queues)), key=lambda r: (tokens[r], len(queues[r]) + running[r], r))
