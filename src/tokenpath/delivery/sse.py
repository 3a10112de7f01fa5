"""Server-sent events for OpenAI-compatible streaming: chat completions and completions chunks.

Each sequence's chunk is rendered once into the bytes before and after its text; a step only adds
the text, JSON-escaped by orjson (remembered per distinct text: token texts repeat). With a stream interval of k, the first token is sent at once and
later ones in events of k tokens (the delivery model's rule); an event with no visible text is not
sent. `close` flushes what is left and ends the stream with the finish reason and `data: [DONE]`.
"""

from __future__ import annotations

from typing import Literal, Sequence

import orjson

Api = Literal["chat", "completions"]
_MARK = "\u0000tokenpath-text\u0000"
DONE = b"data: [DONE]\n\n"
MEMO_ENTRIES = 65536


def _chunk(api: Api, request_id: str, model: str, created: int, text: str | None,
           finish_reason: str | None, role: bool = False) -> dict:
    if api == "chat":
        delta = {} if text is None else {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


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
        self._meta: list[tuple[str, str, int]] = [("", "", 0)] * n
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

    def open(self, i: int, request_id: str, model: str, created: int) -> bytes:
        """Start stream i. Returns its first event: the assistant role for chat, nothing for completions."""
        self._meta[i] = (request_id, model, created)
        before, after = orjson.dumps(_chunk(self.api, request_id, model, created, _MARK, None)).split(
            orjson.dumps(_MARK))
        self._before[i], self._after[i] = b"data: " + before, after + b"\n\n"
        self._pending[i], self._tokens[i] = "", 0
        if self.api == "chat":
            return _event(_chunk("chat", request_id, model, created, "", None, role=True))
        return b""

    def step(self, texts: Sequence[str], active: Sequence[bool] | None = None) -> list[bytes]:
        """Events to send now, one bytes per stream (b"" for none). `active` marks the streams that
        got a token this step (default: all)."""
        escaped, before, after, join = self._escaped, self._before, self._after, b"".join
        if self.interval == 1 and active is None:
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
                    out[i] = join((before[i], escaped(text), after[i]))
            else:
                self._pending[i] = text
        return out

    def close(self, i: int, finish_reason: str = "stop", tail: str = "", usage: dict | None = None) -> bytes:
        """End stream i: any text still pending (plus `tail`), the finish reason, usage if given, [DONE]."""
        request_id, model, created = self._meta[i]
        text = self._pending[i] + tail
        self._pending[i] = ""
        events = self._before[i] + orjson.dumps(text) + self._after[i] if text else b""
        events += _event(_chunk(self.api, request_id, model, created, None, finish_reason))
        if usage is not None:
            usage_chunk = _chunk(self.api, request_id, model, created, None, None)
            usage_chunk["choices"], usage_chunk["usage"] = [], usage
            events += _event(usage_chunk)
        return events + DONE
