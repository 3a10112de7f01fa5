"""Measure this machine's host cost of the last mile (detokenize, stop check, SSE framing) per batch size.

Token streams are windows of a mixed sample text (English, Chinese, code, emoji) encoded by the
chosen tokenizer, each streamed after the tokens before it, as an output after its prompt. For each
batch size the whole path runs `steps` engine steps, `repeats` times; the median is kept, because the
machine may be shared. A step with no tokens at all gives the fixed cost of a step; framing is also
timed alone, to charge it per event when events group tokens.

Beside the token path: what one request costs the front end before the engine sees it
(request_measure.py), and one streamed chunk built as an engine's own pydantic code builds it, timed
against this package's framer on the same texts. The HTTP servers' own work per request and per event
is measured where the caller gives a way to (`tokenpath calibrate delivery` gives serve/measure.py's,
on `tokenpath serve`'s stack, and calibrate/engine_http.py's, on an engine's FastAPI and uvicorn: this
layer imports neither).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tokenpath.delivery.calibration import BatchCost, Calibration, FramingCost, HttpCost
from tokenpath.delivery.chat_template import jinja_source_for, renderer_for
from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.engine_protocol import engine_event
from tokenpath.delivery.path import TextPath
from tokenpath.delivery.request_measure import measure_request, median_s, request_body
from tokenpath.delivery.sample_text import MIXED
from tokenpath.delivery.sse import SseFramer
from tokenpath.delivery.stream import CONTEXT_TOKENS
from tokenpath.delivery.template_parse import measure_template_parse

DEFAULT_BATCH_SIZES = (1, 8, 32, 128, 256)
DEFAULT_STOPS = ("\n\nUser:", "<|end|>")
# Measures an HTTP server's own cost (per request, per event) given a request body and the repeats.
HttpMeasure = Callable[[bytes, int], tuple[HttpCost, dict[str, Any]]]


def _sample_ids(det: Detokenizer, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    text_ids = np.asarray(det.encode(MIXED), dtype=np.int64)
    return text_ids, np.random.default_rng(seed).integers(0, len(text_ids), batch)


def token_streams(det: Detokenizer, batch: int, steps: int, seed: int = 0) -> np.ndarray:
    """(steps, batch) ids: each column a window of the sample text, starting at a random token."""
    text_ids, starts = _sample_ids(det, batch, seed)
    repeats = -(-(steps + 1) // len(text_ids)) + 1
    corpus = np.tile(text_ids, repeats)
    return np.ascontiguousarray(np.stack([corpus[s:s + steps] for s in starts], axis=1))


def stream_contexts(det: Detokenizer, batch: int, seed: int = 0) -> list[list[int]]:
    """What each column of `token_streams` (the same seed) follows: the CONTEXT_TOKENS sample tokens
    before its window, so that it streams after them as an engine's output streams after its prompt."""
    text_ids, starts = _sample_ids(det, batch, seed)
    return [np.take(text_ids, np.arange(s - CONTEXT_TOKENS, s), mode="wrap").tolist() for s in starts]


def _time_path(det: Detokenizer, ids: np.ndarray, stops: Sequence[str], context: list[list[int]]) -> float:
    path = TextPath(det, ids.shape[1], stops, context=context)
    start = time.perf_counter()
    for row in ids:
        path.step(row)
    return (time.perf_counter() - start) / len(ids)


def _time_framing(texts: list[list[str]]) -> float:
    framer = SseFramer(len(texts[0]))
    for i in range(framer.n):
        framer.open(i, f"chatcmpl-{i}", "tokenpath", 0)
    start = time.perf_counter()
    for row in texts:
        framer.step(row)
    return (time.perf_counter() - start) / len(texts)


