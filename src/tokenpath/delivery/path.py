"""The whole host-side last mile for a batch: ids -> visible text -> stop strings -> SSE bytes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.sse import Api, SseFramer
from tokenpath.delivery.stop import StopStrings


class TextPath:
    """n streams through detokenize, stop check and framing, one engine step at a time."""

    def __init__(self, det: Detokenizer, n: int, stops: Sequence[str] = (), api: Api = "chat",
                 interval: int = 1, model: str = "tokenpath", context: Sequence[Sequence[int]] = ()) -> None:
        """`context`: each stream's prompt tail, its output streamed after it (BatchStream.prime); none:
        each streams as a whole text from its start."""
        self.n, self.interval = n, interval
        self.detokenizer = det.batch(n)
        for i, ids in enumerate(context):
            self.detokenizer.prime(i, ids)
        self.stops = StopStrings(n) if stops else None
        self.sse = SseFramer(n, api, interval)
        self.opening = []
        for i in range(n):
            if self.stops is not None:
                self.stops.set(i, stops)
            self.opening.append(self.sse.open(i, f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{i}", model, 0))

    def step(self, ids: np.ndarray) -> list[bytes]:
        """The SSE bytes each stream sends after this step (b"" for none); ids < 0: no token."""
        texts = self.detokenizer.step(ids)
        if self.stops is not None:
            texts = self.stops.feed(texts)
        active = None if self.interval == 1 else (np.asarray(ids) >= 0).tolist()
        return self.sse.step(texts, active)

    def finish(self, finish_reason: str = "stop") -> list[bytes]:
        """End every stream: flushed tails, held-back text, the final chunk and [DONE]."""
        tails = self.detokenizer.finish()
        out = []
        for i, tail in enumerate(tails):
            if self.stops is not None:
                tail = self.stops.finish(i, tail)
            out.append(self.sse.close(i, finish_reason, tail))
        return out
