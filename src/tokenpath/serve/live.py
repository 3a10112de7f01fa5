"""The simulated engine in real time: requests join a `Replica` as they arrive over HTTP, and each
step's tokens go through the real last mile when the simulated step says they leave the server.

Simulated time is wall-clock time since the engine started, so a client sees the batching,
queueing and step times of the scenario's deployment under the load it actually offers: a request
arrives at the wall-clock time it was submitted, and each step's tokens are released when the
simulated step says they leave the server. When the host falls behind (its own work for a step took
longer than the step), tokens go out late but the engine's timeline does not drift: the next step
still starts when the last one ended.
"""

from __future__ import annotations

import asyncio
import time

from tokenpath.delivery import Detokenizer
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.replica import Replica
from tokenpath.pipeline import Deployment
from tokenpath.scenario import Scenario
from tokenpath.serve.output import OutputSlots, Response


class LiveEngine:
    """One engine replica, stepping in wall-clock time, and the output path of its requests."""

    def __init__(self, scenario: Scenario, deployment: Deployment, detokenizer: Detokenizer,
                 clock_ns=time.perf_counter_ns) -> None:
        engine = scenario.engine
        self.replica = Replica(deployment.costs, LastMile(scenario.resolved_delivery()), engine,
                               deployment.kv_capacity_tokens, record_emitters=True)
        self.output = OutputSlots(detokenizer, scenario.delivery.stream_interval)
        self.clock_ns = clock_ns
        self.start_ns = clock_ns()
        self.responses: dict[int, Response] = {}
        self.wake = asyncio.Event()

    def elapsed_ns(self) -> int:
        return self.clock_ns() - self.start_ns

    def submit(self, response: Response) -> None:
        """Queue a request arriving now; its output will appear on `response.queue`."""
        handle = self.replica.submit(response.ask.prompt_tokens, len(response.token_ids), self.elapsed_ns())
        self.responses[handle] = response
        self.wake.set()

    async def run(self) -> None:
        """Step whenever there is work, forever (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        replica = self.replica
        while True:
            if replica.idle:
                self.wake.clear()
                await self.wake.wait()
                continue
            finished = replica.step()
            delay_s = (self.start_ns + replica.last_leave_ns - self.clock_ns()) / 1e9
            loop.call_later(max(0.0, delay_s), self._release, replica.released, finished)
            await asyncio.sleep(max(0.0, (self.start_ns + replica.now - self.clock_ns()) / 1e9))

    def _release(self, released: list[list[int]], finished: list[int]) -> None:
        """Tokens leave the server (one step's, or a multi-step window's, one step at a time): detokenize,
        filter and frame them for their clients."""
        for emitters in released:
            self.output.step([self.responses[handle] for handle in emitters])
        for handle in finished:
            self.output.finish(self.responses.pop(handle))
