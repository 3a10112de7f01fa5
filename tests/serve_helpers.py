"""tokenpath serve on a free 127.0.0.1 port, in a thread with its own event loop, for tests whose
client side runs in the test's thread."""

import asyncio
import threading

from tokenpath.serve import ServeOptions, make_app
from tokenpath.serve.app import start_server, stop_server


class LoopbackServer:
    """`with LoopbackServer(scenario, options) as url:` serves until the block ends."""

    def __init__(self, scenario, options=ServeOptions()):
        self.app = make_app(scenario, options)
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.runner, self.listener = self.loop.run_until_complete(start_server(self.app, "127.0.0.1", 0))
        self.port = self.listener.port
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(60)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(stop_server(self.runner, self.listener), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's payload (its last, empty chunk ends it)."""
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2:]
