"""One request's timed spans as stages of the application table, laid out so that the table gives back the
trace: its critical path from the root span's start to the model call's, and from the model call's end to
the root span's end, sums to the root span's duration exactly (integer nanoseconds).

- A span ending before the model call starts is a stage before it; one starting after it ends, after it;
  one overlapping it cannot be placed (the table has no stage beside the model call).
- A stage runs `after` the stages that ended last before it started (all of them where several end at
  that instant), so spans that overlapped stay parallel. Before the model a stage with none starts at the
  send; after it, the model call is the one that ended last.
- Time on the critical path that no span covers (a gap: serialisation, a queue, code no span wraps) is a
  `cpu` stage named for the stages around it ("retrieve -> rerank"). So is the wait of a stage on the
  critical path that started while another span still ran and after the last one had ended: the table
  starts a stage when its `after` are done, and this holds the rest of the time.
- The model call runs after the stage that ended as it started, and after every stage before it that no
  other stage waits for: everything before the model call is upstream of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpath.application.spec import MAX_NAME_CHARS, MAX_STAGES, StageKind
from tokenpath.application.traces.spans import Request, Span
from tokenpath.config.errors import UserError


@dataclass(frozen=True)
class Stage:
    """A stage as imported: its time in the trace (`duration_ns`, None for the model call, whose time is
    simulated) and the span it came from (None for a gap)."""

    name: str
    kind: StageKind
    after: tuple[str, ...]
    duration_ns: int | None
    span: Span | None


@dataclass(eq=False)
class _Element:
    """A span, a gap or a wait on the trace's clock (ns from the root span's start); `after` filled in as
    the phase is laid out."""

    kind: StageKind
    start_ns: int
    end_ns: int
    span: Span | None
    after: list[_Element] = field(default_factory=list)
    name: str = ""
    waited_by: _Element | None = None  # for a gap or a wait: the stage after it on the critical path

    @property
    def positive(self) -> bool:
        return self.end_ns > self.start_ns


START, END = "start", "end"  # what a gap is named for at the request's start and end


def stages_of(request: Request, where: str) -> list[Stage]:
    """The request's stages, those before the model call first, each after the stages it runs after."""
    if len(request.stages) > MAX_STAGES:  # before the layout, whose cost grows with the square of the spans
        raise UserError(f"{where}: {len(request.stages)} spans are stages, more than the {MAX_STAGES} an "
                        "application table holds; export a trace with fewer spans")
    origin, total = request.root.start_ns, request.root.end_ns - request.root.start_ns
    model = _Element("model", request.model.start_ns - origin, request.model.end_ns - origin, request.model,
                     name=request.model.name)
    before, after = [], []
    for span in request.stages:
        if span is request.model:
            continue
        element = _Element(span.kind or "cpu", span.start_ns - origin, span.end_ns - origin, span, name=span.name)
        _check_inside(element, total, where)
        if element.end_ns <= model.start_ns:
            before.append(element)
        elif element.start_ns >= model.end_ns:
            after.append(element)
        else:
            raise _cannot_place(element, where, f"it runs beside the model call {request.model.shown()} (from "
                                f"{_ms(element.start_ns)} to {_ms(element.end_ns)} ms against {_ms(model.start_ns)} to "
                                f"{_ms(model.end_ns)} ms); the table holds stages before or after the model call")
    pre = _lay_out(before, 0, model.start_ns, head=None, tail=model)
    end = _Element("cpu", total, total, None, name=END)
    post = _lay_out(after, model.end_ns, total, head=model, tail=end)
    sinks = [element for element in pre if not any(element in other.after for other in (*pre, model))]
    model.after += sinks
    ordered = [*pre, model, *post]
    _name(ordered)
    return [Stage(element.name, element.kind, tuple(before.name for before in element.after),
                  None if element is model else element.end_ns - element.start_ns, element.span)
            for element in ordered]


