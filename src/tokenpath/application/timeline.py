"""Each request's way through the application's stages: when the model call goes, how long the stages
after it take, and which stage held the request's critical path for how long.

Times are integer nanoseconds. Before the model they count from the user's send; after it, from the
model's last token reaching the client. Per request the stages' critical-path shares sum exactly to
the time before the model call (`pre_ns`) and after it (`post_ns`). A model that streams into the
stages after it has those laid out once the run gives each request's stream (application/stream.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tokenpath.application.index import index_times_s
from tokenpath.application.service import MAX_QUEUE_NS
from tokenpath.application.spec import ApplicationSpec, LatencySpec
from tokenpath.config.errors import UserError
from tokenpath.workload.lengths import lognormal_parameters

if TYPE_CHECKING:
    from tokenpath.application.stream import Streamed


@dataclass(frozen=True)
class Timeline:
    """Per request: the model call's delay after the send, the stages' time after the model's answer,
    and per stage (by name) its share of those on the critical path."""

    pre_ns: np.ndarray
    post_ns: np.ndarray
    detail_ns: dict[str, np.ndarray]
    start_ns: dict[str, np.ndarray] | None = None  # per stage, when it started (in its frame)
    # A model streaming into the stages after it: those stages, to lay out after the run (post_ns and their
    # detail_ns hold them as if they started at the last token until then).
    streamed: Streamed | None = None
    # Per row, the request's index in the workload, where the rows are in another order (the model calls').
    request_index: np.ndarray | None = None


def draw_latencies_ns(spec: ApplicationSpec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each non-model stage's time per request, its cache's hits included. Each stage draws from a
    stream of its own (`stage_rng`), its hit/miss numbers first whether or not it has a cache, so a
    cache at 0% hits repeats the run without it and adding or changing one stage moves no other stage's
    draws. `rng` is not advanced. A retrieval stage with an index takes its search's time
    (application/index.py)."""
    drawn: dict[str, np.ndarray] = {}
    for stage in spec.stages:
        if stage.kind == "model" or stage.served is not None:  # (a served stage is timed as it is laid out)
            continue
        own = stage_rng(rng, stage.name)
        hit_draws = own.random(n)
        times = _sample_s(stage.latency, n, own) if stage.index is None else index_times_s(stage.index, n, own)
        if len(times) and float(times.max()) * 1e9 > MAX_QUEUE_NS:  # (a latency's durations are at most 1 h)
            raise UserError(f"application stage {stage.name!r}: a request's search would take {times.max():.3g} s "
                            "on its index, more than 146 years (past int64 nanoseconds); lower index.spread or "
                            "vectors, or search it another way (ivf, hnsw, on a chip)")
        if stage.cache is not None:
            times = np.where(hit_draws < stage.cache.hit_rate, stage.cache.hit_latency, times)
        drawn[stage.name] = np.rint(times * 1e9).astype(np.int64)
    return drawn


def stage_rng(rng: np.random.Generator, name: str) -> np.random.Generator:
    """The stage `name`'s own stream: a child of `rng`'s seed sequence keyed by a stable hash of the
    name (sha256, not Python's hash(), which is salted per process)."""
    parent = rng.bit_generator.seed_seq
    if not isinstance(parent, np.random.SeedSequence):
        raise TypeError("draw_latencies_ns needs a Generator made from a seed or a SeedSequence")
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence(parent.entropy, spawn_key=(*parent.spawn_key, key)))


