"""The scenario's client network, emulated by `tokenpath serve`.

simulate charges each message between client and server half the scenario's round trip plus its
bytes at the network's bandwidth (`LastMile.network_ns`): the request on its way in, each SSE event
on its way out. serve, reached over loopback, would otherwise deliver all of it at once, and a
client measuring it would see a shorter TTFT, TTFV and E2E than simulate predicts for the same
scenario. So serve holds a request for its upload time before the engine sees it, and each event
until it would have reached the client. Times use the same model with the bytes serve actually
receives and sends; an event is never delivered before the one ahead of it, as on one TCP stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tokenpath.delivery.lastmile import LastMile


class Network:
    """Delays of the scenario's client network; `enabled` False (serve --no-network-delay) delays nothing."""

    def __init__(self, last_mile: LastMile, enabled: bool = True) -> None:
        self.last_mile, self.enabled = last_mile, enabled

    def delay_ns(self, size_bytes: int) -> int:
        return self.last_mile.network_ns(size_bytes) if self.enabled else 0

    async def carry(self, size_bytes: int) -> None:
        """Wait as long as `size_bytes` take across the network."""
        if self.enabled:
            await asyncio.sleep(self.delay_ns(size_bytes) / 1e9)

    def queue(self, clock_ns: Callable[[], int] = time.perf_counter_ns) -> DelayedQueue:
        return DelayedQueue(self.delay_ns, clock_ns)


class DelayedQueue:
    """A response's queue as its client receives it: what the server puts in (SSE event bytes, or
    the end marker None) comes out once it has crossed the network, in order."""

    def __init__(self, delay_ns: Callable[[int], int], clock_ns: Callable[[], int]) -> None:
        self.delay_ns, self.clock_ns = delay_ns, clock_ns
        self.items: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.last_due_ns = 0

    def put_nowait(self, item: Any) -> None:
        size_bytes = len(item) if item is not None else 0
        due_ns = self.clock_ns() + (self.delay_ns(size_bytes) if item is not None else 0)
        self.last_due_ns = max(self.last_due_ns, due_ns)
        self.items.put_nowait((self.last_due_ns, item))

    async def get(self) -> Any:
        due_ns, item = await self.items.get()
        wait_ns = due_ns - self.clock_ns()
        if wait_ns > 0:
            await asyncio.sleep(wait_ns / 1e9)
        return item
