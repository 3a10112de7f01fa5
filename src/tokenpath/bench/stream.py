"""One streamed completion as the client sees it: SSE events parsed as they arrive, timed, counted.

`Exchange.feed(body_bytes, now_ns)` takes the decoded HTTP body in whatever pieces the socket gave,
with the time each piece was read. Each event that carries a token is one *arrival*, stamped with the
time of the read that completed it: events the client read together share that read's time. Tokens
per event come from the server's running usage count where it sends one (`continuous_usage_stats`),
else one per event that carries text, reconciled at the end with the `usage` total (the extra tokens
of multi-token events are put where the text is).

Event assembly is linear in the bytes received (a held partial event grows in place and is searched
only where new bytes came), and one event may hold at most `max_event_bytes`: a larger one fails its
request as malformed instead of growing without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
SKIPPED = "skipped"  # a session's turn not sent because an earlier turn of it failed

_ERROR_BODY_BYTES = 4096
# The most bytes of a body quoted in a failure's detail.
_QUOTE_BYTES = 100
# The default bound on one SSE event (--max-event-bytes). A token stream's events are a few hundred
# bytes; 16 MiB still holds a whole long reply sent as one event, while a server that never ends its
# event cannot make the client hold more than this.
MAX_EVENT_BYTES = 16 * 2**20
# The largest token count a server's usage may state: what a results file holds (results.py reads back no
# more). A count outside 0..this is no count of a real request: the event is malformed.
MAX_USAGE_TOKENS = 2**24


class Exchange:
    """The client's record of one request: timings, arrivals, tokens, and how it ended."""

    __slots__ = (
        "index", "scheduled_ns", "sent_ns", "status", "arrival_ns", "arrival_tokens", "arrival_chars",
        "first_token_ns", "first_visible_ns", "first_content_ns", "end_ns", "last_rx_ns", "cumulative",
        "per_event_usage", "usage_completion", "usage_prompt", "reasoning_tokens", "finish_reason",
        "response_id", "error", "detail", "finished", "_sse", "_error_body", "_on_end", "events",
        "input_tokens", "max_tokens", "max_event_bytes", "content_type", "_json", "_cr", "_body_start",
        "answer", "session", "turn", "think_ns",
    )

    def __init__(self, index: int, scheduled_ns: int, sent_ns: int, on_end: Callable[[Exchange], None],
                 input_tokens: int = 0, max_tokens: int = 0, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.index, self.scheduled_ns, self.sent_ns = index, scheduled_ns, sent_ns
        self.input_tokens, self.max_tokens = input_tokens, max_tokens
        self.max_event_bytes = max_event_bytes
        self.status = 0
        self.content_type = ""
        self._json = False       # a 200 answer in JSON: not a stream (the server ignored "stream")
        self._cr = False         # the last piece ended in CR: an LF starting the next one belongs to it
        self._body_start = b""   # the body's first bytes, to quote when it is not SSE
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
        self._sse = bytearray()  # a partial event, held until its blank line comes
        self._error_body = b""
        self._on_end = on_end
        self.answer: list[str] | None = None  # the answer's text pieces, kept only when asked (a session's turn)
        self.session: int | None = None       # a session's turn: its session, turn and think time before it
        self.turn: int | None = None
        self.think_ns: int | None = None

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

    def head(self, status: int, content_type: str) -> None:
        """The response's status and Content-Type, before any of its body."""
        self.status, self.content_type = status, content_type
        media = content_type.split(";", 1)[0].strip().lower()
        self._json = status == 200 and (media == "application/json" or media.endswith("+json"))

    def body_end(self, now_ns: int) -> None:
        """The server finished the HTTP body."""
        if self.finished:
            return
        if self.status != 200:
            self.fail(HTTP_STATUS.format(status=self.status), _error_text(self._error_body), now_ns)
        elif self._json:
            self.fail(MALFORMED, f"the server answered {self.content_type}, not an SSE stream (does it ignore "
                                 f"\"stream\": true?): {_quote(self._error_body)}", now_ns)
        elif self.finish_reason is not None:
            self._succeed(now_ns)
        elif self.events == 0 and self._body_start.strip() and not _looks_like_sse(self._body_start):
            self.fail(MALFORMED, f"the body is not an SSE stream (Content-Type: {self.content_type or 'none'}): "
                                 f"{_quote(self._body_start)}", now_ns)
        else:
            self.fail(INCOMPLETE, f"the stream ended without [DONE] or a finish_reason after {self.events} events",
                      now_ns)

    # ---- parsing ------------------------------------------------------------------------------
    def feed(self, data: bytes, now_ns: int) -> None:
        """A piece of the HTTP body, read at `now_ns`."""
        if self.finished:
            return
        if self.status != 200 or self._json:
            if len(self._error_body) < _ERROR_BODY_BYTES:
                self._error_body += data[:_ERROR_BODY_BYTES - len(self._error_body)]
            return
        if not data:
            return
        if len(self._body_start) < _QUOTE_BYTES:
            self._body_start += data[:_QUOTE_BYTES - len(self._body_start)]
        if self._cr or b"\r" in data:
            data = self._lf_line_ends(data)
        held = self._sse
        if held:
            start = len(held) - 1  # a blank line may begin with the held event's last LF
            held += data
            end = held.rfind(b"\n\n", start)
            if end < 0:
                self._too_large(held, now_ns)
                return
            buffer = bytes(held[:end])
            del held[:end + 2]
        else:
            end = data.rfind(b"\n\n")
            if end < 0:
                self._sse = bytearray(data)
                self._too_large(data, now_ns)
                return
            buffer = data[:end]
            if end + 2 < len(data):
                self._sse = bytearray(data[end + 2:])
        for block in buffer.split(b"\n\n"):
            if len(block) > self.max_event_bytes and self._too_large(block, now_ns):
                return
            if block[:6] == b"data: " and b"\n" not in block:
                payload = block[6:]
            else:
                payload = _data_of(block)
                if payload is None:
                    continue
            if payload == b"[DONE]":
                self._succeed(now_ns)
                return
            try:
                event = loads(payload)
            except JSONDecodeError:
                self.fail(MALFORMED, f"event {self.events} is not JSON: {payload[:80]!r}", now_ns)
                return
            self.events += 1
            usage = event.get("usage") if type(event) is dict else None
            if type(usage) is dict:
                for key in ("prompt_tokens", "completion_tokens"):
                    count = usage.get(key)
                    if type(count) is int and not 0 <= count <= MAX_USAGE_TOKENS:
                        self.fail(MALFORMED, f"event {self.events - 1}: usage.{key} = {count} is not a count of "
                                             f"tokens (0 to {MAX_USAGE_TOKENS})", now_ns)
                        return
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
                        if (usage is not None and type(usage) is dict and type(usage.get("completion_tokens")) is int
                                and (self.per_event_usage or not self.arrival_tokens)):
                            count = usage["completion_tokens"]
                            got = count - self.cumulative if count > self.cumulative else 0
                            self.cumulative = count if count > self.cumulative else self.cumulative
                            self.usage_completion, self.per_event_usage = count, True
                        else:
                            if usage is not None and type(usage) is dict:  # a total on the last choice
                                self._usage(usage, False)
                            got = 1 if text else 0
                        if text:
                            if self.first_content_ns is None:
                                self.first_content_ns = now_ns
                            if self.first_visible_ns is None and not text.isspace():
                                self.first_visible_ns = now_ns
                            if self.answer is not None:
                                self.answer.append(text)
                        if text or got:
                            self._arrive(now_ns, got, len(text))
                        continue
                if type(event) is not dict:
                    self.fail(MALFORMED, f"event {self.events - 1} is not a JSON object: {payload[:80]!r}", now_ns)
                    return
                result = self._event(event, now_ns)
                if result is None:
                    return
                if result[0]:
                    self._arrive(now_ns, result[1], result[2])
            except (AttributeError, TypeError, IndexError, KeyError):
                self.fail(MALFORMED, f"event {self.events - 1} has an unexpected shape: {payload[:80]!r}", now_ns)
                return

    def _lf_line_ends(self, data: bytes) -> bytes:
        """CRLF and a lone CR as LF (SSE allows all three line ends), also when a CRLF is split between pieces."""
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = data[-1:] == b"\r"
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _too_large(self, event: bytes | bytearray, now_ns: int) -> bool:
        """Fail the request if one event (whole or still partial) is over `max_event_bytes`."""
        if len(event) <= self.max_event_bytes:
            return False
        start = _quote(bytes(event[:_QUOTE_BYTES]))
        self._sse = bytearray()
        self.fail(MALFORMED, f"event {self.events} is over {self.max_event_bytes} bytes (raise --max-event-bytes "
                             f"if the server's events are that large); it starts: {start}", now_ns)
        return True

    def _arrive(self, now_ns: int, tokens: int, chars: int) -> None:
        """An event that carries a token, read at `now_ns`."""
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
        if (isinstance(usage, dict) and type(usage.get("completion_tokens")) is int
                and (self.per_event_usage or not self.arrival_tokens)):
            before = self.cumulative
            self._usage(usage, True)
            tokens = max(self.cumulative - before, 0)
        else:
            if isinstance(usage, dict):  # a total on the last choice
                self._usage(usage, False)
            tokens = 1 if (text or reasoning) else 0
        chars = 0
        if text:
            chars = len(text)
            if self.answer is not None:
                self.answer.append(text)
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
        if type(completion) is int:  # not a bool
            self.usage_completion = completion
            if per_event:
                self.per_event_usage = True
                self.cumulative = max(self.cumulative, completion)
        prompt = usage.get("prompt_tokens")
        if type(prompt) is int:
            self.usage_prompt = prompt

    def _reconcile(self) -> None:
        """Make the arrivals' token counts add up to the server's count, where it gave one, or else to the
        max_tokens asked for where the output stopped at its length (finish_reason "length", as SGLang's
        bench_serving takes the requested length when no usage comes)."""
        total = self.usage_completion
        if total is None and self.finish_reason == "length" and self.max_tokens > 0:
            total = self.max_tokens
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
        if self.usage_completion is not None:
            return "usage"
        return "max_tokens" if self.finish_reason == "length" and self.max_tokens > 0 else "events"

    def record(self, t0_ns: int) -> dict[str, Any]:
        """The JSONL row: times in ns after the run's start."""
        def rel(value: int | None) -> int | None:
            return None if value is None else value - t0_ns

        row = {
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
        if self.session is not None:
            row.update(session=self.session, turn=self.turn, think_ns=self.think_ns)
        return row


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


def _looks_like_sse(start: bytes) -> bool:
    """Whether a body begins as SSE does: a comment, or a field (data, event, id, retry)."""
    first = start.lstrip().split(b"\n", 1)[0]
    return first[:1] == b":" or first.split(b":", 1)[0] in (b"data", b"event", b"id", b"retry")


def _quote(body: bytes) -> str:
    """The first bytes of a body as one line of text, to quote in a failure's detail."""
    return " ".join(body[:_QUOTE_BYTES].decode("utf-8", "replace").split())


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
