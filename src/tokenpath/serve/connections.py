"""The connections of `tokenpath serve`: read timeouts, a connection cap, and an accept loop that
survives running out of file descriptors.

aiohttp closes idle keep-alive connections, but sets no limit on how long a client may take to send a
request's head and no cap on open connections, and asyncio's accept loop, out of file descriptors,
logs a traceback per attempt (25,000 a second were seen). So serve accepts connections itself and
puts each behind a `_Guard`, a protocol in front of aiohttp's own:

- a connection must complete a request head within `header_timeout_s` of opening, or of its first
  byte after an idle keep-alive; else it gets a 408 (if it sent anything) and is closed;
- an idle keep-alive connection is closed after `idle_timeout_s`;
- a request's body must arrive within `body_timeout_s` (enforced where the body is read: app.py);
- at most `max_connections` are open. When full, the connection that has gone longest without a
  request in progress (idle, or still sending its head) is closed to make room, so clients that
  trickle bytes cannot lock out `/health`; when every connection has a request in progress, the
  new one gets a 503;
- an accept that fails for lack of resources (EMFILE and the like) pauses accepting briefly.
Refusals are logged once per interval, with their count.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tokenpath.config.errors import QUOTE_CHARS, UserError

log = logging.getLogger("tokenpath.serve")

# Apache httpd's mod_reqtimeout default allows 20 s for the request head ("header=20-40,MinRate=500",
# httpd.apache.org/docs/2.4/mod/mod_reqtimeout.html); nginx's client_header_timeout is 60 s.
HEADER_TIMEOUT_S = 20.0
# nginx's client_body_timeout (60 s, nginx.org/en/docs/http/ngx_http_core_module.html), here for
# the whole body: serve's largest body (4 MiB) takes 0.3 s at 100 Mb/s.
BODY_TIMEOUT_S = 60.0
# vLLM's HTTP keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s, uvicorn's default).
IDLE_TIMEOUT_S = 5.0
# File descriptors kept back from the connection cap for the process's own: standard streams, the
# listening sockets, the event loop's selector, the send log, modules imported late. A margin.
FD_RESERVE = 64
# Connections the kernel holds completed before serve accepts them: uvicorn's default (its Config's
# `backlog`, 2048), which vLLM's API server runs on. aiohttp's TCPSite takes 128, which a burst of a
# few hundred clients overflows: the kernel drops their SYNs and each retries after its 1 s timeout.
BACKLOG = 2048
# Connections accepted per wake-up of the listening socket, as asyncio's accept loop (its backlog).
ACCEPT_BATCH = 100
# Out of file descriptors, accepting pauses this long. asyncio pauses 1 s (ACCEPT_RETRY_DELAY); a
# tenth keeps /health answering well within a second, at ten failed accept() calls a second.
ACCEPT_RETRY_S = 0.1
# The longest timeout accepted: a day, far beyond any request, and finite for the event loop's timers.
MAX_TIMEOUT_S = 86400.0
# Refusals of one kind are logged at most once per this interval.
LOG_INTERVAL_S = 10.0
# The blank line that ends an HTTP/1.1 request head (RFC 9112, section 2.1).
HEAD_END = b"\r\n\r\n"
# A connection is closed to make room only once it has waited this long without a request: one just
# accepted may hold a whole request the server has not read yet (a burst of clients each sending at
# once), which a round trip on loopback or in a data centre takes well under this to bring.
MAKE_ROOM_AFTER_S = 0.05
# The cap where the open-file limit sets none: a ceiling on memory more than anything (each idle
# connection costs some kilobytes); a choice, raise it with --max-connections.
UNLIMITED_FILES_CONNECTIONS = 65536
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
try:  # the ioctl that tells the bytes waiting on a socket (Linux, macOS); None elsewhere
    import fcntl
    import termios
    _FIONREAD: int | None = termios.FIONREAD
except ImportError:
    _FIONREAD = None


def default_max_connections() -> int:
    """The open-file limit (soft) less a reserve: past it, accept() fails with EMFILE."""
    try:
        import resource
    except ImportError:  # Windows: no such limit on sockets
        return UNLIMITED_FILES_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED_FILES_CONNECTIONS
    return max(1, soft - FD_RESERVE)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int | None = None     # None: the open-file limit less FD_RESERVE

    def __post_init__(self) -> None:
        for flag, value in (("--header-timeout", self.header_timeout_s), ("--body-timeout", self.body_timeout_s),
                            ("--idle-timeout", self.idle_timeout_s)):
            if not 0 < value <= MAX_TIMEOUT_S:
                raise UserError(f"{flag}: {value!r} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
        if self.max_connections is not None and self.max_connections < 1:
            raise UserError(f"--max-connections: {self.max_connections!r} must be 1 or more")


def _reply(status: int, reason: str, message: str, kind: str, code: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


FULL_REPLY = _reply(503, "Service Unavailable", "the server is at its connection limit, every connection busy "
                    "with a request; retry later", "server_error", "overloaded")


def _refuse(conn: socket.socket) -> None:
    """Answer a connection refused at accept with the 503, as far as its send buffer takes it, and close it.
    What the client has sent already is read first: a socket closed with bytes unread sends a reset, which
    can reach the client before the 503 and discard it."""
    try:
        conn.setblocking(False)
        while conn.recv(65536):
            pass
    except OSError:
        pass
    try:
        conn.send(FULL_REPLY)
    except OSError:
        pass
    conn.close()


class _CountedLog:
    """One warning line per kind of event per interval: the first at once, then how many followed."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.counts: dict[str, int] = {}
        self.texts: dict[str, str] = {}

    def note(self, kind: str, text: str) -> None:
        if kind in self.counts:
            self.counts[kind] += 1
            self.texts[kind] = text
            return
        log.warning("%s (the next ones are counted and logged once every %g s)", text, self.interval_s)
        self.counts[kind] = 0
        asyncio.get_running_loop().call_later(self.interval_s, self._flush, kind)

    def _flush(self, kind: str) -> None:
        count = self.counts.pop(kind)
        text = self.texts.pop(kind, "")
        if count:
            log.warning("%d more in the last %g s: %s", count, self.interval_s, text)
            self.counts[kind] = 0
            asyncio.get_running_loop().call_later(self.interval_s, self._flush, kind)


