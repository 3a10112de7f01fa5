"""Work of another model on a replica's GPU (a reranker sharing it with the LLM), and the requests it
holds back.

Each request has one job, ready at a known time. A job waits for the engine's next step and runs in it:
the step is longer by the job's kernel time, which counts as compute to the requests in that step, and
the job is done when the step ends. On an idle GPU a ready job runs at once, alone, and the engine's next
step starts no earlier than its end. When its job is done a request's model call is sent
(`release_ns`), so the requests are submitted held and sent one by one as their jobs finish.
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np

from tokenpath.engine.replica import Replica


class SideJobs(Protocol):
    """The jobs of a replica's requests, by row: when each is ready, the kernel time of a set of them run
    together, and when a request's model call is sent once its job is done."""

    ready_ns: np.ndarray

    def kernel_ns(self, rows: list[int]) -> int: ...
    def release_ns(self, row: int, done_ns: int) -> int: ...


class SideWork:
    """One replica's pending jobs, in the order they become ready."""

    def __init__(self, jobs: SideJobs, rows: list[int] | None = None) -> None:
        """`rows`: the jobs queued from the start (all of them when None); others come by `push`."""
        self.jobs = jobs
        ready = jobs.ready_ns.tolist()
        self.pending = [(ready[row], row) for row in (range(len(ready)) if rows is None else rows)]
        heapq.heapify(self.pending)

    def push(self, row: int) -> None:
        heapq.heappush(self.pending, (int(self.jobs.ready_ns[row]), row))

    def next_event_ns(self, replica: Replica, horizon_ns: int | None = None) -> int | None:
        """When the replica does something next: its next step, or a job on its idle GPU before that
        (`horizon_ns`: as Replica.next_step_ns's)."""
        start = replica.next_step_ns(horizon_ns)
        alone = self._alone_ns(replica, start)
        return start if alone is None else alone

    def advance(self, replica: Replica, horizon_ns: int | None = None) -> tuple[list[int], list[int], int]:
        """Run the replica's next event: its next step with the jobs ready when it starts, or the jobs ready
        on its idle GPU. Returns the requests that finished, the jobs done and when they were done."""
        start = replica.next_step_ns(horizon_ns)
        alone = self._alone_ns(replica, start)
        if alone is not None:
            jobs = self._take(alone)
            done_ns = alone + self.jobs.kernel_ns(jobs)
            replica.occupy(done_ns)
            return [], jobs, done_ns
        if start is None:
            raise ValueError("nothing to run: no step and no job pending")
        jobs = self._take(start)
        if jobs:
            replica.side_ns = self.jobs.kernel_ns(jobs)
        finished = replica.step()
        return finished, jobs, replica.now

    def _alone_ns(self, replica: Replica, start: int | None) -> int | None:
        """When a job runs alone: the engine has nothing to run now and one is ready before its next step."""
        if not self.pending or replica.busy:
            return None
        at = max(self.pending[0][0], replica.now)
        return at if start is None or at < start else None

    def _take(self, at_ns: int) -> list[int]:
        pending, jobs = self.pending, []
        while pending and pending[0][0] <= at_ns:
            jobs.append(heapq.heappop(pending)[1])
        return jobs
