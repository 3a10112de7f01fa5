"""The simulated engine in real time: requests join a `Replica` as they arrive over HTTP, and each
step's tokens are handed to their streams when the simulated step says they leave the server.

Simulated time is wall-clock time since the engine started, so a client sees the batching,
queueing and step times of the scenario's deployment under the load it actually offers. When the
host falls behind (a step's bookkeeping took longer than the step), the next step starts late rather
than compressing time.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.replica import Replica
from tokenpath.pipeline import Deployment
from tokenpath.scenario import Scenario

FINISHED = -1  # put on a stream's queue after its last token


@dataclass
class Stream:
    """One request's tokens as the engine releases them: the count so far, then FINISHED."""

    output_tokens: int
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    released: int = 0


class LiveEngine:
    """One engine replica, stepping in wall-clock time."""

    def __init__(self, scenario: Scenario, deployment: Deployment, clock_ns=time.perf_counter_ns) -> None:
        self.replica = Replica(deployment.costs, LastMile(scenario.delivery), scenario.engine,
                               deployment.kv_capacity_tokens, record_emitters=True)
        self.clock_ns = clock_ns
        self.start_ns = clock_ns()
        self.streams: dict[int, Stream] = {}
        self.wake = asyncio.Event()

    def elapsed_ns(self) -> int:
        return self.clock_ns() - self.start_ns

    def submit(self, input_tokens: int, output_tokens: int) -> Stream:
        """Queue a request arriving now; its stream yields a count per token, then FINISHED."""
        handle = self.replica.submit(input_tokens, output_tokens, self.elapsed_ns())
        stream = self.streams[handle] = Stream(output_tokens)
        self.wake.set()
        return stream

    @property
    def outstanding(self) -> int:
        return len(self.streams)

    async def run(self) -> None:
        """Step whenever there is work, forever (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        replica = self.replica
        while True:
            if replica.idle:
                self.wake.clear()
                await self.wake.wait()
                continue
            replica.now = max(replica.now, self.elapsed_ns())
            finished = replica.step()
            leave_ns = replica.last_leave_ns
            emitters = replica.emitters
            delay_s = max(0.0, (self.start_ns + leave_ns - self.clock_ns()) / 1e9)
            loop.call_later(delay_s, self._release, emitters, finished)
            end_delay_s = (self.start_ns + replica.now - self.clock_ns()) / 1e9
            await asyncio.sleep(max(0.0, end_delay_s))

    def _release(self, emitters: list[int], finished: list[int]) -> None:
        for handle in emitters:
            stream = self.streams[handle]
            stream.released += 1
            stream.queue.put_nowait(stream.released)
        for handle in finished:
            self.streams.pop(handle).queue.put_nowait(FINISHED)
