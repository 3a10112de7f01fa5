"""The real last mile of `tokenpath serve`, run once per engine step for the whole batch.

Each request holds a slot while it streams: one batched detokenizer step turns the step's token ids
into text for every slot at once, the stop-string filter holds back what could still become a stop
string, and the SSE framer renders each stream's event from pre-rendered bytes. This is the path
`tokenpath calibrate delivery` measures and the simulated delivery model charges for.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from tokenpath.delivery import Detokenizer
from tokenpath.delivery.sse import DONE as SSE_DONE
from tokenpath.delivery.sse import SseFramer
from tokenpath.delivery.stop import StopList, StopStrings, compile_stops
from tokenpath.serve.openai import ApiError, Ask

DONE = None  # put on a response's queue after its last piece
log = logging.getLogger("tokenpath.serve")


@dataclass(eq=False)
class Response:
    """One request's output: what the handler sends (SSE bytes, or text when not streaming)."""

    ask: Ask
    request_id: str
    created: int
    token_ids: np.ndarray                 # the tokens it will generate, in order
    stops: StopList                       # its stop strings, compiled when it came in
    context_ids: Sequence[int] = ()       # the prompt's last tokens: its text streams after them
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    handle: int = -1                      # its request in the engine
    bank: _Bank | None = None             # where its slot is, once its first token has come
    slot: int = -1
    tokens: int = 0                       # tokens released so far
    ended: bool = False                   # its end has been sent (a stop string can end it early)
    finish_reason: str = ""
    system_fingerprint: str | None = None  # the server's configuration, as OpenAI's responses carry it
    error: ApiError | None = None         # why its output failed, if it did
    # Its last token ends it at a limit (max_tokens, the context, a JSON document cut short): "length".
    ends_at_limit: bool = True


class _Bank:
    """A fixed batch of slots: one batched detokenizer, stop filter and SSE framer per API."""

    def __init__(self, detokenizer: Detokenizer, slots: int, interval: int) -> None:
        self.texts = detokenizer.batch(slots)
        self.stops = StopStrings(slots)
        self.framers = {api: SseFramer(slots, api, interval) for api in ("chat", "completions")}
        self.free = list(range(slots - 1, -1, -1))
        self.ids = np.full(slots, -1, np.int64)
        # Slots whose last token came in a step: what their detokenizer and stop filter held went with it.
        self.flushed: set[int] = set()

    def open(self, response: Response) -> None:
        response.bank, response.slot = self, self.free.pop()
        self.texts.prime(response.slot, response.context_ids)
        self.stops.set(response.slot, response.stops, response.ask.extras.min_tokens)
        ask = response.ask
        running_usage = ask.prompt_tokens if ask.extras.continuous_usage else None
        first = self.framers[ask.endpoint].open(response.slot, response.request_id, ask.model, response.created,
                                                response.system_fingerprint, ask.include_usage, running_usage)
        if ask.stream and first:
            response.queue.put_nowait(first)

    def step(self, responses: list[Response]) -> list[Response]:
        """Each of `responses` got its next token; those a stop string ended."""
        ids = self.ids
        ids.fill(-1)
        for response in responses:
            ids[response.slot] = response.token_ids[response.tokens]
            response.tokens += 1
        visible = self.stops.feed(self.texts.step(ids), [response.slot for response in responses])
        for response in responses:
            if response.tokens == len(response.token_ids):  # its last token: the text held back leaves with it,
                slot = response.slot                        # in its event (as vLLM's last output carries it)
                visible[slot] += self.stops.finish(slot, self.texts.finish(slot)[0])
                self.flushed.add(slot)
        for api, framer in self.framers.items():
            members = [r for r in responses if r.ask.endpoint == api and r.ask.stream]
            if not members:
                continue
            active = [False] * len(ids)
            for response in members:
                active[response.slot] = True
            events = framer.step(visible, active)
            for response in members:
                if events[response.slot]:
                    response.queue.put_nowait(events[response.slot])
        stopped = []
        for response in responses:
            if not response.ask.stream and visible[response.slot]:
                response.queue.put_nowait(visible[response.slot])
            if self.stops.stopped[response.slot] and not response.ended:
                try:
                    self.end(response, "stop", "")
                except Exception as error:
                    _fail(response, error)
                stopped.append(response)
        return stopped

    def finish(self, response: Response) -> None:
        """End a response whose last token came (unless a stop string did) and free its slot."""
        slot = response.slot
        if slot in self.flushed:
            self.flushed.discard(slot)
            tail = ""
        else:
            tail = self.stops.finish(slot, self.texts.finish(slot)[0])
        if not response.ended:
            stopped = self.stops.stopped[slot]
            self.end(response, "stop" if stopped or not response.ends_at_limit else "length", tail)
        self._free(response)

    def release(self, response: Response) -> None:
        """Free the slot of a response ended early, sending nothing more: its text state is dropped."""
        if response.slot not in self.flushed:
            self.texts.finish(response.slot)
            self.stops.finish(response.slot)
        self.flushed.discard(response.slot)
        self._free(response)

    def _free(self, response: Response) -> None:
        self.free.append(response.slot)
        response.bank, response.slot = None, -1

    def end(self, response: Response, reason: str, tail: str) -> None:
        ask = response.ask
        if ask.stream:
            usage = None
            if ask.include_usage:
                usage = {"prompt_tokens": ask.prompt_tokens, "completion_tokens": response.tokens,
                         "total_tokens": ask.prompt_tokens + response.tokens}
            response.queue.put_nowait(self.framers[ask.endpoint].close(response.slot, reason, tail, usage))
        elif tail:
            response.queue.put_nowait(tail)
        response.finish_reason = reason
        response.ended = True
        response.queue.put_nowait(DONE)


