"""A server on a free 127.0.0.1 port that answers every connection with the same bytes and closes it:
garbage, or an HTTP response that is not an OpenAI-compatible one."""

import socket
import threading


def http_response(status: str, body: bytes, content_type: str = "text/plain") -> bytes:
    """One complete HTTP/1.1 response that closes its connection."""
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + body


class RawServer:
    """`with RawServer(answer) as server:` serves at `server.url`; `server.requests` counts the
    connections answered."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed: the block ended
                return
            with connection:
                connection.settimeout(5)
                try:
                    connection.recv(1 << 16)  # the request (its head at least), then the answer
                    connection.sendall(self.answer)
                except OSError:
                    pass
            self.requests += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux); close alone would not
        except OSError:
            pass
        self.listener.close()
        self.thread.join(10)
