"""The simulated engine in real time: requests join a `Replica` as they arrive over HTTP, and each
step's tokens go through the real last mile when the simulated step says they leave the server.

Simulated time is wall-clock time since the engine started, so a client sees the batching,
queueing and step times of the scenario's deployment under the load it actually offers: a request
arrives at the wall-clock time it was submitted, and each step's tokens are released when the
simulated step says they leave the server. When the host falls behind (its own work for a step took
longer than the step), tokens go out late but the engine's timeline does not drift: the next step
still starts when the last one ended.

A request that ends early (a stop string, its client gone) is aborted in the engine at once, so the
next step neither computes it nor holds its KV cache. An engine with nothing to run waits for the wall
clock to reach the next arrival before it forms a batch: a request submitted meanwhile can arrive first
(a shorter upload), and one whose client leaves on its way never runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from tokenpath.delivery import Detokenizer
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.replica import Replica
from tokenpath.serve.output import OutputSlots, Response
from tokenpath.sim.deployment import Deployment
from tokenpath.sim.scenario import Scenario


class LiveEngine:
    """One engine replica, stepping in wall-clock time, and the output path of its requests."""

    def __init__(self, scenario: Scenario, deployment: Deployment, detokenizer: Detokenizer,
                 clock_ns=time.perf_counter_ns) -> None:
        engine = deployment.engine  # the scenario's, with what the deployment sets (its running requests)
        # The server's own process is the front end (its requests parsed and tokenized, its tokens
        # detokenized and framed for real): the model adds only the engine's side of the last mile.
        last_mile = LastMile(scenario.resolved_delivery(), deployment.front_end, model_front_end=False)
        self.replica = Replica(deployment.costs, last_mile, engine, deployment.kv_capacity_tokens,
                               record_emitters=True, keep_rows=False)
        self.output = OutputSlots(detokenizer, scenario.delivery.stream_interval)
        self.clock_ns = clock_ns
        self.start_ns = clock_ns()
        self.responses: dict[int, Response] = {}  # by engine handle, until it ends
        # Steps whose tokens have not left yet, in step order: (step, leave_ns, released, finished), where
        # `released` holds the emitters of each step whose tokens leave then (several for a multi-step
        # window, whose tokens leave together when it ends).
        self.unreleased: deque[tuple[int, int, list[list[int]], list[int]]] = deque()
        self.wake = asyncio.Event()

    def elapsed_ns(self) -> int:
        return self.clock_ns() - self.start_ns

    def submit(self, response: Response, upload_ns: int = 0) -> None:
        """Queue a request arriving now, or `upload_ns` from now (its upload across the emulated
        network, as simulate's arrival); its output will appear on `response.queue`."""
        response.handle = self.replica.submit(response.ask.prompt_tokens, len(response.token_ids),
                                              self.elapsed_ns() + upload_ns, upload_ns)
        self.responses[response.handle] = response
        self.wake.set()

    def abort(self, response: Response) -> None:
        """End a response early (a stop string ended it, or its client left): the engine drops it
        before its next step and its output slot is freed. Nothing if it has already ended."""
        if self.responses.pop(response.handle, None) is None:
            return
        self.replica.abort(response.handle)
        self.output.release(response)

    async def run(self) -> None:
        """Step whenever there is work, forever (cancel the task to stop)."""
        loop = asyncio.get_running_loop()
        replica = self.replica
        while True:
            # Tokens that leave by the time the next step starts go out before it is formed (a late
            # host can find their timer not yet run): a stop string among them keeps its request out.
            self._release_through(lambda step, leave_ns: leave_ns <= replica.now)
            if replica.idle:
                self.wake.clear()
                await self.wake.wait()
                continue
            if not replica.busy:  # nothing to run before a request on its way arrives: wait until it does (or
                # for a request submitted meanwhile, which can arrive first) rather than form its batch early
                due_s = (self.start_ns + replica.next_step_ns() - self.clock_ns()) / 1e9
                if due_s > 0:
                    self.wake.clear()
                    try:
                        await asyncio.wait_for(self.wake.wait(), due_s)
                    except asyncio.TimeoutError:
                        pass
                    continue
            finished = replica.step()
            step = replica.num_steps - 1
            self.unreleased.append((step, replica.last_leave_ns, replica.rows.released, finished))
            delay_s = (self.start_ns + replica.last_leave_ns - self.clock_ns()) / 1e9
            # `step` bound now: with async detokenization the next step is formed before this timer fires.
            loop.call_later(max(0.0, delay_s), self._release_through, lambda s, leave_ns, step=step: s <= step)
            await asyncio.sleep(max(0.0, (self.start_ns + replica.now - self.clock_ns()) / 1e9))

    def _release_through(self, due: Callable[[int, int], bool]) -> None:
        """Release the steps, oldest first, while `due(step, leave_ns)`. Steps go out in step order
        whatever order their timers fire in: a timer's deadline adds the time between reading the
        clock and scheduling it, and timers due at once run in heap order, which ties do not fix."""
        unreleased = self.unreleased
        while unreleased and due(unreleased[0][0], unreleased[0][1]):
            _, _, released, finished = unreleased.popleft()
            self._release(released, finished)

    def _release(self, released: list[list[int]], finished: list[int]) -> None:
        """Tokens leave the server (one step's, or a multi-step window's, one step at a time): detokenize,
        filter and frame them for their clients. A response a stop string ended in one of a window's steps
        takes no tokens from its later ones: it ended with the token that completed the stop string."""
        responses = self.responses
        ended = []
        for emitters in released:
            ended += self.output.step([r for handle in emitters
                                       if (r := responses.get(handle)) is not None and not r.ended])
        for handle in finished:
            response = responses.pop(handle, None)
            if response is not None:
                self.output.finish(response)
        for response in ended:  # a stop string ended it, or its output failed
            self.abort(response)
