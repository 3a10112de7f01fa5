"""`tokenpath serve`: an OpenAI-compatible server whose tokens come out on the simulated engine's timing.

Every request joins a live simulated engine (one per data-parallel replica, routed round-robin), so
its first token waits for the batching, queueing and prefill the scenario's deployment would give
under the load clients actually offer. The text is real: each request streams a stretch of the
shipped corpus, token by token through the real detokenizer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np
from aiohttp import web

from tokenpath.bench.prompts import corpus_text
from tokenpath.delivery import Detokenizer
from tokenpath.errors import UserError
from tokenpath.pipeline import build_deployment
from tokenpath.scenario import Scenario
from tokenpath.serve.live import LiveEngine
from tokenpath.serve.openai import ApiError, Ask, parse
from tokenpath.serve.output import DONE, Response, new_response
from tokenpath.workload.lengths import sample_lengths

MAX_BODY_BYTES = 4 * 2**20
# Bodies up to this size are parsed (and their prompt tokenized) on the event loop: the embedded
# tokenizer encodes about 10 MB/s on one core (3.9 MB in 0.38 s), so at most about 2 ms. Larger ones
# go to a worker thread, so that streams keep their pace meanwhile.
INLINE_PARSE_BYTES = 16 * 2**10
# aiohttp cancels a handler whose client has gone only when asked: serve runs with this, so that a
# request whose client left is aborted at once, wherever it waits.
RUN_OPTIONS = {"handler_cancellation": True}
log = logging.getLogger("tokenpath.serve")


@dataclass(frozen=True)
class ServeOptions:
    api_key: str | None = None
    served_model_name: str | None = None  # when set, the only model name accepted
    tokenizer: str | None = None          # a tokenizer file; None: the embedded default
    send_log: str | None = None           # JSONL of each event's send time, for client accuracy tests


class Server:
    """The state behind the routes: engines, tokenizer, corpus and the run's random stream."""

    def __init__(self, scenario: Scenario, options: ServeOptions) -> None:
        self.scenario, self.options = scenario, options
        if scenario.deployment.prefill_replicas:
            raise UserError("deployment.prefill_replicas: serve runs colocated replicas only; set it to 0 to serve")
        self.deployment = build_deployment(scenario)
        self.model_name = options.served_model_name or scenario.model.name
        self.detokenizer = Detokenizer.load(options.tokenizer)
        self.corpus_ids = np.array(self.detokenizer.encode(corpus_text()), dtype=np.int64)
        self.rng = np.random.default_rng(scenario.seed)
        self.engines: list[LiveEngine] = []
        self.next_engine = itertools.cycle(range(self.deployment.replicas))
        self.tasks: list[asyncio.Task[None]] = []
        self.send_log = None

    async def start(self, app: web.Application) -> None:
        self.engines = [LiveEngine(self.scenario, self.deployment, self.detokenizer)
                        for _ in range(self.deployment.replicas)]
        self.tasks = [asyncio.create_task(engine.run()) for engine in self.engines]
        if self.options.send_log:
            self.send_log = open(self.options.send_log, "a", encoding="utf-8")

    async def stop(self, app: web.Application) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.send_log is not None:
            self.send_log.close()

    def count_tokens(self, text: str) -> int:
        return len(self.detokenizer.encode(text))

    def output_tokens(self, ask: Ask) -> int:
        """The tokens this request will get: max_tokens, else a draw from the scenario's lengths."""
        if ask.max_tokens is not None:
            return ask.max_tokens
        return int(sample_lengths(self.scenario.resolved_workload().output, 1, self.rng, "workload.output")[0])

    def check_fits(self, ask: Ask, output_tokens: int) -> None:
        total = ask.prompt_tokens + output_tokens
        limit = min(self.deployment.model.max_context, self.deployment.kv_capacity_tokens)
        if ask.prompt_tokens >= limit:
            field = "prompt" if ask.endpoint == "completions" else "messages"
            raise ApiError(400, f"the prompt is {ask.prompt_tokens} tokens but the deployment holds {limit} tokens of "
                                "context, for the prompt and at least one generated token; shorten the prompt", field,
                           code="context_length_exceeded")
        if total > limit:
            raise ApiError(400, f"this request needs {total} tokens of context ({ask.prompt_tokens} in the prompt "
                                f"+ {output_tokens} to generate) but the deployment holds {limit}; "
                                "shorten the prompt or lower max_tokens", "max_tokens", code="context_length_exceeded")


