"""Server-sent events for OpenAI-compatible streaming: chat completions and completions chunks.

Each sequence's chunk is rendered once into the bytes before and after its text; a step only adds
the text, JSON-escaped by orjson (remembered per distinct text: token texts repeat). With a stream
interval of k, the first token is sent at once and later ones in events of k tokens (the delivery
model's rule); an event with no visible text is not sent. `close` flushes what is left and ends the
stream with the finish reason and `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson

Api = Literal["chat", "completions"]
_MARK = "\u0000tokenpath-text\u0000"
_USAGE_MARK = "\u0000tokenpath-usage\u0000"
_Meta = tuple[str, str, int, "str | None", bool]  # request id, model, created, system fingerprint, include usage
DONE = b"data: [DONE]\n\n"
MEMO_ENTRIES = 65536


def _chunk(api: Api, meta: _Meta, text: str | None, finish_reason: str | None, role: bool = False,
           usage: object = None) -> dict:
    """One chunk as OpenAI writes it: id, object, created, model, system_fingerprint (when given),
    choices, and usage when the request asked for it (null but on the last chunk)."""
    request_id, model, created, fingerprint, include_usage = meta
    if api == "chat":
        delta = {} if text is None else {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    chunk = {"id": request_id, "object": kind, "created": created, "model": model}
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    chunk["choices"] = [choice]
    if include_usage:
        chunk["usage"] = usage
    return chunk


def _usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    return b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
        prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


def _event(document: dict) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


class SseFramer:
    """SSE chunks for a batch of n streams."""

    def __init__(self, n: int, api: Api = "chat", interval: int = 1) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
        if interval < 1:
            raise ValueError(f"stream interval must be >= 1 token per event, got {interval}")
        self.n, self.api, self.interval = n, api, interval
        self._before = [b""] * n
        self._after = [b""] * n
        self._after_usage = [b""] * n        # with running usage: the bytes after the usage object
        self._running: list[int | None] = [None] * n  # prompt tokens of streams with running usage
        self._meta: list[_Meta] = [("", "", 0, None, False)] * n
        self._pending = [""] * n
        self._tokens = [0] * n
        self._memo: dict[str, bytes] = {}

    def _escaped(self, text: str) -> bytes:
        """The JSON string of `text`. Token texts repeat, so a bounded memo saves most encodings."""
        found = self._memo.get(text)
        if found is None:
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            found = self._memo[text] = orjson.dumps(text)
        return found

    def open(self, i: int, request_id: str, model: str, created: int, fingerprint: str | None = None,
             include_usage: bool = False, running_usage_prompt_tokens: int | None = None) -> bytes:
        """Start stream i. Returns its first event: the assistant role for chat, nothing for completions.

        With `include_usage` every chunk has a `usage` (null until the last, as OpenAI's); with
        `running_usage_prompt_tokens` as well, each chunk's usage counts the tokens so far (vLLM's
        `continuous_usage_stats`)."""
        meta = self._meta[i] = (request_id, model, created, fingerprint, include_usage)
        running = self._running[i] = running_usage_prompt_tokens if include_usage else None
        template = orjson.dumps(_chunk(self.api, meta, _MARK, None, usage=_USAGE_MARK if running is not None else None))
        before, after = template.split(orjson.dumps(_MARK))
        self._before[i] = b"data: " + before
        if running is None:
            self._after[i] = after + b"\n\n"
        else:
            self._after[i], after_usage = after.split(orjson.dumps(_USAGE_MARK))
            self._after_usage[i] = after_usage + b"\n\n"
        self._pending[i], self._tokens[i] = "", 0
        if self.api == "chat":
            return _event(_chunk("chat", meta, "", None, role=True, usage=self._usage_now(i)))
        return b""

    def _usage_now(self, i: int) -> dict | None:
        running, completion = self._running[i], self._tokens[i]
        if running is None:
            return None
        return {"prompt_tokens": running, "completion_tokens": completion, "total_tokens": running + completion}

    def _text_event(self, i: int, text: str) -> bytes:
        running = self._running[i]
        if running is None:
            return b"".join((self._before[i], self._escaped(text), self._after[i]))
        return b"".join((self._before[i], self._escaped(text), self._after[i], _usage(running, self._tokens[i]),
                         self._after_usage[i]))

    def step(self, texts: Sequence[str], active: Sequence[bool] | None = None) -> list[bytes]:
        """Events to send now, one bytes per stream (b"" for none). `active` marks the streams that
        got a token this step (default: all)."""
        escaped, before, after, join = self._escaped, self._before, self._after, b"".join
        if self.interval == 1 and active is None and not any(r is not None for r in self._running):
            return [join((b, escaped(t), a)) if t else b"" for b, t, a in zip(before, texts, after)]
        out = [b""] * self.n
        for i, text in enumerate(texts):
            if active is not None and not active[i]:
                continue
            k = self._tokens[i]
            self._tokens[i] = k + 1
            text = self._pending[i] + text
            if k == 0 or k % self.interval == 0:
                self._pending[i] = ""
                if text:
                    out[i] = self._text_event(i, text)
            else:
                self._pending[i] = text
        return out

    def close(self, i: int, finish_reason: str = "stop", tail: str = "", usage: dict | None = None) -> bytes:
        """End stream i: any text still pending (plus `tail`), the finish reason, usage if given, [DONE]."""
        meta = self._meta[i]
        text = self._pending[i] + tail
        self._pending[i] = ""
        events = self._text_event(i, text) if text else b""
        events += _event(_chunk(self.api, meta, None, finish_reason, usage=self._usage_now(i)))
        if usage is not None:
            usage_chunk = _chunk(self.api, meta, None, None)
            usage_chunk["choices"], usage_chunk["usage"] = [], usage
            events += _event(usage_chunk)
        return events + DONE
