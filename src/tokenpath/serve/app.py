"""`tokenpath serve`: an OpenAI-compatible server whose tokens come out on the simulated engine's timing.

Every request joins a live simulated engine (one per data-parallel replica, routed round-robin), so
its first token waits for the batching, queueing and prefill the scenario's deployment would give
under the load clients actually offer. The text is real: each request streams a stretch of the
shipped corpus, token by token through the real detokenizer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from tokenpath.bench.prompts import corpus_text
from tokenpath.config.errors import UserError
from tokenpath.delivery import Detokenizer
from tokenpath.delivery.chat_template import added_tokens
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.stream import CONTEXT_TOKENS
from tokenpath.serve.connections import ConnectionLimits, Connections, Listener, ParseErrorLog
from tokenpath.serve.fields import parse_request
from tokenpath.serve.live import LiveEngine
from tokenpath.serve.network import Network
from tokenpath.serve.openai import ApiError, Ask
from tokenpath.serve.output import DONE, Response, new_response
from tokenpath.serve.send_log import SendLog
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario
from tokenpath.workload.lengths import sample_lengths

MAX_BODY_BYTES = 4 * 2**20
# Deepest JSON nesting a body may have: serde_json's default recursion limit (the JSON parser of
# Rust-based servers). OpenAI requests nest a few levels; tool schemas a dozen or so.
MAX_JSON_DEPTH = 128
# The text a JSON-mode response wraps the corpus in: {"text": "..."}.
JSON_OPEN, JSON_CLOSE = '{"text": "', '"}'
# Bodies up to this size are parsed (and their prompt tokenized) on the event loop: the embedded
# tokenizer encodes about 10 MB/s on one core (3.9 MB in 0.38 s), so at most about 2 ms. Larger ones
# go to a worker thread, so that streams keep their pace meanwhile.
INLINE_PARSE_BYTES = 16 * 2**10
# aiohttp cancels a handler whose client has gone only when asked: serve runs with this, so that a
# request whose client left is aborted at once, wherever it waits. A request aiohttp's parser refuses
# is logged in one line (connections.ParseErrorLog).
RUN_OPTIONS = {"handler_cancellation": True, "logger": ParseErrorLog(logging.getLogger("aiohttp.server"), {})}
log = logging.getLogger("tokenpath.serve")


@dataclass(frozen=True)
class ServeOptions:
    api_key: str | None = None
    served_model_name: str | None = None  # when set, the only model name accepted
    tokenizer: str | None = None          # a tokenizer file; None: the embedded default
    send_log: str | None = None           # JSONL of arrivals and each event's send time, for client accuracy tests
    limits: ConnectionLimits = ConnectionLimits()
    network_delay: bool = True            # emulate the scenario's client network (off: loopback measurement)


class Server:
    """The state behind the routes: engines, tokenizer, corpus and the run's random stream."""

    def __init__(self, scenario: Scenario, options: ServeOptions) -> None:
        self.scenario, self.options = scenario, options
        if scenario.deployment.prefill_replicas:
            raise UserError("deployment.prefill_replicas: serve runs colocated replicas only; set it to 0 to serve")
        if scenario.engine.speculative is not None:
            raise UserError("engine.speculative: serve streams one token a sequence each step; simulate models "
                            "speculative decoding, serve does not yet: remove [engine.speculative] to serve")
        self.deployment = build_deployment(scenario)
        self.model_name = options.served_model_name or scenario.model.name
        self.detokenizer = Detokenizer.load(options.tokenizer)
        # Tokens the chat template adds to each user message: the scenario's count, else (a completions
        # scenario, 0) what this tokenizer's own template adds, as simulate's "auto" counts it.
        self.template_tokens = scenario.chat_template_tokens() or added_tokens(options.tokenizer)
        self.corpus_ids = np.array(self.detokenizer.encode(corpus_text()), dtype=np.int64)
        # JSON mode streams the corpus inside a JSON string: quotes, backslashes and control characters
        # replaced, so that any stretch of it is valid inside one.
        safe = corpus_text().translate({ord('"'): "'", ord("\\"): "/", **{c: " " for c in range(32)}})
        self.json_corpus_ids = np.array(self.detokenizer.encode(safe), dtype=np.int64)
        self.json_open_ids = np.array(self.detokenizer.encode(JSON_OPEN), dtype=np.int64)
        self.json_close_ids = np.array(self.detokenizer.encode(JSON_CLOSE), dtype=np.int64)
        self.fingerprint = "fp_" + scenario.fingerprint()[:10]
        self.network = Network(LastMile(scenario.resolved_delivery()), options.network_delay)
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
            self.send_log = SendLog(self.options.send_log)

    async def stop(self, app: web.Application) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.send_log is not None:
            self.send_log.close()

    def count_tokens(self, text: str) -> int:
        return len(self.detokenizer.encode(text))

    def rng_for(self, ask: Ask) -> np.random.Generator:
        """The request's random stream: its own when it names a seed (the same seed, the same text)."""
        seed = ask.extras.seed
        return self.rng if seed is None else np.random.default_rng(seed % 2**64)

    def output_tokens(self, ask: Ask, rng: np.random.Generator) -> tuple[int, bool]:
        """The tokens this request will get, and whether it ends at a limit rather than as the model
        chose: max_tokens; else a draw from the scenario's lengths (at least min_tokens), up to the
        context the prompt leaves, as OpenAI's and vLLM's servers cap an unset max_tokens; with vLLM's
        ignore_eos, no draw (the model's end of sequence is ignored): that context (vLLM's get_max_tokens,
        max_model_len less the prompt)."""
        min_tokens = ask.extras.min_tokens
        if ask.max_tokens is not None:
            if min_tokens > ask.max_tokens:
                raise ApiError(400, f"'min_tokens' ({min_tokens}) must be at most max_tokens ({ask.max_tokens})",
                               "min_tokens")
            return ask.max_tokens, True
        room = self.context_tokens - ask.prompt_tokens
        if ask.extras.ignore_eos and room > 0:
            return room, True
        output = self.scenario.resolved_workload(chat_template=False).output
        drawn = max(int(sample_lengths(output, 1, rng, "workload.output")[0]), min_tokens)
        return (room, True) if 0 < room < drawn else (drawn, False)

    @property
    def context_tokens(self) -> int:
        """The context one request may fill: the model's, or the KV cache's where that holds less (in whole
        blocks, EngineSpec.longest_request_tokens), or one step's where the engine runs a whole request in a
        step (`EngineSpec.whole_step_tokens`: without chunked prefill, a preempted request's recompute; vLLM
        refuses to start with a budget below its max_model_len there, so it refuses longer requests)."""
        engine, deployment = self.deployment.engine, self.deployment
        context = min(deployment.model.max_context, engine.longest_request_tokens(deployment.kv_capacity_tokens))
        return min(context, engine.max_num_batched_tokens) if engine.step_holds_whole_request else context

    def token_ids(self, ask: Ask, output_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, bool]:
        """What the request generates: a stretch of the corpus, or in JSON mode a JSON document of
        exactly `output_tokens` tokens (cut short, as a model's, when that is too few to close it); the
        prompt tail its text follows (the CONTEXT_TOKENS corpus tokens before the stretch: the stream
        starts in context, as an engine's after a prompt); and whether it was cut short."""
        corpus = self.json_corpus_ids if ask.extras.json_mode else self.corpus_ids
        start = int(rng.integers(0, len(corpus)))
        context = np.take(corpus, np.arange(start - CONTEXT_TOKENS, start), mode="wrap")
        if not ask.extras.json_mode:
            return np.take(corpus, np.arange(start, start + output_tokens), mode="wrap"), context, False
        inner = max(0, output_tokens - len(self.json_open_ids) - len(self.json_close_ids))
        stretch = np.take(corpus, np.arange(start, start + inner), mode="wrap")
        document = np.concatenate([self.json_open_ids, stretch, self.json_close_ids])
        return document[:output_tokens], context, len(document) > output_tokens

    def check_fits(self, ask: Ask, output_tokens: int) -> None:
        total = ask.prompt_tokens + output_tokens
        limit = self.context_tokens
        field = "prompt" if ask.endpoint == "completions" else "messages"
        engine = self.deployment.engine
        if engine.step_bounds_prompts and ask.prompt_tokens > engine.max_num_batched_tokens:
            # As TensorRT-LLM refuses it without chunked prefill (tensorrt_llm/llmapi/llm.py, _check_arguments):
            # the engine would never run it, and the requests queued behind it would wait for it forever.
            raise ApiError(400, f"the prompt is {ask.prompt_tokens} tokens but without chunked prefill the engine runs "
                                f"a prompt whole in one step of at most {engine.max_num_batched_tokens} tokens "
                                "(max_num_batched_tokens); "
                                "shorten the prompt", field, code="context_length_exceeded")
        if ask.prompt_tokens >= limit:
            raise ApiError(400, f"the prompt is {ask.prompt_tokens} tokens but the deployment holds {limit} tokens of "
                                "context, for the prompt and at least one generated token; shorten the prompt", field,
                           code="context_length_exceeded")
        if total > limit:
            raise ApiError(400, f"this request needs {total} tokens of context ({ask.prompt_tokens} in the prompt "
                                f"+ {output_tokens} to generate) but the deployment holds {limit}; "
                                "shorten the prompt or lower max_tokens", "max_tokens", code="context_length_exceeded")


