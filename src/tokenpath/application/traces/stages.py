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
- With several model calls (an agent loop), the stages before the first call and after the last are laid
  out so, and the spans between two calls as a phase of their own, from one call's end to the next's
  start: each round's layout gives back its time between the calls. The loop's `between` stages are the
  same in every round, so each round must run the same kinds of spans in the same order (each after the
  same others); a stage named differently from round to round takes the words its names share (the
  GenAI conventions name a tool call `execute_tool {tool}`), or its kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpath.application.spec import MAX_NAME_CHARS, MAX_STAGES, StageKind
from tokenpath.application.traces.spans import Request, Span, ms
from tokenpath.config.errors import UserError, quoted


@dataclass(frozen=True)
class Stage:
    """A stage as imported: its time in the trace (`duration_ns`, None for the model call, whose time is
    simulated, and for a stage between the model calls, whose times are `rounds_ns`, one per round) and
    the span it came from (None for a gap; the first round's for a stage between the calls)."""

    name: str
    kind: StageKind
    after: tuple[str, ...]
    duration_ns: int | None
    span: Span | None
    rounds_ns: tuple[int, ...] | None = None

    @property
    def samples_ns(self) -> tuple[int, ...]:
        """Its times in the trace: one, or one per round between the model calls."""
        return self.rounds_ns if self.rounds_ns is not None else (self.duration_ns,)


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
    rounds_ns: list[int] | None = None  # between the model calls: its time in each round

    @property
    def positive(self) -> bool:
        return self.end_ns > self.start_ns


START, END = "start", "end"  # what a gap is named for at the request's start and end


def stages_of(request: Request, where: str) -> list[Stage]:
    """The request's stages: those before the (first) model call, the call, those between two calls (an
    agent loop's, with their times in each round) and those after the (last) call, each after the stages
    it runs after."""
    origin, total = request.root.start_ns, request.root.end_ns - request.root.start_ns
    calls = [_Element("model", call.start_ns - origin, call.end_ns - origin, call, name=request.model.name)
             for call in request.calls]
    first, last = calls[0], calls[-1]
    before: list[_Element] = []
    after: list[_Element] = []
    rounds: list[list[_Element]] = [[] for _ in calls[1:]]
    for span in request.stages:
        if any(span is call for call in request.calls):
            continue
        element = _Element(span.kind or "cpu", span.start_ns - origin, span.end_ns - origin, span, name=span.name)
        _check_inside(element, total, where)
        if element.end_ns <= first.start_ns:
            before.append(element)
        elif element.start_ns >= last.end_ns:
            after.append(element)
        else:
            k = next((k for k, (call, following) in enumerate(zip(calls, calls[1:]))
                      if call.end_ns <= element.start_ns and element.end_ns <= following.start_ns), None)
            if k is None:
                call = next((call for call in calls if call.start_ns < element.end_ns
                             and element.start_ns < call.end_ns), first)
                raise _cannot_place(element, where, f"it runs beside the model call {call.span.shown()} (from "
                                    f"{ms(element.start_ns)} to {ms(element.end_ns)} ms against {ms(call.start_ns)} "
                                    f"to {ms(call.end_ns)} ms); the table holds stages before or after the model "
                                    "call")
            rounds[k].append(element)
    _check_counts(before, after, rounds, where)
    pre = _lay_out(before, 0, first.start_ns, head=None, tail=first)
    end = _Element("cpu", total, total, None, name=END)
    post = _lay_out(after, last.end_ns, total, head=last, tail=end)
    sinks = [element for element in pre if not any(element in other.after for other in (*pre, first))]
    first.after += sinks
    between = _one_round([_lay_out(spans, call.end_ns, following.start_ns, head=call, tail=following, empty=True)
                          for spans, call, following in zip(rounds, calls, calls[1:])], where)
    ordered = [*pre, first, *between, *post]
    _name(ordered)
    called = {id(call) for call in calls}
    return [_stage(element, called) for element in ordered]


def _stage(element: _Element, called: set[int]) -> Stage:
    """An element as the table's stage; a stage between the model calls starts at a call's end, so it
    runs after none of them."""
    if element.rounds_ns is not None:
        return Stage(element.name, element.kind, tuple(b.name for b in element.after if id(b) not in called), None,
                     element.span, tuple(element.rounds_ns))
    return Stage(element.name, element.kind, tuple(b.name for b in element.after),
                 None if element.kind == "model" else element.end_ns - element.start_ns, element.span)


def _check_counts(before: list[_Element], after: list[_Element], rounds: list[list[_Element]], where: str) -> None:
    """No phase holds more spans than a table holds stages (before the layout, whose cost grows with the
    square of a phase's spans)."""
    phases = [(before, "before the model call"), (after, "after the model call"),
              *((spans, f"between model calls {k + 1} and {k + 2}") for k, spans in enumerate(rounds))]
    for spans, phase in phases:
        if len(spans) > MAX_STAGES:
            raise UserError(f"{where}: {len(spans)} spans are stages {phase}, more than the {MAX_STAGES} an "
                            "application table holds; export a trace with fewer spans")


