"""What `tokenpath serve`'s own HTTP handling costs its process on this machine: per request and per
streamed event, the server's CPU only (`tokenpath calibrate delivery` adds it as the file's `[http]`).

The request path that delivery/request_measure.py times piece by piece (parse, template, tokenize,
hand-off) runs inside an HTTP server that has work of its own: accept the connection, read and parse
the request's head and body, pass it through serve's connection guard and middlewares to its route,
send the response's head and its end, close the connection. Each streamed event has a cost of its own
too, beyond building it: put on its response's queue, the response's task woken, written through
aiohttp's StreamResponse (a chunk's framing, a send() on the socket).

Both run here on serve's own stack (its listener, connection guard, middlewares, `_stream`) over
loopback, with a route that does nothing else, in a thread of its own; a client in another thread
sends a burst of requests at once (as `tokenpath bench --request-rate inf` does) and reads the
streams. The time counted is the server thread's CPU time (time.thread_time_ns), so the client's
work does not count, wherever the operating system ran it.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from tokenpath.bench.burst import post_request, send_burst
from tokenpath.delivery.calibration import HttpCost
from tokenpath.delivery.sse import SseFramer
from tokenpath.serve.app import CONNECTIONS, _errors, _stream, start_server, stop_server
from tokenpath.serve.connections import ConnectionLimits, Connections
from tokenpath.serve.output import DONE

# A burst of this many requests at once (serve's per-request cost under the load a burst brings), and
# this many streams of this many events each for the per-event cost: a batch of streams, each sent
# one event per engine step, as serve sends them.
BURST_REQUESTS = 200
STREAMS, EVENTS_PER_STREAM = 32, 64
PATH = "/v1/completions"
# The words each event carries, as the corpus's English prose tokenizes: a few bytes of text each.
EVENT_TEXTS = (" the", " server", " streams", " each", " token", " as", " it", " comes")
# How often the measurement looks whether the client is done: each look costs the server thread a few
# microseconds, a few per request in all.
POLL_S = 0.005


@dataclass
class _Route:
    """The measured route: each request's stream waits on a queue of its own that the measurement fills."""

    queues: list[asyncio.Queue] = field(default_factory=list)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    written: int = 0       # events written so far, over every stream
    expected: int = 0      # opened streams awaited before `opened` is set
    wrote_all: asyncio.Event = field(default_factory=asyncio.Event)
    target: int = 0        # events written before `wrote_all` is set

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = SimpleNamespace(queue=_CountingQueue(self), request_id="")
        self.queues.append(response.queue)
        if len(self.queues) >= self.expected:
            self.opened.set()
        return await _stream(request, SimpleNamespace(send_log=None), response, 0)


class _CountingQueue(asyncio.Queue):
    """A response's queue that counts what its stream has taken to write (the previous item written)."""

    def __init__(self, route: _Route) -> None:
        super().__init__()
        self.route, self.taken = route, 0

    async def get(self) -> Any:
        if self.taken:  # the stream has written the item it took before
            route = self.route
            route.written += 1
            if route.written >= route.target:
                route.wrote_all.set()
        self.taken += 1
        return await super().get()


def _app(route: _Route) -> web.Application:
    connections = Connections(ConnectionLimits())
    app = web.Application(middlewares=[connections.middleware, _errors])
    app[CONNECTIONS] = connections
    app.router.add_post(PATH, route.handle)
    return app


def _client(port: int, count: int, request: bytes, done: threading.Event, received: list[bytes] | None = None) -> None:
    """`send_burst` in the client's thread, `done` set when it has read every response (or failed)."""
    try:
        send_burst(port, count, request, received)
    finally:
        done.set()


def events(count: int) -> list[bytes]:
    """`count` completion chunks as serve's framer renders them, a word of text each."""
    framer = SseFramer(1, "completions")
    framer.open(0, "cmpl-0123456789abcdef0123456789abcdef", "llama-3.1-8b", 1_700_000_000)
    return [framer.step((EVENT_TEXTS[k % len(EVENT_TEXTS)],))[0] for k in range(count)]


async def _burst_s(count: int, body: bytes) -> float:
    """Server CPU seconds per request: `count` requests at once, each answered with its response's head
    and end (no event), every connection closed."""
    route = _Route(expected=count)
    runner, listener = await start_server(_app(route), "127.0.0.1", 0)
    try:
        done, request = threading.Event(), post_request(listener.port, PATH, body)
        start_ns = time.thread_time_ns()
        threading.Thread(target=_client, args=(listener.port, count, request, done), daemon=True).start()
        await route.opened.wait()
        for queue in route.queues:
            queue.put_nowait(DONE)
        while not done.is_set() or listener.connections.open:  # every connection closed at both ends
            await asyncio.sleep(POLL_S)
        return (time.thread_time_ns() - start_ns) / 1e9 / count
    finally:
        await stop_server(runner, listener)


async def _events_s(streams: int, per_stream: int, body: bytes, received: list[bytes] | None = None) -> float:
    """Server CPU seconds per event: `streams` open streams, each put one event per step and written
    before the next step (the head, the end and the connections are not counted)."""
    route = _Route(expected=streams)
    runner, listener = await start_server(_app(route), "127.0.0.1", 0)
    chunks = events(per_stream)
    try:
        done, request = threading.Event(), post_request(listener.port, PATH, body)
        threading.Thread(target=_client, args=(listener.port, streams, request, done, received), daemon=True).start()
        await route.opened.wait()
        await asyncio.sleep(0.01)  # every head sent, the client reading
        start_ns = time.thread_time_ns()
        for k, chunk in enumerate(chunks):
            route.target = (k + 1) * streams
            route.wrote_all.clear()
            for queue in route.queues:
                queue.put_nowait(chunk)
            await route.wrote_all.wait()
        spent_ns = time.thread_time_ns() - start_ns
        for queue in route.queues:
            queue.put_nowait(DONE)
        while not done.is_set():
            await asyncio.sleep(POLL_S)
        return spent_ns / 1e9 / (streams * per_stream)
    finally:
        await stop_server(runner, listener)


def measure_http(body: bytes, repeats: int = 3, burst: int = BURST_REQUESTS, streams: int = STREAMS,
                 per_stream: int = EVENTS_PER_STREAM) -> tuple[HttpCost, dict[str, Any]]:
    """serve's HTTP cost per request (a burst of `burst` requests of `body`) and per streamed event,
    medians of `repeats` runs each; and how they were measured (for the file's [path])."""

    async def run() -> tuple[list[float], list[float]]:
        per_request = [await _burst_s(burst, body) for _ in range(repeats)]
        per_event = [await _events_s(streams, per_stream, body) for _ in range(repeats)]
        return per_request, per_event

    per_request, per_event = asyncio.run(run())
    how = {"stack": "tokenpath serve's listener, connection guard, middlewares and _stream on aiohttp, over "
                    "loopback; the server thread's CPU time (time.thread_time_ns), the client in another thread",
           "request": f"a burst of {burst} connections at once, each a streaming POST of {len(body)} body bytes "
                      "answered with the response head and its end: accept, read and parse, dispatch, close",
           "event": f"{streams} streams x {per_stream} completion chunks, one per stream per step: put on the "
                    "response's queue, its task woken, written through aiohttp's StreamResponse",
           "repeats": repeats, "statistic": "median",
           "serve": "with these, the calibration describes tokenpath serve's front end, but for two pieces of "
                    "[request] it does not do: it renders no chat template (template_s) and hands a request to "
                    "its engine in its own process (handoff_s)"}
    return HttpCost(statistics.median(per_request), statistics.median(per_event)), how
