"""A small real streaming server for the bench tests: OpenAI-style SSE over loopback, with faults.

`FakeServer` runs aiohttp on 127.0.0.1 (a free port) in a thread of its own. What a request gets is
chosen per request index (read from the tag the bench client puts at the head of each prompt) by
`behavior(i) -> name`; each event's send time (perf_counter_ns, taken just before the write) is logged
per request so tests can check that every client timestamp comes after the server's send.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from aiohttp import web

MODEL = "test-model"
_TAG = re.compile(r"^\[[0-9a-f]*-?(\d+)\]")

BEHAVIORS = (
    "ok", "multi", "drop", "http500", "http429", "malformed", "stall", "drip", "empty_first", "role_first",
    "whitespace_first", "reasoning", "error_event", "no_done", "comments", "crlf", "json", "html", "huge",
)
HUGE_EVENT_BYTES = 3 * 2**20  # the "huge" behavior's second event: one SSE line of this size


class FakeServer:
    def __init__(self, behavior: Callable[[int], str] | str = "ok", itl_s: float = 0.0, first_delay_s: float = 0.0,
                 drip_s: float = 0.05, chunks_per_write: int = 1, pause_s: float = 0.6) -> None:
        self.behavior = behavior if callable(behavior) else (lambda i, name=behavior: name)
        self.itl_s, self.first_delay_s, self.drip_s = itl_s, first_delay_s, drip_s
        self.pause_s = pause_s  # the "pause" behavior: this long a silence after the third event
        self.sends: dict[int, list[tuple[int, int]]] = defaultdict(list)  # i -> [(send_ns, tokens)]
        self.received: dict[int, dict] = {}
        self.prompts: list[str] = []  # every prompt, in the order received (untagged ones too)
        self.bodies: list[dict] = []  # every request body, in the order received
        self.received_ns: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> FakeServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    # ---- handlers ---------------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=True)

    async def _stream(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = time.perf_counter_ns()
        body = await request.json()
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        match = _TAG.match(prompt)
        i = int(match.group(1)) if match else -1
        self.prompts.append(prompt)
        self.bodies.append(body)
        self.received[i], self.received_ns[i] = body, received
        behavior = self.behavior(i)
        if behavior == "http500":
            return web.json_response({"error": {"message": "internal failure for the test"}}, status=500)
        if behavior == "http429":
            return web.json_response({"error": {"message": "rate limited for the test"}}, status=429)
        if behavior == "json":  # a server that ignores "stream": true
            return web.json_response({"id": f"cmpl-{i}", "object": "text_completion",
                                      "choices": [{"index": 0, "text": " w0 w1", "finish_reason": "length"}]})
        if behavior == "html":  # something else answering at that address
            return web.Response(text="<html><body>Welcome to nginx!</body></html>", content_type="text/html")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        n = int(body["max_tokens"])
        per_event = body.get("stream_options", {}).get("continuous_usage_stats", False)
        include_usage = body.get("stream_options", {}).get("include_usage", False)
        usage_base = {"prompt_tokens": len(prompt.split())}
        sep = b"\r\n\r\n" if behavior == "crlf" else b"\n\n"

        async def send(payload: dict | bytes, tokens: int = 0) -> None:
            data = payload if isinstance(payload, bytes) else b"data: " + json.dumps(payload).encode() + sep
            self.sends[i].append((time.perf_counter_ns(), tokens))
            await response.write(data)

        def chunk(text: str | None, done_tokens: int, finish: str | None = None, reasoning: str | None = None,
                  role: bool = False) -> dict:
            if chat:
                delta: dict = {}
                if role:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                if reasoning is not None:
                    delta["reasoning_content"] = reasoning
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            event = {"id": f"cmpl-{i}", "object": "chunk", "model": MODEL, "choices": [choice]}
            if per_event:
                event["usage"] = {**usage_base, "completion_tokens": done_tokens}
            return event

        if behavior == "role_first" and chat:
            await send(chunk("", 0, role=True))
        if behavior == "empty_first":
            await send(chunk("", 0))
        if behavior == "comments":
            await send(b": keep-alive\n\n")
            await send(b"event: message\nid: 1\ndata: " + json.dumps(chunk(None, 0)).encode() + b"\n\n")
        await asyncio.sleep(self.first_delay_s)
        step = 3 if behavior == "multi" else 1
        if behavior == "stop_early":  # an answer the server ends at its second token, ignore_eos or not
            n = min(n, 2)
        done = 0
        k = 0
        while done < n:
            take = min(step, n - done)
            done += take
            last = done == n
            text = "".join(f" w{done - take + j}" for j in range(take))
            if behavior == "whitespace_first" and k == 0:
                text = " " if take == 1 else " " * take
            if behavior == "reasoning" and chat and done <= n // 2:
                event = chunk(None, done, "length" if last else None, reasoning=text)
            else:
                event = chunk(text, done, ("stop" if behavior == "stop_early" else "length") if last else None)
            await send(event, take)
            k += 1
            if behavior == "drop" and k == 3:
                request.transport.close()
                return response
            if behavior == "malformed" and k == 2:
                await send(b"data: {this is not json\n\n")
            if behavior == "huge" and k == 1:  # the client gives up on the request part way through it
                try:
                    await send(b'data: {"choices": [{"text": "' + b"x" * HUGE_EVENT_BYTES + b'"}]}\n\n')
                    await asyncio.sleep(3600)
                except ConnectionError:
                    return response
            if behavior == "error_event" and k == 2:
                await send({"error": {"message": "engine died for the test", "code": 500}})
            if behavior == "stall" and k == 2:
                await asyncio.sleep(3600)
            if behavior == "pause" and k == 3:
                await asyncio.sleep(self.pause_s)
            if behavior == "drip":
                await asyncio.sleep(self.drip_s)
            elif self.itl_s:
                await asyncio.sleep(self.itl_s)
        if include_usage:
            await send({"id": f"cmpl-{i}", "choices": [], "usage": {**usage_base, "completion_tokens": n}})
        if behavior != "no_done":
            await send(b"data: [DONE]" + sep)
        await response.write_eof()
        return response


def test_fake_server_streams_sse() -> None:
    """The helper itself: a plain request gets SSE events, a usage chunk and [DONE]."""
    import urllib.request

    with FakeServer() as server:
        body = json.dumps({"model": MODEL, "prompt": "[ab-3] hello", "max_tokens": 4, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        request = urllib.request.Request(server.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
    events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:4]] == [" w0", " w1", " w2", " w3"]
    assert json.loads(events[4])["usage"]["completion_tokens"] == 4
    assert len(server.sends[3]) == 6