def _one_round(rounds: list[list[_Element]], where: str) -> list[_Element]:
    """The stages between two model calls, as the table's loop runs them after every call but the last:
    the first round's, each with its time in every round; rounds of other shapes are refused."""
    if not rounds:
        return []
    shapes = [_shape(elements) for elements in rounds]
    for k, shape in enumerate(shapes[1:], 2):
        if shape != shapes[0]:
            raise UserError(f"{where}: the stages between its model calls differ from round to round "
                            f"({_round_difference(rounds[0], rounds[k - 1], k)}); the table's loop runs the same "
                            "stages after every call but the last: import a trace whose rounds run the same kinds "
                            "of spans in the same order")
    template = rounds[0]
    for j, element in enumerate(template):
        element.rounds_ns = [elements[j].end_ns - elements[j].start_ns for elements in rounds]
        names = [elements[j].name for elements in rounds]
        if element.span is not None and len(set(names)) > 1:
            common = []
            for words in zip(*(name.split() for name in names)):
                if len(set(words)) > 1:
                    break
                common.append(words[0])
            element.name = " ".join(common) or element.kind
    return template


def _shape(elements: list[_Element]) -> list[tuple[str, bool, tuple[int, ...]]]:
    """A round's stages in time order: each one's kind, whether it is a gap, and the positions of those it
    runs after (-1: the model call), less those it waits for through another (two that end at one instant
    are both in `after`, one of them maybe through the other)."""
    position = {id(element): k for k, element in enumerate(elements)}
    upstream: dict[int, set[int]] = {}

    def before(element: _Element) -> set[int]:
        if id(element) not in upstream:
            upstream[id(element)] = set()  # (a gap's `after` is never itself)
            upstream[id(element)] = {id(b) for b in element.after}.union(*(before(b) for b in element.after))
        return upstream[id(element)]

    shape = []
    for element in elements:
        direct = [b for b in element.after if not any(id(b) in before(other) for other in element.after)]
        shape.append((element.kind, element.span is None, tuple(sorted(position.get(id(b), -1) for b in direct))))
    return shape


def _round_difference(first: list[_Element], other: list[_Element], k: int) -> str:
    if len(first) != len(other):
        return f"round {k} has {len(other)} stages, spans and gaps, against round 1's {len(first)}"
    j = next(j for j, (a, b) in enumerate(zip(_shape(first), _shape(other))) if a != b)
    if (first[j].kind, first[j].span is None) == (other[j].kind, other[j].span is None):
        return f"round {k}'s stage {j + 1}, {_shown(other[j])}, runs after other stages than in round 1"
    return f"round {k}'s stage {j + 1} is {_shown(other[j])}, round 1's {_shown(first[j])}"


def _shown(element: _Element) -> str:
    return "a gap" if element.span is None else f"a {element.kind} span {quoted(element.name)}"


def _lay_out(spans: list[_Element], begin_ns: int, end_ns: int, head: _Element | None,
             tail: _Element, empty: bool = False) -> list[_Element]:
    """One phase, [begin_ns, end_ns]: its spans and gaps, each after the latest to end before it started;
    then the critical path walked back from `tail` (the model call, or the request's end), a wait put in
    front of each stage on it that started later than its `after` ended. `head` is the model call after
    it; before it, none (a stage with nothing before it starts at the send). `empty`: gaps of no time kept
    (_with_gaps); a gap off the critical path is named for the first stage after it."""
    elements = _with_gaps(spans, begin_ns, end_ns, empty)
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
    for element in elements:
        if element.span is None and element.waited_by is None:
            element.waited_by = next((other for other in (*elements, tail) if element in other.after), None)
    return sorted(elements + waits, key=lambda e: (e.start_ns, e.end_ns))


def _latest(candidates: list[_Element], start_ns: int) -> list[_Element]:
    """Those of `candidates` that ended last at or before `start_ns` (every one ending at that instant)."""
    ended = [element for element in candidates if element.end_ns <= start_ns]
    if not ended:
        return []
    last_ns = max(element.end_ns for element in ended)
    return [element for element in ended if element.end_ns == last_ns]


def _with_gaps(spans: list[_Element], begin_ns: int, end_ns: int, empty: bool = False) -> list[_Element]:
    """The spans and the stretches of [begin_ns, end_ns] that no span covers (as `cpu` elements), in time
    order. With `empty` (the rounds between model calls, which must match each other) a gap of no time
    stands wherever a span starts as the spans before it end, and at the end where they end with it, and a
    span of no time splits a gap: a round's stages then do not depend on whether a clock ticked between
    two spans."""
    swept, covered_ns = [], begin_ns
    for span in sorted(spans, key=lambda e: (e.start_ns, e.end_ns)):
        if span.positive or empty:
            if span.start_ns > covered_ns or empty and span.start_ns == covered_ns:
                swept.append(_Element("cpu", covered_ns, span.start_ns, None))
            covered_ns = max(covered_ns, span.end_ns)
        swept.append(span)
    if end_ns > covered_ns or empty and end_ns == covered_ns:
        swept.append(_Element("cpu", covered_ns, end_ns, None))
    return sorted(swept, key=lambda e: (e.start_ns, e.end_ns))  # (stable: elements of one instant as swept)


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
        raise _cannot_place(element, where, f"it starts {ms(-element.start_ns)} ms before its request's root span")
    if element.end_ns > total_ns:
        raise _cannot_place(element, where, f"it ends {ms(element.end_ns - total_ns)} ms after its request's root "
                                            "span")


def _cannot_place(element: _Element, where: str, why: str) -> UserError:
    return UserError(f"{where}: cannot place {element.span.shown()}: {why}")

