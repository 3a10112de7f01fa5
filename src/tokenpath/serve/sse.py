"""The response side of `tokenpath serve`: one request's text, stop strings and OpenAI chunks."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from tokenpath.serve.openai import Ask


class ChunkWriter:
    """Turns one request's token ids into OpenAI completion or chat-completion responses.

    Text is held back while it could still be the start of a stop string, so a stop string never
    reaches the client; once one appears the text ends before it and the finish reason is "stop".
    """

    def __init__(self, ask: Ask, completion_id: str, created: int, text_stream) -> None:
        self.ask = ask
        self.completion_id = completion_id
        self.created = created
        self.text_stream = text_stream
        self.pending = ""          # detokenized, not yet sent
        self.tokens = 0
        self.stopped = False
        self.finished = False
        self.hold = max((len(s) for s in ask.stop), default=1) - 1
        chat = ask.endpoint == "chat"
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self._head = orjson.dumps({"id": completion_id, "object": self.object, "created": created, "model": ask.model})[:-1]

    def add(self, token_id: int) -> None:
        """One more token of the request."""
        if self.stopped:
            return
        self.tokens += 1
        self.pending += self.text_stream.step([token_id])[0]
        self._find_stop()

    def _find_stop(self) -> None:
        hits = [at for s in self.ask.stop if (at := self.pending.find(s)) >= 0]
        if hits:
            self.pending = self.pending[: min(hits)]
            self.stopped = True

    def _take(self, final: bool) -> str:
        if final or self.stopped:
            if not self.stopped:
                self.pending += self.text_stream.finish()[0]
                self._find_stop()
            text, self.pending = self.pending, ""
            return text
        cut = len(self.pending) - self.hold if self.ask.stop else len(self.pending)
        text, self.pending = self.pending[:cut], self.pending[cut:]
        return text

    def _choice(self, text: str | None, finish_reason: str | None) -> bytes:
        if self.ask.endpoint == "chat":
            delta = {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + self._head + b',"choices":[' + orjson.dumps(choice) + b"]}\n\n"

    def _finish_reason(self) -> str:
        return "stop" if self.stopped or self.ask.max_tokens is None else "length"

    def opening(self) -> bytes:
        """What a stream starts with: the assistant role, for chat."""
        if self.ask.endpoint != "chat":
            return b""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return b"data: " + self._head + b',"choices":[' + orjson.dumps(choice) + b"]}\n\n"

    def chunk(self, final: bool) -> bytes:
        """An event with the text ready now; `final` flushes everything and sets the finish reason."""
        final = final or self.stopped
        text = self._take(final)
        if final:
            self.finished = True
            return self._choice(text, self._finish_reason())
        return self._choice(text, None) if text else b""

    def usage(self, prompt_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.tokens,
                "total_tokens": prompt_tokens + self.tokens}

    def closing(self) -> bytes:
        """The end of a stream: the finish reason if not sent yet, usage if asked, then [DONE]."""
        out = b"" if self.finished else self.chunk(final=True)
        if self.ask.include_usage:
            usage = orjson.dumps(self.usage(self.ask.prompt_tokens))
            out += b"data: " + self._head + b',"choices":[],"usage":' + usage + b"}\n\n"
        return out + b"data: [DONE]\n\n"

    def whole(self, ids: np.ndarray) -> dict[str, Any]:
        """A non-streaming response for all of `ids`."""
        for token_id in ids.tolist():
            self.add(token_id)
            if self.stopped:
                break
        text = self._take(final=True)
        reason = self._finish_reason()
        if self.ask.endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            kind = "text_completion"
        return {"id": self.completion_id, "object": kind, "created": self.created, "model": self.ask.model,
                "choices": [choice], "usage": self.usage(self.ask.prompt_tokens)}
