"""`serve --send-log`: what the server did when, for measuring clients against it.

One JSONL line per streamed request, {"id", "arrival_ns", "submitted_ns"}: when its handler began and
when it was handed to the engine (parsed and tokenized; with the network emulated, the engine sees it
its upload time later), and one per SSE event just after it was written, {"id", "event", "send_ns"};
times are perf_counter nanoseconds (CLOCK_MONOTONIC on Linux, the clock `tokenpath bench` stamps with).
"""

from __future__ import annotations

import asyncio


class SendLog:
    """Lines are flushed at the end of the event-loop pass that wrote them, so readers see the log as
    the run goes (a killed server loses at most one pass), at one write per pass rather than per event."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")
        self._pending = False

    def write(self, line: str) -> None:
        self.file.write(line)
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._pending = False
        if not self.file.closed:
            self.file.flush()

    def close(self) -> None:
        self.file.close()