SERVER = web.AppKey("server", Server)
CONNECTIONS = web.AppKey("connections", Connections)


def _authorize(server: Server, request: web.Request) -> None:
    if server.options.api_key is None:
        return
    # The scheme is case-insensitive and one or more spaces end it (RFC 7235 section 2.1).
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or credentials.lstrip(" ") != server.options.api_key:
        raise ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                       kind="authentication_error", code="invalid_api_key")


async def _body(request: web.Request, timeout_s: float) -> tuple[Any, int]:
    """The request's JSON body, and its size in bytes."""
    too_large = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise too_large  # said up front: none of it is read
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except ConnectionResetError:  # the client closed before its body was whole: the answer reaches nobody
        raise ApiError(400, "the connection closed before the request body was whole") from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s (serve --body-timeout)",
                       code="request_timeout") from None
    except web.RequestPayloadError as error:
        raise ApiError(400, f"the request body could not be read: {error}") from None
    return decode_body(raw), len(raw)


def decode_body(raw: bytes) -> Any:
    """A body as JSON, or a 400 saying why not (never an exception of another kind)."""
    too_deep = ApiError(400, f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} deep")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        # orjson 3.9 and later refuse 1024 levels themselves, in their own words: the same 400 as below
        if _text_depth(raw[:error.pos + 1]) > MAX_JSON_DEPTH:
            raise too_deep from None
        raise ApiError(400, f"the request body is not valid JSON: {error}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _depth_exceeds(value, MAX_JSON_DEPTH):
        raise too_deep
    return value


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?')  # to the closing quote, or the end
_NESTING_STEP = np.zeros(256, np.int64)
_NESTING_STEP[[ord("["), ord("{")]], _NESTING_STEP[[ord("]"), ord("}")]] = 1, -1


def _text_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in JSON text that need not parse (brackets in strings do not count)."""
    steps = _NESTING_STEP[np.frombuffer(_JSON_STRING.sub(b"", raw), np.uint8)]
    return int(np.cumsum(steps).max(initial=0))


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep (a loop, not recursion: any depth is safe)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _request_bytes(request: web.Request, body_bytes: int) -> int:
    """The bytes of the request as it crossed the network: request line, headers and body."""
    line = len(request.method) + len(request.raw_path) + len("  HTTP/1.1\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in request.raw_headers) + 2 + body_bytes


def _completion_route(endpoint: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        arrival_ns = time.perf_counter_ns()
        server: Server = request.app[SERVER]
        _authorize(server, request)
        body, body_bytes = await _body(request, server.options.limits.body_timeout_s)
        if body_bytes <= INLINE_PARSE_BYTES:
            ask = parse_request(body, endpoint, server.count_tokens, server.template_tokens)
        else:  # a large prompt is tokenized off the event loop, so that streams keep their pace
            ask = await asyncio.to_thread(parse_request, body, endpoint, server.count_tokens,
                                            server.template_tokens)
        if server.options.served_model_name and ask.model != server.model_name:
            raise ApiError(404, f"the model {ask.model!r} does not exist; this server serves {server.model_name!r}",
                           "model", code="model_not_found")
        rng = server.rng_for(ask)
        output_tokens, limited = server.output_tokens(ask, rng)
        server.check_fits(ask, output_tokens)
        token_ids, context_ids, cut = server.token_ids(ask, output_tokens, rng)
        # A JSON document ends as a model's does once it closes (by "stop", however many tokens it was
        # allowed), by "length" only cut short; text runs to its limit, as a benchmark's max_tokens asks.
        ends_at_limit = cut if ask.extras.json_mode else limited
        response = new_response(ask, token_ids, server.fingerprint, ends_at_limit=ends_at_limit,
                                context_ids=context_ids)
        if ask.stream and server.network.enabled:
            response.queue = server.network.queue()  # type: ignore[assignment]
        upload_ns = server.network.delay_ns(_request_bytes(request, body_bytes))  # the engine sees it after its upload
        engine = server.engines[next(server.next_engine)]
        engine.submit(response, upload_ns)
        submitted_ns = time.perf_counter_ns()
        try:
            if ask.stream:
                return await _stream(request, server, response, arrival_ns, submitted_ns)
            reply = orjson.dumps(await _whole(response))
            await server.network.carry(len(reply))
            return web.Response(body=reply, content_type="application/json")
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
            "system_fingerprint": response.system_fingerprint, "choices": [choice], "usage": usage}


async def _stream(request: web.Request, server: Server, response: Response, arrival_ns: int,
                  submitted_ns: int = 0) -> web.StreamResponse:
    """Stream a response's events; `arrival_ns` when its handler began, `submitted_ns` when its engine got it."""
    http = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    send_log = server.send_log
    if send_log is not None:
        send_log.write(f'{{"id":"{response.request_id}","arrival_ns":{arrival_ns},"submitted_ns":{submitted_ns}}}\n')
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
        response = web.json_response(error.body(), status=error.status)
        if error.status == 408:  # the rest of the body may still come: nothing else can follow on this connection
            return await _send_and_close(request, response)
        return response
    except web.HTTPException as error:
        if error.status < 400:
            raise
        # (its headers kept, such as a 405's Allow, which RFC 9110 requires; its body replaced)
        kept = {name: value for name, value in error.headers.items() if name not in ("Content-Type", "Content-Length")}
        return web.json_response(ApiError(error.status, error.reason).body(), status=error.status, headers=kept)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as error:  # a bug of ours: report it to the client, keep serving others
        return web.json_response(ApiError(500, f"internal error: {error!r}", kind="server_error").body(), status=500)


async def _send_and_close(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    if request.transport is not None:
        request.transport.close()
    return response


def make_app(scenario: Scenario, options: ServeOptions = ServeOptions()) -> web.Application:
    server = Server(scenario, options)
    connections = Connections(options.limits)
    app = web.Application(middlewares=[connections.middleware, _errors], client_max_size=MAX_BODY_BYTES)
    app[SERVER], app[CONNECTIONS] = server, connections
    app.on_startup.append(server.start)
    app.on_cleanup.append(server.stop)
    app.router.add_post("/v1/completions", _completion_route("completions"))
    app.router.add_post("/v1/chat/completions", _completion_route("chat"))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app


async def start_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, Listener]:
    """Serve `app` on host:port (0: a free port, `listener.port`) behind serve's connection limits."""
    runner = web.AppRunner(app, **RUN_OPTIONS)
    await runner.setup()
    listener = Listener(app[CONNECTIONS], runner.server)
    try:
        await listener.start(host, port)
    except BaseException:
        await runner.cleanup()
        raise
    return runner, listener


async def stop_server(runner: web.AppRunner, listener: Listener) -> None:
    await listener.close()
    await runner.cleanup()


def run(app: web.Application, host: str, port: int, on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM (the `serve` command); `on_ready` gets the port once listening."""

    async def main() -> None:
        runner, listener = await start_server(app, host, port)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signal_number, stopping.set)
            except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C raises KeyboardInterrupt instead
                pass
        try:
            if on_ready is not None:
                on_ready(listener.port)
            await stopping.wait()
        finally:
            await stop_server(runner, listener)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
