"""One streamed completion as the client sees it: SSE events parsed as they arrive, timed, counted.

`Exchange.feed(body_bytes, now_ns)` takes the decoded HTTP body in whatever pieces the socket gave,
with the time each piece was read. Events that arrive in one piece arrive together: they form one
*arrival*, and the arrival records the tokens they carry. Tokens per event come from the server's
running usage count where it sends one (`continuous_usage_stats`), else one per event that carries
text, reconciled at the end with the `usage` total (the extra tokens of multi-token events are put
where the text is).
"""

from __future__ import annotations

from typing import Any, Callable

import orjson
from orjson import JSONDecodeError, loads

# Failure reasons: short, stable names; the detail goes alongside.
HTTP_STATUS = "http_{status}"
CONNECT = "connect"
DROPPED = "dropped"
MALFORMED = "malformed"
SERVER_ERROR = "server_error"
STALLED = "stalled"
TIMEOUT = "timeout"
INCOMPLETE = "incomplete"
EMPTY = "empty"
INTERRUPTED = "interrupted"

_ERROR_BODY_BYTES = 4096


class Exchange:
    """The client's record of one request: timings, arrivals, tokens, and how it ended."""

    __slots__ = (
        "index", "scheduled_ns", "sent_ns", "status", "arrival_ns", "arrival_tokens", "arrival_chars",
        "first_token_ns", "first_visible_ns", "first_content_ns", "end_ns", "last_rx_ns", "cumulative",
        "per_event_usage", "usage_completion", "usage_prompt", "reasoning_tokens", "finish_reason",
        "response_id", "error", "detail", "finished", "_sse", "_error_body", "_on_end", "events",
        "input_tokens", "max_tokens",
    )

    def __init__(self, index: int, scheduled_ns: int, sent_ns: int, on_end: Callable[[Exchange], None],
                 input_tokens: int = 0, max_tokens: int = 0) -> None:
        self.index, self.scheduled_ns, self.sent_ns = index, scheduled_ns, sent_ns
        self.input_tokens, self.max_tokens = input_tokens, max_tokens
        self.status = 0
        self.arrival_ns: list[int] = []
        self.arrival_tokens: list[int] = []
        self.arrival_chars: list[int] = []
        self.first_token_ns = self.first_visible_ns = self.first_content_ns = self.end_ns = None
        self.last_rx_ns = sent_ns
        self.cumulative = 0
        self.per_event_usage = False
        self.usage_completion: int | None = None
        self.usage_prompt: int | None = None
        self.reasoning_tokens = 0
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.error: str | None = None
        self.detail: str | None = None
        self.finished = False
        self.events = 0
        self._sse = b""
        self._error_body = b""
        self._on_end = on_end

    # ---- the end of an exchange: exactly once -------------------------------------------------
    def fail(self, reason: str, detail: str, now_ns: int) -> None:
        if self.finished:
            return
        self.error, self.detail = reason, detail[:300]
        self.end_ns = now_ns
        self.finished = True
        self._on_end(self)

    def _succeed(self, now_ns: int) -> None:
        if self.finished:
            return
        if self.first_token_ns is None:
            self.fail(EMPTY, "the stream ended without an event that carries a token", now_ns)
            return
        self.end_ns = now_ns
        self._reconcile()
        self.finished = True
        self._on_end(self)

    def body_end(self, now_ns: int) -> None:
        """The server finished the HTTP body."""
        if self.finished:
            return
        if self.status != 200:
            self.fail(HTTP_STATUS.format(status=self.status), _error_text(self._error_body), now_ns)
        elif self.finish_reason is not None:
            self._succeed(now_ns)
        else:
            self.fail(INCOMPLETE, f"the stream ended without [DONE] or a finish_reason after {self.events} events", now_ns)

    # ---- parsing ------------------------------------------------------------------------------
    def feed(self, data: bytes, now_ns: int) -> None:
        """A piece of the HTTP body, read at `now_ns`."""
        if self.finished:
            return
        if self.status != 200:
            if len(self._error_body) < _ERROR_BODY_BYTES:
                self._error_body += data[:_ERROR_BODY_BYTES]
            return
        buffer = self._sse + data if self._sse else data
        if b"\r" in buffer:
            held = buffer.endswith(b"\r")  # a CR whose LF may come in the next piece
            buffer = buffer[:-1] if held else buffer
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        end = buffer.find(b"\n\n")
        if end < 0:
            self._sse = buffer
            return
        if end == len(buffer) - 2:  # one whole event: the common case
            blocks = [buffer[:end]]
            self._sse = b""
        else:
            blocks = buffer.split(b"\n\n")
            self._sse = blocks.pop()
        tokens = chars = 0
        carried = False
        for block in blocks:
            if block[:6] == b"data: " and b"\n" not in block:
                payload = block[6:]
            else:
                payload = _data_of(block)
                if payload is None:
                    continue
            if payload == b"[DONE]":
                self._close_arrival(now_ns, carried, tokens, chars)
                self._succeed(now_ns)
                return
            try:
                event = loads(payload)
            except JSONDecodeError:
                self.fail(MALFORMED, f"event {self.events} is not JSON: {payload[:80]!r}", now_ns)
                return
            self.events += 1
            try:
                # The usual event, inline: one choice with text, maybe a running usage count.
                choices = event.get("choices") if type(event) is dict else None
                if choices and type(choices) is list and self.response_id is not None:
                    choice = choices[0]
                    text = choice.get("text")
                    if text is None:
                        delta = choice.get("delta")
                        if type(delta) is dict and "reasoning_content" not in delta and "reasoning" not in delta:
                            text = delta.get("content") or ""
                    if text is not None and type(text) is str:
                        if choice.get("finish_reason"):
                            self.finish_reason = choice["finish_reason"]
                        usage = event.get("usage")
                        if usage is not None and type(usage) is dict and type(usage.get("completion_tokens")) is int:
                            count = usage["completion_tokens"]
                            got = count - self.cumulative if count > self.cumulative else 0
                            self.cumulative = count if count > self.cumulative else self.cumulative
                            self.usage_completion, self.per_event_usage = count, True
                        else:
                            got = 1 if text else 0
                        if text:
                            chars += len(text)
                            if self.first_content_ns is None:
                                self.first_content_ns = now_ns
                            if self.first_visible_ns is None and not text.isspace():
                                self.first_visible_ns = now_ns
                        if text or got:
                            carried = True
                            tokens += got
                        continue
                if type(event) is not dict:
                    self.fail(MALFORMED, f"event {self.events - 1} is not a JSON object: {payload[:80]!r}", now_ns)
                    return
                result = self._event(event, now_ns)
                if result is None:
                    return
                if result[0]:
                    carried = True
                    tokens += result[1]
                    chars += result[2]
            except (AttributeError, TypeError, IndexError, KeyError):
                self.fail(MALFORMED, f"event {self.events - 1} has an unexpected shape: {payload[:80]!r}", now_ns)
                return
        self._close_arrival(now_ns, carried, tokens, chars)

    def _close_arrival(self, now_ns: int, carried: bool, tokens: int, chars: int) -> None:
        if carried:
            if self.first_token_ns is None:
                self.first_token_ns = now_ns
            self.arrival_ns.append(now_ns)
            self.arrival_tokens.append(tokens)
            self.arrival_chars.append(chars)

    def _event(self, event: dict[str, Any], now_ns: int) -> tuple[bool, int, int] | None:
        """(carries a token, tokens, characters) of one event; None when it ended the exchange."""
        if self.response_id is None:
            self.response_id = str(event.get("id") or "")
        choices = event.get("choices")
        usage = event.get("usage")
        if not choices:
            if "error" in event or event.get("object") == "error":
                error = event.get("error", event)
                message = error.get("message", error) if isinstance(error, dict) else error
                self.fail(SERVER_ERROR, str(message), now_ns)
                return None
            if isinstance(usage, dict):
                self._usage(usage, False)
            return False, 0, 0
        choice = choices[0]
        text = choice.get("text")
        reasoning = None
        if text is None:
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            before = self.cumulative
            self._usage(usage, True)
            tokens = max(self.cumulative - before, 0)
        else:
            tokens = 1 if (text or reasoning) else 0
        chars = 0
        if text:
            chars = len(text)
            if self.first_content_ns is None:
                self.first_content_ns = now_ns
            if self.first_visible_ns is None and not text.isspace():
                self.first_visible_ns = now_ns
        if reasoning:
            chars += len(reasoning)
            self.reasoning_tokens += tokens
        return bool(text or reasoning or tokens), tokens, chars

    def _usage(self, usage: dict[str, Any], per_event: bool) -> None:
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            self.usage_completion = completion
            if per_event:
                self.per_event_usage = True
                self.cumulative = max(self.cumulative, completion)
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int):
            self.usage_prompt = prompt

    def _reconcile(self) -> None:
        """Make the arrivals' token counts add up to the server's count, where it gave one."""
        total = self.usage_completion
        counted = sum(self.arrival_tokens)
        if total is None or total == counted or not self.arrival_tokens:
            return
        if self.per_event_usage and total > counted:
            self.arrival_tokens[-1] += total - counted
            return
        self.arrival_tokens = allocate(total, self.arrival_tokens, self.arrival_chars)

    # ---- the record -----------------------------------------------------------------------------
    @property
    def tokens_from(self) -> str:
        if self.per_event_usage:
            return "usage_per_event"
        return "usage" if self.usage_completion is not None else "events"

    def record(self, t0_ns: int) -> dict[str, Any]:
        """The JSONL row: times in ns after the run's start."""
        def rel(value: int | None) -> int | None:
            return None if value is None else value - t0_ns

        return {
            "i": self.index,
            "scheduled_ns": self.scheduled_ns,
            "sent_ns": self.sent_ns - t0_ns,
            "input_tokens": self.input_tokens,
            "max_tokens": self.max_tokens,
            "ok": self.error is None,
            "error": self.error,
            "detail": self.detail,
            "status": self.status,
            "id": self.response_id,
            "first_token_ns": rel(self.first_token_ns),
            "first_visible_ns": rel(self.first_visible_ns),
            "first_content_ns": rel(self.first_content_ns),
            "end_ns": rel(self.end_ns),
            "output_tokens": sum(self.arrival_tokens),
            "tokens_from": self.tokens_from,
            "reasoning_tokens": self.reasoning_tokens,
            "prompt_tokens_server": self.usage_prompt,
            "finish_reason": self.finish_reason,
            "events": self.events,
            "arrival_ns": [t - t0_ns for t in self.arrival_ns],
            "arrival_tokens": self.arrival_tokens,
        }