def _sample_s(latency: LatencySpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if latency.kind == "fixed":
        return np.full(n, latency.value)
    if latency.kind == "exponential":
        return rng.exponential(latency.mean, n)
    mu, sigma = lognormal_parameters(latency.mean, latency.sd)
    return rng.lognormal(mu, sigma, n)


def timeline(spec: ApplicationSpec, latency_ns: dict[str, np.ndarray], n: int,
             served: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
             stream_length_ns: np.ndarray | None = None) -> Timeline:
    """Each request's stages laid out: a stage starts when its `after` are done (not before the send,
    or `ahead` before it for stages that start ahead); the model call when its `after` are; the stages
    after the model from its answer's last token at the client (time 0 of their frame). A stage in
    `served` takes the time that function gives from its start (a queue's wait and service). Given
    `stream_length_ns` (each answer's last token less its first, at the client), the stages after the
    model start at its first token, and one reading it ends no earlier than its last token."""
    served = served or {}
    model = spec.model.name
    before = spec.before_model()
    start: dict[str, np.ndarray] = {}
    end: dict[str, np.ndarray] = {}
    cause: dict[str, np.ndarray] = {}  # per request, the stage (index) whose end set the start; -1: none
    zero = np.zeros(n, np.int64)
    streams = stream_length_ns is not None
    first_ns = -np.asarray(stream_length_ns, np.int64) if streams else zero  # the first token, after the model
    names = [stage.name for stage in spec.stages]
    index = {name: k for k, name in enumerate(names)}
    for stage in spec.order():
        if stage.name == model or stage.name not in before:
            begin = zero if stage.name == model else first_ns  # the model from the send; later stages from its answer
        else:
            begin = np.full(n, -round(stage.ahead * 1e9) if stage.start == "ahead" else 0, np.int64)
        # Stages before the model are done before its answer: after it, only the model and later stages count.
        after = [name for name in stage.after if stage.name == model or stage.name in before or name not in before]
        begin, cause[stage.name] = _latest(after, end, begin, index)
        start[stage.name] = begin
        if stage.name == model:
            end[stage.name] = first_ns
        else:
            end[stage.name] = begin + (served[stage.name](begin) if stage.name in served else latency_ns[stage.name])
            if streams and model in stage.after:  # it reads the stream: it ends with it at the earliest
                end[stage.name] = np.maximum(end[stage.name], 0)
    pre_ns = start[model]
    detail = {stage.name: np.zeros(n, np.int64) for stage in spec.stages if stage.name != model}
    _walk_back(index[model], pre_ns > 0, names, start, end, cause, detail, from_send=True)
    post = [stage.name for stage in spec.stages if stage.name != model and stage.name not in before]
    post_ns = zero.copy()
    if post:
        ends = np.stack([end[name] for name in post])
        post_ns = ends.max(axis=0)
        last = np.argmax(ends, axis=0)
        for k, name in enumerate(post):
            held = last == k
            detail[name][held] += end[name][held] - np.maximum(start[name][held], 0)
            _walk_back(index[name], held, names, start, end, cause, detail, from_send=streams)
    return Timeline(pre_ns, post_ns, detail, start)


def _latest(after: list[str], end: dict[str, np.ndarray], earliest: np.ndarray,
            index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """When a stage starts: its `after`'s latest end, not before `earliest`; and per request the stage
    (by index) that set it, -1 where `earliest` did."""
    begin, which = earliest.copy(), np.full(len(earliest), -1, np.int64)
    for name in after:
        later = end[name] > begin
        begin[later], which[later] = end[name][later], index[name]
    return begin, which


def _walk_back(first: int, rows: np.ndarray, names: list[str], start: dict[str, np.ndarray],
               end: dict[str, np.ndarray], cause: dict[str, np.ndarray], detail: dict[str, np.ndarray],
               from_send: bool) -> None:
    """For `rows`, from stage `first`'s start back along the stages that set each start: each holds the
    path from its start to its end; with `from_send` (before the model, or after one that streams) only
    from time 0 of its frame on (the send; the last token), and the walk ends at a stage that started at
    or before it."""
    current = np.where(rows, first, -1)
    while (current >= 0).any():
        held_by = np.full(len(current), -1, np.int64)
        for k in set(current[current >= 0].tolist()):
            here = current == k
            held_by[here] = cause[names[k]][here]
        for k in set(held_by[held_by >= 0].tolist()):
            took, name = held_by == k, names[k]
            begin = np.maximum(start[name][took], 0) if from_send else start[name][took]
            detail[name][took] += end[name][took] - begin
            if from_send:
                held_by[took & (start[name] <= 0)] = -1
        current = held_by