class OutputSlots:
    """Detokenize, stop-filter and frame the tokens of one engine's running requests, per step.

    Slots come in banks of BANK_SLOTS, opened as concurrency grows, so a step costs in proportion
    to the banks that have streams in them rather than to the engine's largest possible batch.
    """

    BANK_SLOTS = 64

    def __init__(self, detokenizer: Detokenizer, interval: int) -> None:
        self.detokenizer, self.interval = detokenizer, interval
        self.banks: list[_Bank] = []

    def _open(self, response: Response) -> None:
        bank = next((b for b in self.banks if b.free), None)
        if bank is None:
            bank = _Bank(self.detokenizer, self.BANK_SLOTS, self.interval)
            self.banks.append(bank)
        bank.open(response)

    def step(self, responses: list[Response]) -> list[Response]:
        """Each of `responses` got its next token in this engine step. Returns those that ended early:
        a stop string came, or their output failed (each such failure ends only its own response)."""
        by_bank: dict[_Bank, list[Response]] = {}
        ended = []
        for response in responses:
            if response.bank is None:
                try:
                    self._open(response)
                except Exception as error:
                    self._fail(response, error)
                    ended.append(response)
                    continue
            by_bank.setdefault(response.bank, []).append(response)
        for bank, members in by_bank.items():
            try:
                ended += bank.step(members)
            except Exception as error:  # a fault in the batch's shared path: ends this bank's streams only
                for response in members:
                    if not response.ended:
                        self._fail(response, error)
                ended += members
        return ended

    def finish(self, response: Response) -> None:
        """The engine produced the response's last token: end it (unless a stop string did), free its slot."""
        if response.ended and response.bank is None:  # its output failed earlier: ended and freed then
            return
        try:
            if response.bank is None:  # no token ever came (nothing to flush)
                self._open(response)
            response.bank.finish(response)
        except Exception as error:
            self._fail(response, error)

    def release(self, response: Response) -> None:
        """Free the slot of a response ended early (a stop string, its client gone), sending nothing more."""
        if response.bank is not None:
            response.bank.release(response)

    def _fail(self, response: Response, error: Exception) -> None:
        _fail(response, error)
        try:
            self.release(response)
        except Exception:  # its slot is lost, not the others
            response.bank, response.slot = None, -1


def _fail(response: Response, error: Exception) -> None:
    """End one response with an error (an error event then [DONE] when streaming; a 500 otherwise),
    logged in one line. One whose end was already sent has nothing more to hear."""
    log.error("%s: its output failed: %r", response.request_id, error)
    if response.ended:
        return
    response.error = ApiError(500, f"internal error while streaming: {error!r}", kind="server_error")
    if response.ask.stream:
        response.queue.put_nowait(b"data: " + orjson.dumps(response.error.body()) + b"\n\n" + SSE_DONE)
    response.finish_reason, response.ended = "error", True
    response.queue.put_nowait(DONE)


def new_response(ask: Ask, token_ids: np.ndarray, system_fingerprint: str | None = None,
                 ends_at_limit: bool | None = None, context_ids: Sequence[int] = ()) -> Response:
    """A response, with everything per request that streaming needs built now, off the engine's path.
    `ends_at_limit` (unset: when the request set max_tokens): its last token ends it at a limit.
    `context_ids`: the prompt tail its text follows (none: it streams as a whole text from its start)."""
    prefix = "chatcmpl" if ask.endpoint == "chat" else "cmpl"
    return Response(ask, f"{prefix}-{uuid.uuid4().hex}", int(time.time()), token_ids, compile_stops(ask.stop),
                    context_ids, system_fingerprint=system_fingerprint,
                    ends_at_limit=ask.max_tokens is not None if ends_at_limit is None else ends_at_limit)