class ParseErrorLog(logging.LoggerAdapter):
    """aiohttp's server logger, for serve: a request its parser refuses (malformed HTTP, or bytes that are
    not HTTP) is one warning line, where aiohttp logs a traceback (or, for a bad method, nothing); aiohttp
    answers it with a 400 as before. Everything else passes to aiohttp's logger unchanged."""

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            # aiohttp's message quotes the bad line and marks the bad byte with '^' on a line of its own.
            words = " ".join(line.strip() for line in str(exc_info.message).splitlines() if line.strip(" ^"))
            log.warning("refused a malformed request from %s with 400: %s", args[0] if args else "a client",
                        words[:2 * QUOTE_CHARS])
            return
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)


class Connections:
    """The open connections and their limits; `middleware` tells them when a request is in progress."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.max_connections = limits.max_connections or default_max_connections()
        self.open: set[_Guard] = set()
        # no request in progress, longest first: when each began to wait (the loop's clock)
        self.waiting: OrderedDict[_Guard, float] = OrderedDict()
        self.by_transport: dict[asyncio.BaseTransport, _Guard] = {}
        self.counted = _CountedLog(LOG_INTERVAL_S)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        guard = self.by_transport.get(request.transport) if request.transport is not None else None
        if guard is None:  # served some other way (a plain aiohttp site), or already closed
            return await handler(request)
        guard.request_started()
        try:
            return await handler(request)
        finally:
            guard.request_ended()

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guard(self, server)

    def admit(self, guard: _Guard) -> str:
        """Count a new connection in ("in"), after closing another to make room for it ("made room"),
        or refuse it ("refused"). Called as it is accepted, before its transport exists, so the count
        covers every descriptor taken."""
        outcome = "in"
        if len(self.open) >= self.max_connections:
            if not self.make_room():
                self.counted.note("full", f"refused a connection with a 503: all {self.max_connections} connections "
                                          f"have a request in progress or came within {MAKE_ROOM_AFTER_S:g} s "
                                          "(serve --max-connections)")
                return "refused"
            outcome = "made room"
        self.open.add(guard)
        self.waiting[guard] = asyncio.get_running_loop().time()
        guard.admitted = True
        return outcome

    def make_room(self) -> bool:
        """Close the connection that has gone longest without a request in progress, if it has waited
        MAKE_ROOM_AFTER_S at least and holds no bytes the loop has not read yet (a busy loop reads a
        burst's whole requests late: those are requests, not idle connections)."""
        now = asyncio.get_running_loop().time()
        for guard, since in self.waiting.items():  # (longest waiting first)
            if now - since < MAKE_ROOM_AFTER_S:
                return False
            if guard.unread_bytes():
                continue
            self.counted.note("evicted", f"closed a connection without a request in progress to make room for a "
                                         f"new one ({len(self.open)} open; serve --max-connections)")
            guard.close()
            return True
        return False

    def forget(self, guard: _Guard) -> None:
        self.open.discard(guard)
        self.waiting.pop(guard, None)
        if self.by_transport.get(guard.transport) is guard:
            del self.by_transport[guard.transport]


class _Guard(asyncio.Protocol):
    """In front of aiohttp's protocol for one connection: its timers, and whether it may be closed
    to make room. Its state: "head" (waiting for a complete request head), "busy" (a complete head
    received, its request dispatched or about to be: no longer closed to make room, as a burst of
    whole requests would lose its first ones before their handlers ran) or "idle" (keep-alive, between
    requests)."""

    def __init__(self, connections: Connections, server: web.Server) -> None:
        self.connections, self.server = connections, server
        self.transport: asyncio.Transport | None = None
        self.inner: asyncio.Protocol | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.state = "head"
        self.head_bytes = 0         # bytes received while waiting for the request head
        self.head_tail = b""        # its last 3 bytes, to find the blank line that ends it across reads
        self.admitted = False
        self.socket: socket.socket | None = None   # set while its transport is being made

    def unread_bytes(self) -> int:
        """Bytes the kernel holds for this connection that the loop has not read yet (0 where the platform
        cannot tell: no FIONREAD)."""
        sock = self.socket if self.socket is not None else (
            self.transport.get_extra_info("socket") if self.transport is not None else None)
        if sock is None or _FIONREAD is None:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), _FIONREAD, b"\0\0\0\0"))[0]
        except OSError:  # closed meanwhile
            return 0

    # --- asyncio.Protocol, passed on to aiohttp's RequestHandler
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.admitted and self.connections.admit(self) == "refused":  # accepted by asyncio's loop (Windows)
            transport.write(FULL_REPLY)
            transport.close()
            return
        if self not in self.connections.open:  # closed to make room before its transport was ready
            transport.close()
            return
        self.connections.by_transport[transport] = self
        self.inner = self.server()
        self.inner.connection_made(transport)
        self._arm(self.connections.limits.header_timeout_s, self._head_too_slow)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.state == "idle":  # the first byte of the next request: its head has its own time
            self.state = "head"
            self._arm(self.connections.limits.header_timeout_s, self._head_too_slow)
        if self.state == "head":
            self.head_bytes += len(data)
            if HEAD_END in self.head_tail + data:  # a whole head: its request is on its way to a handler
                self.request_started()
            else:
                self.head_tail = (self.head_tail + data)[-len(HEAD_END) + 1:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.connections.forget(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)
            self.inner = None

    # --- told by the middleware
    def request_started(self) -> None:
        self.state = "busy"
        self._disarm()
        self.connections.waiting.pop(self, None)

    def request_ended(self) -> None:
        self.state, self.head_bytes, self.head_tail = "idle", 0, b""
        if self in self.connections.open:
            self.connections.waiting[self] = asyncio.get_running_loop().time()
            self._arm(self.connections.limits.idle_timeout_s, self._idle_too_long)

    def close(self) -> None:
        """Close now (to make room, or timed out): forgotten at once, so the count of open connections is right."""
        self._disarm()
        self.connections.forget(self)
        if self.transport is not None:  # else its transport, once made, sees it is no longer open and closes
            self.transport.close()

    # --- timers
    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_too_slow(self) -> None:
        self.timer = None
        if self.state != "head" or self.transport is None:
            return
        limit = self.connections.limits.header_timeout_s
        self.connections.counted.note("head", f"closed a connection that sent no complete request head within "
                                              f"{limit:g} s (serve --header-timeout)")
        if self.head_bytes:
            self.transport.write(_reply(408, "Request Timeout", f"no complete request head within {limit:g} s",
                                        "invalid_request_error", "request_timeout"))
        self.close()

    def _idle_too_long(self) -> None:
        self.timer = None
        if self.state == "idle":
            self.close()


class Listener:
    """Listening sockets whose accept loop hands each connection to a `_Guard`."""

    def __init__(self, connections: Connections, server: web.Server) -> None:
        self.factory = connections.protocol_factory(server)
        self.connections = connections
        self.sockets: list[socket.socket] = []
        self.servers: list[asyncio.AbstractServer] = []   # where the loop cannot watch a socket (Windows)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1]

    async def start(self, host: str, port: int) -> None:
        """Bind every address of `host` (as asyncio's create_server does) and start accepting."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                if sys.platform != "win32":  # as asyncio: elsewhere it lets another process take the port
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self.sockets) > 1:  # every address on the port the first one got
                    address = (address[0], self.port, *address[2:])
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            self.close_sockets()
            raise
        for sock in self.sockets:
            try:
                loop.add_reader(sock.fileno(), self._accept, sock)
            except NotImplementedError:
                self.servers.append(await loop.create_server(self.factory, sock=sock, backlog=BACKLOG))

    def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as error:
                self.connections.counted.note(f"accept-{error.errno}", f"accept() failed: {error.strerror} "
                                              f"({len(self.connections.open)} connections open)")
                if error.errno in _OUT_OF_RESOURCES:
                    # Out of descriptors below the cap (other files, or a cap above the limit): close the
                    # connection longest without a request to free one, and try again once it is closed.
                    loop.remove_reader(sock.fileno())
                    made_room = self.connections.make_room()
                    loop.call_later(0 if made_room else ACCEPT_RETRY_S, self._resume, sock)
                return
            guard = self.factory()
            outcome = self.connections.admit(guard)
            if outcome == "refused":
                _refuse(conn)
                continue
            conn.setblocking(False)
            guard.socket = conn
            task = loop.create_task(loop.connect_accepted_socket(lambda guard=guard: guard, conn))
            self.tasks.add(task)
            task.add_done_callback(lambda done, guard=guard: self._accepted(done, guard))
            if outcome == "made room":  # let the loop close the other one's socket before taking another
                return

    def _accepted(self, task: asyncio.Task[Any], guard: _Guard) -> None:
        self.tasks.discard(task)
        conn, guard.socket = guard.socket, None
        if task.cancelled() or task.exception() is not None:
            self.connections.forget(guard)
            if conn is not None:
                conn.close()

    def _resume(self, sock: socket.socket) -> None:
        if not self.closed:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock)

    def close_sockets(self) -> None:
        for sock in self.sockets:
            sock.close()

    async def close(self) -> None:
        """Stop accepting (connections already open are aiohttp's to close: runner.cleanup)."""
        self.closed = True
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            try:
                loop.remove_reader(sock.fileno())
            except (NotImplementedError, ValueError):
                pass
        for server in self.servers:
            server.close()
            await server.wait_closed()
        self.close_sockets()
        for task in list(self.tasks):
            task.cancel()
