"""A trace as both formats read into it: spans with integer-nanosecond times and the kind of stage each is,
and the checks that make one request of them: one root, every parent in the file, no span ending before
it starts, model calls one after another (several: an agent loop), and the spans that become stages.

A span with a kind (a model call, an embedding, a retrieval, a tool call...) is a stage as a whole: what
runs inside it (an HTTP call under an LLM span) is part of its time. A span without one (a chain, an
agent, a handler) only groups others: its children are looked into, and it is a `cpu` stage itself only
where it has none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tokenpath.application.spec import StageKind
from tokenpath.config.errors import UserError, quoted

# Neither the GenAI conventions nor LangSmith's run types have a reranker: a span without a kind whose
# name holds this word (any case) is taken for one.
RERANK_WORD = "rerank"


@dataclass(frozen=True)
class Span:
    """One span (a LangSmith run): times in ns since the epoch; `kind` None for a span that only groups
    others; the token counts where a model call's span gives them."""

    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    kind: StageKind | None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def shown(self) -> str:
        return f"span {quoted(self.name)} (id {quoted(self.span_id)})"


@dataclass(frozen=True)
class Trace:
    trace_id: str
    spans: list[Span]


@dataclass(frozen=True)
class Request:
    """One trace checked: its root, its model call (the first, where an agent loop makes several) and the
    spans that become stages (the calls among them), in the order they start; its calls in their order."""

    trace_id: str
    root: Span
    model: Span
    stages: list[Span]
    calls: tuple[Span, ...]


def kind_by_name(name: str) -> StageKind | None:
    """The kind of a span its format gives none: a reranker by its name (RERANK_WORD), else none."""
    return "rerank" if RERANK_WORD in name.lower() else None


def request_of(trace: Trace, source: str, model_hint: str) -> Request:
    """`trace` checked as one request; a UserError naming the span and the trace at fault otherwise.
    `model_hint` says how the format marks a model call, for the error when none is."""
    where = f"{source}: trace {quoted(trace.trace_id)}"
    by_id: dict[str, Span] = {}
    for span in trace.spans:
        if span.span_id in by_id:
            raise UserError(f"{where}: span id {quoted(span.span_id)} is used by two spans "
                            f"({quoted(by_id[span.span_id].name)} and {quoted(span.name)}); export the trace again")
        by_id[span.span_id] = span
        if span.end_ns < span.start_ns:
            raise UserError(f"{where}: {span.shown()} ends {(span.start_ns - span.end_ns) / 1e6:g} ms before it "
                            "starts (a negative duration); check the clock of the process that recorded it")
    roots = [span for span in trace.spans if span.parent_id is None]
    if not roots:
        raise UserError(f"{where}: no root span (every span names a parent); export the whole trace, its "
                        "request's span included")
    if len(roots) > 1:
        names = ", ".join(span.shown() for span in roots[:3])
        raise UserError(f"{where}: {len(roots)} root spans ({names}); a request has one: export each request's "
                        "trace whole")
    root = roots[0]
    children: dict[str, list[Span]] = defaultdict(list)
    for span in trace.spans:
        if span.parent_id is not None:
            if span.parent_id not in by_id:
                raise UserError(f"{where}: cannot place {span.shown()}: its parent {quoted(span.parent_id)} is not "
                                "in the file; export the whole trace")
            children[span.parent_id].append(span)
    reached, pending = {root.span_id}, [root.span_id]
    while pending:
        for child in children[pending.pop()]:
            reached.add(child.span_id)
            pending.append(child.span_id)
    for span in trace.spans:
        if span.span_id not in reached:
            raise UserError(f"{where}: cannot place {span.shown()}: its parents never reach the root span (their "
                            "ids form a cycle); export the trace again")
    models = [span for span in trace.spans if span.kind == "model"]
    if not models:
        raise UserError(f"{where}: no LLM span: none is marked as a model call ({model_hint}); the application "
                        "table is built around one")
    stages = [root] if root.kind == "model" else _stage_spans(root, children)
    for model in models:
        if not any(model is stage for stage in stages):
            holder = _typed_ancestor(model, by_id, set(stages))
            raise UserError(f"{where}: cannot place {model.shown()}: the model call runs inside {holder.shown()} (a "
                            f"{holder.kind} stage); the table holds the model call as a stage of its own")
    calls = sorted(models, key=lambda span: (span.start_ns, span.end_ns))
    for call, following in zip(calls, calls[1:]):
        if following.start_ns < call.end_ns:
            raise UserError(f"{where}: the model calls {call.shown()} and {following.shown()} overlap (from "
                            f"{ms(call.start_ns - root.start_ns)} to {ms(call.end_ns - root.start_ns)} ms and from "
                            f"{ms(following.start_ns - root.start_ns)} ms); the table's agent loop makes one call "
                            "after another: import a trace whose calls do not overlap")
    return Request(trace.trace_id, root, calls[0], sorted(stages, key=lambda span: (span.start_ns, span.end_ns)),
                   tuple(calls))


def ms(ns: int) -> str:
    """Nanoseconds as milliseconds in the fewest digits (errors quote a span's times so)."""
    return f"{ns / 1e6:g}"


def _stage_spans(root: Span, children: dict[str, list[Span]]) -> list[Span]:
    """The spans under `root` that are stages: each with a kind, and each without one that groups nothing."""
    found: list[Span] = []
    pending = list(children[root.span_id])
    while pending:
        span = pending.pop()
        if span.kind is not None or not children[span.span_id]:
            found.append(span)
        else:
            pending.extend(children[span.span_id])
    return found


def _typed_ancestor(span: Span, by_id: dict[str, Span], stages: set[Span]) -> Span:
    current = span
    while current.parent_id is not None:
        current = by_id[current.parent_id]
        if current in stages:
            return current
    return current