def _lay_out(spans: list[_Element], begin_ns: int, end_ns: int, head: _Element | None,
             tail: _Element) -> list[_Element]:
    """One phase, [begin_ns, end_ns]: its spans and gaps, each after the latest to end before it started;
    then the critical path walked back from `tail` (the model call, or the request's end), a wait put in
    front of each stage on it that started later than its `after` ended. `head` is the model call after
    it; before it, none (a stage with nothing before it starts at the send)."""
    elements = sorted(spans + _gaps(spans, begin_ns, end_ns), key=lambda e: (e.start_ns, e.end_ns))
    pool = ([head] if head is not None else []) + elements
    for k, element in enumerate(pool):
        if element is not head:
            element.after = _latest(pool[:k], element.start_ns)
    tail.after = _latest(pool, tail.start_ns)
    waits: list[_Element] = []
    current = tail
    while current.after or current.start_ns > begin_ns:
        ended_ns = max((before.end_ns for before in current.after), default=begin_ns)
        if ended_ns < current.start_ns:
            wait = _Element("cpu", ended_ns, current.start_ns, None, after=current.after, waited_by=current)
            current.after = [wait]
            waits.append(wait)
            current = wait
            continue
        first = max(current.after, key=lambda before: (before.positive, -before.start_ns))
        current.after.remove(first)
        current.after.insert(0, first)
        if first.span is None:
            first.waited_by = current
        if first is head:
            break
        current = first
    return sorted(elements + waits, key=lambda e: (e.start_ns, e.end_ns))


def _latest(candidates: list[_Element], start_ns: int) -> list[_Element]:
    """Those of `candidates` that ended last at or before `start_ns` (every one ending at that instant)."""
    ended = [element for element in candidates if element.end_ns <= start_ns]
    if not ended:
        return []
    last_ns = max(element.end_ns for element in ended)
    return [element for element in ended if element.end_ns == last_ns]


def _gaps(spans: list[_Element], begin_ns: int, end_ns: int) -> list[_Element]:
    """The stretches of [begin_ns, end_ns] that no span covers, as `cpu` elements."""
    gaps, covered_ns = [], begin_ns
    for start_ns, stop_ns in sorted((e.start_ns, e.end_ns) for e in spans if e.positive):
        if start_ns > covered_ns:
            gaps.append(_Element("cpu", covered_ns, start_ns, None))
        covered_ns = max(covered_ns, stop_ns)
    if end_ns > covered_ns:
        gaps.append(_Element("cpu", covered_ns, end_ns, None))
    return gaps


def _name(ordered: list[_Element]) -> None:
    """Name each gap and wait for the stages around it on the critical path ("retrieve -> rerank"), then
    make every name unique ("format 2")."""
    left: dict[int, str] = {}
    for element in ordered:  # in time order: what a gap follows is named before it
        if element.span is None:
            before = element.after[0] if element.after else None
            left[id(element)] = START if before is None else left.get(id(before), before.name)
    for element in ordered:
        if element.span is None:
            right = element.waited_by
            while right is not None and right.span is None and right.name != END:
                right = right.waited_by
            element.name = f"{left[id(element)]} -> {right.name if right is not None else END}"
    taken: set[str] = set()
    for element in ordered:
        base, copy = element.name or element.kind, 1
        name = base[:MAX_NAME_CHARS]
        while name in taken:
            copy += 1
            name = f"{base[:MAX_NAME_CHARS - len(str(copy)) - 1]} {copy}"
        element.name = name
        taken.add(name)


def _check_inside(element: _Element, total_ns: int, where: str) -> None:
    if element.start_ns < 0:
        raise _cannot_place(element, where, f"it starts {_ms(-element.start_ns)} ms before its request's root span")
    if element.end_ns > total_ns:
        raise _cannot_place(element, where, f"it ends {_ms(element.end_ns - total_ns)} ms after its request's root "
                                            "span")


def _cannot_place(element: _Element, where: str, why: str) -> UserError:
    return UserError(f"{where}: cannot place {element.span.shown()}: {why}")


def _ms(ns: int) -> str:
    return f"{ns / 1e6:g}"
