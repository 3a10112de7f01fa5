"""A burst of HTTP requests sent at once, each on a connection of its own, every response read to its end.

The calibrations of a server's own HTTP work use it (serve/measure.py, calibrate/engine_http.py): a
plain blocking client on a selector, light enough to run beside the server it measures, whose CPU
time is counted apart from the server's.
"""

from __future__ import annotations

import selectors
import socket

from tokenpath.bench.http import Endpoint, request_head

READ_BYTES = 1 << 16
# The last chunk of an HTTP/1.1 chunked body: a streamed response's end.
LAST_CHUNK = b"0\r\n\r\n"


def post_request(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A POST of `body` (JSON) to 127.0.0.1:`port`, head and body, as bench sends one."""
    endpoint = Endpoint.parse(f"http://127.0.0.1:{port}")
    return request_head(endpoint, path, len(body), headers or {}) + body


def send_burst(port: int, count: int, request: bytes, received: list[bytes] | None = None) -> None:
    """Open `count` connections to 127.0.0.1:`port` at once, send each `request`, read every response to
    its last chunk or the connection's end (into `received`, one bytes per connection, when given), close."""
    sockets = []
    try:
        for _ in range(count):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(request)
            sockets.append(conn)
        with selectors.DefaultSelector() as selector:
            for conn in sockets:
                selector.register(conn, selectors.EVENT_READ)
            tails = {conn: b"" for conn in sockets}
            whole = {conn: [] for conn in sockets} if received is not None else None
            while tails:
                for key, _ in selector.select():
                    conn = key.fileobj
                    data = conn.recv(READ_BYTES)
                    if whole is not None:
                        whole[conn].append(data)
                    tail = tails[conn][-8:] + data
                    if not data or tail.endswith(LAST_CHUNK):
                        selector.unregister(conn)
                        del tails[conn]
                    else:
                        tails[conn] = tail
            if whole is not None:
                received.extend(b"".join(whole[conn]) for conn in sockets)
    finally:
        for conn in sockets:
            conn.close()