def allocate(total: int, counts: list[int], chars: list[int]) -> list[int]:
    """Share `total` tokens over arrivals: each keeps at least its counted events (while the total
    allows); the rest go where the characters are, towards each arrival's share of the text (largest
    remainder)."""
    n = len(counts)
    if total <= 0:
        return [0] * n
    counted = sum(counts)
    if total < counted:
        # Fewer tokens than events: one per arrival from the first, as far as they go.
        base = [0] * n
        left = total
        for i in range(n):
            take = min(counts[i], left)
            base[i] = take
            left -= take
        return base
    extra = total - counted
    # Each arrival's fair share of the total by its characters, less what it already has.
    letters = [max(c, 1) for c in chars]
    all_letters = sum(letters)
    weights = [max(total * c / all_letters - k, 0.0) for c, k in zip(letters, counts)]
    whole = sum(weights)
    if whole <= 0:
        weights, whole = [float(c) for c in letters], float(all_letters)
    shares = [extra * w / whole for w in weights]
    floors = [int(s) for s in shares]
    left = extra - sum(floors)
    order = sorted(range(n), key=lambda i: shares[i] - floors[i], reverse=True)
    for i in order[:left]:
        floors[i] += 1
    return [c + f for c, f in zip(counts, floors)]


def _data_of(block: bytes) -> bytes | None:
    """The data of a general SSE event block (several lines, comments, other fields); None if it has none."""
    data = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(data) if data else None


def _error_text(body: bytes) -> str:
    """The message of an error body: OpenAI's {"error": {"message": ...}}, or the text itself."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:200]
    if isinstance(document, dict):
        error = document.get("error", document)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:200]
        if isinstance(error, str):
            return error[:200]
        if "message" in document:
            return str(document["message"])[:200]
    return body.decode("utf-8", "replace").strip()[:200]
