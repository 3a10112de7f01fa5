"""Multi-step scheduling (vLLM V0's num_scheduler_steps): a decode step is a window of k steps with a
fixed batch, and the host processes the window's outputs once, when its last step ends."""

from __future__ import annotations

from collections.abc import Callable


class WindowHost:
    """The delivery path's `on_step` (engine/protocols.Host), called once per window: steps before the
    last are not blocked and leave nothing (-1); the last hands over every token of the window."""

    def __init__(self, on_step: Callable[[int, int, int], tuple[int, int, int, int]], interval: int) -> None:
        self.on_step, self.interval = on_step, interval
        self.emitted = self.events = 0  # tokens and events the window made so far

    def step(self, gpu_end_ns: int, emitted: int, events: int, window_ends: bool) -> tuple[int, int, int, int]:
        """on_step's (blocking_ns, leave_ns, front_queue_ns, front_work_ns) of a step of the window that
        sampled `emitted` tokens closing `events` events (with one token per event, `events` is taken to
        be `emitted`)."""
        if self.interval == 1:
            events = emitted
        if not window_ends:
            self.emitted += emitted
            self.events += events
            return 0, -1, 0, 0
        emitted, events = emitted + self.emitted, events + self.events
        self.emitted = self.events = 0
        return self.on_step(gpu_end_ns, emitted, events)

    def drop(self) -> None:
        """The window ended without a last step (every sequence in it aborted): its tokens so far go nowhere."""
        self.emitted = self.events = 0