SERVER = web.AppKey("server", Server)


def _authorize(server: Server, request: web.Request) -> None:
    if server.options.api_key is None:
        return
    if request.headers.get("Authorization", "") != f"Bearer {server.options.api_key}":
        raise ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                       kind="authentication_error", code="invalid_api_key")


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes") from None
    try:
        return json.loads(raw)
    except ValueError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None


def _completion_route(endpoint: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        server: Server = request.app[SERVER]
        _authorize(server, request)
        body = await _body(request)
        if len(await request.read()) <= INLINE_PARSE_BYTES:  # the body, as read (and kept) by _body
            ask = parse(body, endpoint, server.count_tokens)
        else:
            ask = await asyncio.to_thread(parse, body, endpoint, server.count_tokens)
        if server.options.served_model_name and ask.model != server.model_name:
            raise ApiError(404, f"the model {ask.model!r} does not exist; this server serves {server.model_name!r}",
                           "model", code="model_not_found")
        output_tokens = server.output_tokens(ask)
        server.check_fits(ask, output_tokens)
        start = int(server.rng.integers(0, len(server.corpus_ids)))
        ids = np.take(server.corpus_ids, np.arange(start, start + output_tokens), mode="wrap")
        response = new_response(ask, ids)
        engine = server.engines[next(server.next_engine)]
        engine.submit(response)
        try:
            if ask.stream:
                return await _stream(request, server, response)
            return web.json_response(await _whole(response))
        finally:  # if it ended early (its client left), the engine stops working on it
            if not response.ended:
                log.info("%s aborted after %d tokens: its client left", response.request_id, response.tokens)
            engine.abort(response)

    return handle


async def _whole(response: Response) -> dict[str, Any]:
    """A non-streaming response: all the text, once the last token has come."""
    parts = []
    while (piece := await response.queue.get()) is not DONE:
        parts.append(piece)
    if response.error is not None:
        raise response.error
    ask, text = response.ask, "".join(parts)
    if ask.endpoint == "chat":
        kind, choice = "chat.completion", {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        kind, choice = "text_completion", {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason=response.finish_reason)
    usage = {"prompt_tokens": ask.prompt_tokens, "completion_tokens": response.tokens,
             "total_tokens": ask.prompt_tokens + response.tokens}
    return {"id": response.request_id, "object": kind, "created": response.created, "model": ask.model,
            "choices": [choice], "usage": usage}


async def _stream(request: web.Request, server: Server, response: Response) -> web.StreamResponse:
    http = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    send_log = server.send_log
    events = 0
    try:
        await http.prepare(request)
        while (data := await response.queue.get()) is not DONE:
            await http.write(data)
            if send_log is not None:
                send_log.write(f'{{"id":"{response.request_id}","event":{events},"send_ns":{time.perf_counter_ns()}}}\n')
            events += 1
        await http.write_eof()
    except ConnectionError:  # the client left mid-stream: nothing to send it; the caller aborts the request
        pass
    return http


async def _models(request: web.Request) -> web.Response:
    server: Server = request.app[SERVER]
    _authorize(server, request)
    return web.json_response({"object": "list", "data": [
        {"id": server.model_name, "object": "model", "created": 0, "owned_by": "tokenpath"}]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    """Every refusal as an OpenAI-style JSON error; nothing a client sends stops the server."""
    try:
        return await handler(request)
    except ApiError as error:
        return web.json_response(error.body(), status=error.status)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return web.json_response(ApiError(error.status, error.reason).body(), status=error.status)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as error:  # a bug of ours: report it to the client, keep serving others
        return web.json_response(ApiError(500, f"internal error: {error!r}", kind="server_error").body(), status=500)


def make_app(scenario: Scenario, options: ServeOptions = ServeOptions()) -> web.Application:
    server = Server(scenario, options)
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[SERVER] = server
    app.on_startup.append(server.start)
    app.on_cleanup.append(server.stop)
    app.router.add_post("/v1/completions", _completion_route("completions"))
    app.router.add_post("/v1/chat/completions", _completion_route("chat"))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app
