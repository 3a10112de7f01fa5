"""A lean HTTP/1.1 client for streamed responses, on asyncio protocols.

Stamp first, parse later: `data_received` only stamps the bytes with `time.perf_counter_ns()` and
queues them; the queue is parsed once the event loop has read every socket that was ready. When many
streams receive at the same moment (an engine step emits one token to every sequence of its batch),
the last socket read is stamped a microsecond or so per socket after the first, not after the parsing
of all the others.

On Linux, plain-http connections go further: the kernel stamps each received packet
(`SO_TIMESTAMPNS`) and the client reads that stamp with the bytes, so a recorded arrival does not
wait for the event loop. One read has one stamp, though, that of the last packet it holds: when the
client falls behind (its CPU taken by other work, or its loop busy), the packets that queued up are
read together and all get the last one's time. Elsewhere, and for https, the stamp is taken when the
event loop reads the socket.
Connections are kept alive and reused; https works through the standard `ssl` module. Proxies are
not supported.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import ssl
import struct
import sys
from dataclasses import dataclass
from time import perf_counter_ns, time_ns
from urllib.parse import urlsplit

from tokenpath.bench.stream import DROPPED, MALFORMED, Exchange
from tokenpath.config.errors import UserError, quoted

_HEAD_LIMIT = 64 * 1024
_READ_BYTES = 1 << 18
# Kernel receive timestamps: Linux's SO_TIMESTAMPNS (a CLOCK_REALTIME timespec with each read). The
# socket module does not name it; 35 is its value on the 64-bit architectures that use the generic
# socket numbers (linux/include/uapi/asm-generic/socket.h), where a timespec is two 64-bit integers.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_SCM_TIMESTAMPNS = getattr(socket, "SCM_TIMESTAMPNS", _SO_TIMESTAMPNS)
_GENERIC_64BIT = {"x86_64", "amd64", "aarch64", "arm64", "riscv64", "s390x", "ppc64le", "loongarch64"}
KERNEL_TIMESTAMPS = sys.platform.startswith("linux") and platform.machine().lower() in _GENERIC_64BIT
_TIMESPEC = struct.Struct("@qq")


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: scheme, host, port and path of one URL."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        try:
            parts = urlsplit(url)
        except ValueError as error:  # an unclosed [ of an IPv6 host, a bad character in the host
            raise UserError(f"--base-url: {quoted(url)} is not a valid URL ({error}); give e.g. "
                            "http://127.0.0.1:8000 or http://[::1]:8000") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--base-url: {quoted(url)} is not an http(s) URL; give e.g. http://127.0.0.1:8000")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:  # a port out of range, or 0 (which "or 80" would have read as no port at all)
            raise UserError(f"--base-url: {quoted(url)} has an invalid port; give a port from 1 to 65535")
        return cls(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), parts.path or "/")

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one exchange at a time."""

    __slots__ = (
        "transport", "exchange", "pool", "_head", "_mode", "_left", "_buffer", "_keep_alive",
        "closed", "_status", "_crlf",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._head = b""
        self._mode = "head"      # head, chunked, length, close, done
        self._left = 0           # bytes left: of the current chunk, or of a Content-Length body
        self._crlf = False       # expecting the CRLF that ends a chunk's data
        self._buffer = b""
        self._keep_alive = True
        self._status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, exchange: Exchange, request: bytes) -> None:
        self.exchange = exchange
        self._reset()
        self.transport.write(request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.flush()  # what arrived before the close is parsed first
        now = perf_counter_ns()
        exchange, self.exchange = self.exchange, None
        if exchange is None or self._mode == "done":
            return
        if self._mode == "close":
            exchange.body_end(now)
        else:
            why = f": {exc}" if exc else ""
            exchange.fail(DROPPED, f"connection closed after {exchange.events} events{why}", now)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ---- parsing --------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        now = perf_counter_ns()
        inbox = self.pool.inbox
        if not inbox:
            self.pool.schedule_flush()
        inbox.append((self, data, now))

    def stamped(self, data: bytes, at_ns: int) -> None:
        """Bytes that reached the socket at `at_ns` (a kernel timestamp on the perf_counter clock)."""
        inbox = self.pool.inbox
        if not inbox:
            self.pool.schedule_flush()
        inbox.append((self, data, at_ns))

    def process(self, data: bytes, now: int) -> None:
        """Parse bytes that arrived at `now`."""
        exchange = self.exchange
        if exchange is None:
            self.close()  # bytes nobody asked for: the connection is not in a usable state
            return
        exchange.last_rx_ns = now
        if self._mode == "head":
            data = self._read_head(data, now)
            if data is None:
                return
        mode = self._mode
        if mode == "chunked":
            self._read_chunked(data, now)
        elif mode == "length":
            take = data[: self._left]
            self._left -= len(take)
            if take:
                exchange.feed(take, now)
            if self._left == 0:
                self._body_done(now)
        elif mode == "close":
            exchange.feed(data, now)

    def _read_head(self, data: bytes, now: int) -> bytes | None:
        """Parse the status line and headers; the body bytes that followed them, or None."""
        head = self._head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > _HEAD_LIMIT:
                self._protocol_error("response headers exceed 64 KiB", now)
            self._head = head
            return None
        lines = head[:end].split(b"\r\n")
        rest = head[end + 4:]
        status_line = lines[0].split(None, 2)
        try:
            version, status = status_line[0], int(status_line[1])
        except (IndexError, ValueError):
            self._protocol_error(f"bad status line {lines[0][:80]!r}", now)
            return None
        if 100 <= status < 200:  # an interim response: the real one follows
            self._head = b""
            return self._read_head(rest, now) if rest else None
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        self._status = status
        self.exchange.head(status, headers.get(b"content-type", b"").decode("latin-1"))
        connection = headers.get(b"connection", b"").lower()
        self._keep_alive = version == b"HTTP/1.1" and connection != b"close" or connection == b"keep-alive"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._mode = "chunked"
        elif b"content-length" in headers:
            try:
                self._left = int(headers[b"content-length"])
            except ValueError:
                self._protocol_error("bad Content-Length", now)
                return None
            self._mode = "length"
            if self._left == 0:
                self._body_done(now)
                return None
        elif status in (204, 304):
            self._body_done(now)
            return None
        else:
            self._mode = "close"
            self._keep_alive = False
        return rest

    def _read_chunked(self, data: bytes, now: int) -> None:
        if not self._buffer and not self._left and not self._crlf:
            # The common case: whole chunks, each in one piece.
            eol = data.find(b"\r\n")
            if eol > 0:
                try:
                    length = int(data[:eol], 16)
                except ValueError:
                    length = -1
                end = eol + 2 + length
                if length > 0 and len(data) == end + 2 and data[end:] == b"\r\n":
                    self.exchange.feed(data[eol + 2:end], now)
                    return
        buffer = self._buffer + data if self._buffer else data
        self._buffer = b""
        pos, size = 0, len(buffer)
        pieces = []
        while pos < size:
            if self._crlf:
                if size - pos < 2:
                    break
                if buffer[pos:pos + 2] != b"\r\n":
                    self._protocol_error("chunk data not followed by CRLF", now)
                    return
                pos += 2
                self._crlf = False
            elif self._left:
                take = min(self._left, size - pos)
                pieces.append(buffer[pos:pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._crlf = True
            else:
                eol = buffer.find(b"\r\n", pos)
                if eol < 0:
                    if size - pos > 1024:
                        self._protocol_error("chunk size line too long", now)
                        return
                    break
                try:
                    length = int(buffer[pos:eol], 16)
                except ValueError:
                    try:
                        length = int(buffer[pos:eol].split(b";", 1)[0], 16)
                    except ValueError:
                        self._protocol_error(f"bad chunk size {buffer[pos:eol][:40]!r}", now)
                        return
                end = eol + 2 + length
                if length and end + 2 <= size and buffer[end:end + 2] == b"\r\n":
                    pieces.append(buffer[eol + 2:end])  # a whole chunk: take it in one step
                    pos = end + 2
                    continue
                if length == 0:
                    # The last chunk: trailers (usually none) end with an empty line.
                    if buffer.find(b"\r\n\r\n", eol) < 0:
                        break
                    if pieces:
                        self.exchange.feed(b"".join(pieces) if len(pieces) > 1 else pieces[0], now)
                    self._body_done(now)
                    return
                pos = eol + 2
                self._left = length
        self._buffer = buffer[pos:]
        if pieces and self.exchange is not None:
            self.exchange.feed(b"".join(pieces) if len(pieces) > 1 else pieces[0], now)

    def _body_done(self, now: int) -> None:
        self._mode = "done"
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.body_end(now)
        if self._keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def _protocol_error(self, detail: str, now: int) -> None:
        exchange, self.exchange = self.exchange, None
        self.close()
        if exchange is not None:
            exchange.fail(MALFORMED, f"HTTP: {detail}", now)


class StampedSocket:
    """A plain TCP socket read with `recvmsg`, each read carrying the kernel's receive timestamp.

    Acts as the transport of a `Connection`: `write`, `close`, `is_closing`.
    """

    __slots__ = ("sock", "fd", "loop", "connection", "clock", "_closing", "_sending")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, connection: Connection,
                 clock: Clock) -> None:
        self.sock, self.fd, self.loop, self.connection, self.clock = sock, sock.fileno(), loop, connection, clock
        self._closing = False
        self._sending: asyncio.Task | None = None
        connection.connection_made(self)  # type: ignore[arg-type]
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._lost(error)
            return
        now = perf_counter_ns()
        if not data:
            self._lost(None)
            return
        at = now
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                at = min(now, seconds * 1_000_000_000 + nanoseconds - self.clock.realtime_minus_perf_ns)
        self.connection.stamped(data, at)

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            sent = self.sock.send(data) if self._sending is None else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self.loop.call_soon(self._lost, error)
            return
        if sent < len(data):
            rest = data[sent:]
            previous = self._sending

            async def send_rest() -> None:
                if previous is not None:
                    await previous
                try:
                    await self.loop.sock_sendall(self.sock, rest)
                except OSError as error:
                    self._lost(error)

            self._sending = self.loop.create_task(send_rest())
            self._sending.add_done_callback(
                lambda task: setattr(self, "_sending", None) if self._sending is task else None)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.loop.remove_reader(self.fd)
        if self._sending is not None:
            self._sending.cancel()
        self.sock.close()
        self.loop.call_soon(self.connection.connection_lost, None)

    def _lost(self, error: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self.loop.remove_reader(self.fd)
        self.sock.close()
        self.connection.connection_lost(error)


class Clock:
    """The offset between CLOCK_REALTIME (kernel timestamps) and perf_counter (everything else)."""

    def __init__(self) -> None:
        self.realtime_minus_perf_ns = 0
        self.sample()

    def sample(self) -> None:
        """Read the offset, bracketing the realtime read between two perf_counter reads."""
        best = None
        for _ in range(5):
            before = perf_counter_ns()
            real = time_ns()
            after = perf_counter_ns()
            if best is None or after - before < best[0]:
                best = (after - before, real - (before + after) // 2)
        self.realtime_minus_perf_ns = best[1]


class Pool:
    """Idle keep-alive connections to one endpoint."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float, kernel_timestamps: bool = True) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self._ssl = ssl.create_default_context() if endpoint.scheme == "https" else None
        self.inbox: list[tuple[Connection, bytes, int]] = []  # stamped, not yet parsed
        self._loop: asyncio.AbstractEventLoop | None = None
        self.kernel_timestamps = kernel_timestamps and KERNEL_TIMESTAMPS and self._ssl is None
        self.clock = Clock()
        self._address: tuple | None = None

    def schedule_flush(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Parse everything stamped so far, in arrival order."""
        inbox = self.inbox
        if not inbox:
            return
        self.inbox = []
        for connection, data, now in inbox:
            try:
                connection.process(data, now)
            except Exception as error:  # noqa: BLE001 - a response no parser case foresaw fails its request only
                connection._protocol_error(f"unreadable response ({error.__class__.__name__}: {error})", now)

    async def acquire(self) -> Connection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        if self.kernel_timestamps:
            return await asyncio.wait_for(self._open_stamped(loop), self.connect_timeout_s)
        connect = loop.create_connection(
            lambda: Connection(self), endpoint.host, endpoint.port, ssl=self._ssl,
            server_hostname=endpoint.host if self._ssl else None,
        )
        _, connection = await asyncio.wait_for(connect, self.connect_timeout_s)
        return connection

    async def _open_stamped(self, loop: asyncio.AbstractEventLoop) -> Connection:
        if self._address is None:
            infos = await loop.getaddrinfo(self.endpoint.host, self.endpoint.port, type=socket.SOCK_STREAM)
            if not infos:
                raise OSError(f"cannot resolve {self.endpoint.host}")
            self._address = infos[0]
        family, kind, protocol, _, address = self._address
        sock = socket.socket(family, kind, protocol)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        connection = Connection(self)
        StampedSocket(sock, loop, connection, self.clock)
        return connection

    def release(self, connection: Connection) -> None:
        if not connection.closed:
            self.idle.append(connection)

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


def request_head(endpoint: Endpoint, path: str, body_length: int, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {endpoint.host_header}",
        "User-Agent: tokenpath-bench",
        "Accept: text/event-stream",
        "Content-Type: application/json",
        f"Content-Length: {body_length}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
