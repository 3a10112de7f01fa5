"""An engine's OpenAI server reduced to its HTTP layer: FastAPI under uvicorn, as vLLM and SGLang run it,
with the engine stood in for by chunks built in advance. calibrate/engine_http.py runs it in a process
of its own (`python -m tokenpath.calibrate.engine_http_app FD`, FD a bound socket) and counts its CPU.

What it keeps of the engines' servers, each as their code has it:
- the launch: a FastAPI app with CORSMiddleware (allow every origin, method and header), served by a
  `uvicorn.Server` on a socket bound before it starts, inside `uvloop.run` (vLLM's api_server.py
  `run_server` -> launcher.py `serve_http`: `uvicorn.Config(app, log_level="info", access_log=True,
  timeout_keep_alive=5)`; SGLang's http_server.py `launch_server`: `uvicorn.run(app, loop="uvloop",
  timeout_keep_alive=5)`). uvicorn picks its HTTP protocol itself (`http="auto"`: httptools where
  installed, else h11); the access log is on, as both engines leave it, written to wherever stdout goes;
- the chat route: `POST /v1/chat/completions` with vLLM's `validate_json_request` dependency (the
  content type checked), its `with_cancellation` wrapper (the handler in a task of its own raced against
  a task that listens for the client's disconnect) and the body parsed by FastAPI into the engine's
  pydantic `ChatCompletionRequest` (delivery/engine_protocol.py); the answer is
  `StreamingResponse(content=generator, media_type="text/event-stream")` over serving_chat's async
  generator, itself over the engine client's (vLLM V1's `AsyncLLM.generate`), which awaits each output
  from a per-request collector (`RequestOutputCollector`: an output and an asyncio.Event);
- `POST /v1/raw/chat/completions`: the same route but for the body, read and not parsed, so the two
  routes' difference is FastAPI's own parsing of the body into the model.

The engine's side: once the planned number of streams are open, a task puts one chunk into every
stream's collector per step (as vLLM's output handler does with each engine step's outputs) and waits
until every stream has written it, then the next; after the last step, each stream ends with
`data: [DONE]`. `POST /_plan` sets the streams and steps of the next measurement (outside it).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import sys
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from tokenpath.delivery.engine_protocol import ChatCompletionRequest, engine_event

CHAT_PATH = "/v1/chat/completions"
RAW_PATH = "/v1/raw/chat/completions"
PLAN_PATH = "/_plan"
DONE = "data: [DONE]\n\n"
# The words each chunk carries, as English prose tokenizes: a few bytes of text each.
EVENT_TEXTS = (" the", " server", " streams", " each", " token", " as", " it", " comes")


def chunks(count: int) -> list[str]:
    """`count` chat chunks as the engine's serving_chat yields them (str), a word of text each."""
    return [engine_event("chatcmpl-0123456789abcdef", "tokenpath", 1_700_000_000,
                         EVENT_TEXTS[k % len(EVENT_TEXTS)]).decode() for k in range(count)]


class Collector:
    """One request's outputs between the engine's output handler and its stream (vLLM V1's
    RequestOutputCollector): the latest output, and an event its stream waits on."""

    def __init__(self) -> None:
        self.output: str | None = None
        self.ready = asyncio.Event()

    def put(self, output: str) -> None:
        self.output = output
        self.ready.set()

    async def get(self) -> str:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        return output


class Steps:
    """The engine stood in for: each group of the planned number of streams, once all are open, sent the
    planned chunks one step at a time."""

    def __init__(self) -> None:
        self.plan(0, [])

    def plan(self, streams: int, step_chunks: list[str]) -> None:
        self.streams, self.chunks = streams, step_chunks
        self.opened: list[Collector] = []
        self.written, self.target = 0, 0
        self.step_written = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()

    def open(self) -> Collector:
        collector = Collector()
        self.opened.append(collector)
        if len(self.opened) == self.streams:
            task = asyncio.get_running_loop().create_task(self._run(self.opened))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            self.opened = []
        return collector

    async def _run(self, collectors: list[Collector]) -> None:
        self.written = 0
        for k, chunk in enumerate(self.chunks):
            self.target = (k + 1) * len(collectors)
            self.step_written.clear()
            for collector in collectors:
                collector.put(chunk)
            await self.step_written.wait()
        for collector in collectors:
            collector.put(DONE)

    def wrote(self) -> None:
        self.written += 1
        if self.written >= self.target:
            self.step_written.set()


async def generate(collector: Collector):
    """The engine client's stream of one request's outputs (AsyncLLM.generate), to its end."""
    while True:
        output = await collector.get()
        yield output
        if output is DONE:
            return


async def chat_stream(collector: Collector, steps: Steps):
    """serving_chat's chat_completion_stream_generator, its chunks built in advance: each is written to
    the socket before the generator is asked for the next."""
    async for chunk in generate(collector):
        yield chunk
        if chunk is not DONE:
            steps.wrote()


async def validate_json_request(raw_request: Request) -> None:
    """The check vLLM and SGLang run before their chat route: the body is JSON."""
    content_type = raw_request.headers.get("content-type", "").lower()
    if content_type.split(";", maxsplit=1)[0] != "application/json":
        raise RequestValidationError(errors=[{"loc": ["header", "content-type"], "type": "value_error",
                                               "msg": "Unsupported Media Type: Only 'application/json' is allowed"}])


async def listen_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break


def with_cancellation(handler):
    """vLLM's wrapper (entrypoints/utils.py): the handler raced against the client's disconnect."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = args[1] if len(args) > 1 else kwargs["raw_request"]
        handler_task = asyncio.create_task(handler(*args, **kwargs))
        cancellation_task = asyncio.create_task(listen_for_disconnect(request))
        done, pending = await asyncio.wait([handler_task, cancellation_task], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return handler_task.result() if handler_task in done else None

    return wrapper


async def raw_body(raw_request: Request) -> bytes:
    return await raw_request.body()


class Plan(BaseModel):
    streams: int
    events: int


def build_app(steps: Steps) -> FastAPI:
    app = FastAPI()
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=False, allow_methods=["*"],
                       allow_headers=["*"])

    @app.post(CHAT_PATH, dependencies=[Depends(validate_json_request)])
    @with_cancellation
    async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request):
        return StreamingResponse(content=chat_stream(steps.open(), steps), media_type="text/event-stream")

    @app.post(RAW_PATH, dependencies=[Depends(validate_json_request)])
    @with_cancellation
    async def create_raw_chat_completion(raw_request: Request, body: bytes = Depends(raw_body)):
        return StreamingResponse(content=chat_stream(steps.open(), steps), media_type="text/event-stream")

    @app.post(PLAN_PATH)
    async def plan(plan: Plan) -> dict[str, Any]:
        steps.plan(plan.streams, chunks(plan.events))
        loop = asyncio.get_running_loop()
        return {"pid": os.getpid(), "loop": f"{type(loop).__module__}.{type(loop).__name__}",
                "http": app.state.http_protocol}

    return app


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    app = build_app(Steps())
    config = uvicorn.Config(app, log_level="info", access_log=True, timeout_keep_alive=5)
    config.load()
    app.state.http_protocol = f"{config.http_protocol_class.__module__}.{config.http_protocol_class.__name__}"
    server = uvicorn.Server(config)
    try:
        import uvloop
    except ImportError:  # uvloop is not on every platform; asyncio's own loop then
        asyncio.run(server.serve(sockets=[sock]))
    else:
        uvloop.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main(sys.argv[1:])