def measure_batch(det: Detokenizer, batch: int, steps: int, repeats: int, stops: Sequence[str]) -> BatchCost:
    ids, context = token_streams(det, batch, steps), stream_contexts(det, batch)
    stream = det.batch(batch)
    for i, tail in enumerate(context):
        stream.prime(i, tail)
    texts = [stream.step(row) for row in ids]
    full, empty, frame = [], [], []
    for _ in range(repeats):  # interleaved, so drift in the machine's load hits all three alike
        full.append(_time_path(det, ids, stops, context))
        empty.append(_time_path(det, np.full_like(ids, -1), stops, context))
        frame.append(_time_framing(texts))
    full_s, empty_s, frame_s = (statistics.median(x) for x in (full, empty, frame))
    per_token_s = max(0.0, full_s - empty_s) / batch
    return BatchCost(batch, empty_s, per_token_s, min(per_token_s, frame_s / batch))


def measure_framing(det: Detokenizer, tokens: int, repeats: int) -> FramingCost:
    """Seconds per streamed text chunk: built by the engine's pydantic models and by SseFramer (one
    stream, an event per call), over the texts of `tokens` tokens; a text that shows nothing sends no event."""
    stream = det.batch(1)
    stream.prime(0, stream_contexts(det, 1)[0])
    texts = [text for text in (stream.step(row)[0] for row in token_streams(det, 1, tokens)) if text] or ["x"]
    framer = SseFramer(1)
    framer.open(0, "chatcmpl-0", "tokenpath", 0)

    def engine() -> None:
        for text in texts:
            engine_event("chatcmpl-0", "tokenpath", 0, text)

    def own() -> None:
        for text in texts:
            framer.step((text,))

    return FramingCost(median_s(engine, repeats) / len(texts), median_s(own, repeats) / len(texts))


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "logical_cores": os.cpu_count() or 0, "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


def calibrate(det: Detokenizer, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, steps: int = 200,
              repeats: int = 5, stops: Sequence[str] = DEFAULT_STOPS,
              progress: Callable[[str], None] | None = None, http: HttpMeasure | None = None,
              engine_http: HttpMeasure | None = None) -> Calibration:
    """Measure every batch size, then the request path and the engine's framing, then (given `http` and
    `engine_http`) the HTTP servers' own work, serve's and an engine's; `progress(what)` is called after
    each of the len(batch_sizes) + 1 parts, and once more after each HTTP server's."""
    batches = []
    for batch in batch_sizes:
        batches.append(measure_batch(det, batch, steps, repeats, stops))
        if progress is not None:
            progress(f"batch {batch}")
    request, request_how = measure_request(det, repeats)
    template, template_origin = jinja_source_for(det.path, det.kind)
    template_parse = measure_template_parse(template, repeats)
    framing = measure_framing(det, steps, repeats)
    if progress is not None:
        progress("request path")
    path = {"text": "mixed sample: English, Chinese, code, emoji", "stop_strings": list(stops), "api": "chat",
            "stream_interval": 1, "steps": steps, "repeats": repeats, "statistic": "median",
            "request": request_how,
            "template_parse": {"template": template_origin, "chars": len(template),
                               "work": "delivery/template_parse.py, per character"},
            "framing": {"engine": "pydantic ChatCompletionStreamResponse, model_dump_json(exclude_unset=True), "
                                  "'data: ...' framing (modelled on vLLM's serving_chat)",
                        "own": "SseFramer, one stream", "tokens": steps}}
    body = request_body(renderer_for(det.path, det.kind)[1])
    measured: dict[str, HttpCost] = {}
    for table, measure in (("http", http), ("engine_http", engine_http)):
        if measure is not None:
            measured[table], path[table] = measure(body, repeats)
            if progress is not None:
                progress(table)
    return Calibration(
        batches=sorted(batches, key=lambda b: b.batch_size),
        machine=machine(),
        tokenizer={"name": det.name, "kind": det.kind, "vocab_size": det.vocab_size},
        path=path,
        measured_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        request=request,
        framing=framing,
        http=measured.get("http"),
        engine_http=measured.get("engine_http"),
        template_parse=template_parse,
    )
