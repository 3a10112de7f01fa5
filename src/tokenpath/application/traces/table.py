"""The imported requests as one `[application]` table and its TOML text.

One trace: each stage's latency is `fixed` at its measured duration. Several traces of one shape (the same
stages, each after the same others): a `lognormal` of the sample's mean and standard deviation (`fixed`
where every trace took the same). Traces of different shapes are refused: a distribution per stage needs
the stages to be the same ones.

Traces of several model calls (an agent loop) give the model stage a `loop`: `turns` the calls' count,
`between` the stages between two calls (each round one more sample of their times), and from the calls'
token counts `call_output` (each call's but the last's output) and `result_tokens` (each later call's
prompt less the call before's prompt and answer), in the same way: `fixed` where the samples agree, else
the `lognormal` of their mean and sd.
"""

from __future__ import annotations

import statistics
import textwrap
from dataclasses import dataclass, field
from importlib import resources

import tomli_w
import tomllib
from pydantic import ValidationError

from tokenpath.application.spec import MAX_STAGES, ApplicationSpec
from tokenpath.application.traces.spans import Request
from tokenpath.application.traces.stages import Stage
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError, quoted
from tokenpath.config.units import MAX_DURATION_S

COMMENT_CHARS = 110  # the width of the comments heading the TOML
# Where traces give no token counts for an agent's calls, its loop's lengths are this catalog scenario's.
LOOP_EXAMPLE = "agent"

@dataclass(frozen=True)
class Imported:
    """The table (`spec`, and `stages` as the TOML writes them) and what the traces said of the model call."""

    spec: ApplicationSpec
    stages: list[dict]
    requests: list[Request]
    gaps: int
    traced: list[list[Stage]] = field(default_factory=list)  # each trace's stages, a between stage's every round
    loop_tokens_traced: bool = True  # an agent loop's lengths came from the calls' token counts

    @property
    def root_ns(self) -> list[int]:
        return [request.root.end_ns - request.root.start_ns for request in self.requests]

    @property
    def model_ns(self) -> list[int]:
        """Per trace, its model calls' time (every call's, with an agent loop)."""
        return [sum(call.end_ns - call.start_ns for call in request.calls) for request in self.requests]


def application_of(requests: list[Request], stages: list[list[Stage]], where: str) -> Imported:
    """One table from the requests' stages (`stages[k]` is request k's), which must share one shape."""
    first = stages[0]
    shape = [(stage.name, stage.kind, stage.after, stage.rounds_ns is None) for stage in first]
    for request, other in zip(requests[1:], stages[1:]):
        if [(stage.name, stage.kind, stage.after, stage.rounds_ns is None) for stage in other] != shape:
            raise UserError(f"{where}: trace {quoted(request.trace_id)} has other stages than trace "
                            f"{quoted(requests[0].trace_id)} ({_difference(first, other)}); import one trace at a "
                            "time with --trace ID (a latency distribution per stage needs traces of one shape)")
    if len(first) > MAX_STAGES:
        raise UserError(f"{where}: the trace gives {len(first)} stages, more than the {MAX_STAGES} an application "
                        "table holds; export a trace with fewer spans")
    table = []
    empty = _empty_gaps(stages)
    loop, traced = _loop(requests, [stage for stage in first if stage.name not in empty], where)
    for k, stage in enumerate(first):
        if stage.name in empty:
            continue
        row: dict = {"name": stage.name, "kind": stage.kind}
        if stage.after:
            row["after"] = _without(stage.after, empty)
        if stage.kind != "model":
            row["latency"] = _latency([ns for each in stages for ns in each[k].samples_ns], stage.name, where)
        elif loop is not None:
            row["loop"] = loop
        table.append(row)
    try:
        spec = ApplicationSpec.model_validate({"stages": table})
    except ValidationError as error:
        raise UserError(explain(error, f"{where}: the imported table", ApplicationSpec)) from None
    gaps = sum(stage.span is None and stage.name not in empty for stage in first)
    return Imported(spec, table, requests, gaps, stages, traced)


def _empty_gaps(stages: list[list[Stage]]) -> dict[str, tuple[str, ...]]:
    """The gaps between the model calls that took no time in any round of any trace (a clock that did not
    tick), each with the stages it runs after: they are no stage, and what runs after one runs after those."""
    return {stage.name: stage.after for k, stage in enumerate(stages[0])
            if stage.rounds_ns is not None and stage.span is None and not any(ns for each in stages
                                                                                for ns in each[k].rounds_ns)}


def _without(after: tuple[str, ...], empty: dict[str, tuple[str, ...]]) -> list[str]:
    """`after` with each gap of `empty` replaced by the stages it runs after."""
    return list(dict.fromkeys(kept for name in after
                              for kept in (_without(empty[name], empty) if name in empty else [name])))


def _loop(requests: list[Request], stages: list[Stage], where: str) -> tuple[dict | None, bool]:
    """The model stage's loop where a trace makes several calls (None otherwise), and whether its lengths
    came from the calls' token counts (else the LOOP_EXAMPLE scenario's, for lack of them)."""
    turns = [len(request.calls) for request in requests]
    if max(turns) == 1:
        return None, True
    loop: dict = {"turns": turns[0] if len(set(turns)) == 1 else _lengths(turns),
                  "between": [stage.name for stage in stages if stage.rounds_ns is not None]}
    counted = [request for request in requests if len(request.calls) > 1
               and all(call.input_tokens is not None and call.output_tokens is not None for call in request.calls)]
    if not counted:
        example = tomllib.loads((resources.files("tokenpath.catalog") / "scenarios" / f"{LOOP_EXAMPLE}.toml")
                                .read_text(encoding="utf-8"))
        model = next(stage for stage in example["application"]["stages"] if stage["kind"] == "model")
        return {**loop, **{key: model["loop"][key] for key in ("result_tokens", "call_output")}}, False
    results, outputs = [], []
    for request in counted:
        for call, following in zip(request.calls, request.calls[1:]):
            outputs.append(call.output_tokens)
            result = following.input_tokens - call.input_tokens - call.output_tokens
            if result < 0:
                raise UserError(f"{where}: trace {quoted(request.trace_id)}: the prompt of {following.shown()} "
                                f"({following.input_tokens} tokens) is shorter than the prompt and answer of "
                                f"{call.shown()} ({call.input_tokens} + {call.output_tokens}); the table's loop "
                                "carries each call's prompt and answer into the next: import a trace of an agent "
                                "that keeps its whole history")
            results.append(result)
    return {**loop, "result_tokens": _lengths(results), "call_output": _lengths(outputs)}, True


def _lengths(values: list[int]) -> dict:
    """Counts as a length distribution: `fixed` where they agree, else the lognormal of their mean and sd
    (each at least 1, the least a length takes)."""
    values = [max(value, 1) for value in values]
    if len(set(values)) == 1:
        return {"kind": "fixed", "value": values[0]}
    return {"kind": "lognormal", "mean": round(statistics.fmean(values), 1), "sd": round(statistics.stdev(values), 1)}


def _latency(durations_ns: list[int], name: str, where: str) -> dict:
    longest_ns = max(durations_ns)
    if longest_ns > MAX_DURATION_S * 1e9:
        raise UserError(f"{where}: stage {quoted(name)} takes {longest_ns / 1e9:g} s, more than the "
                        f"{MAX_DURATION_S:g} s a stage's latency may; check the trace's times")
    if min(durations_ns) == longest_ns:
        return {"kind": "fixed", "value": duration_text(longest_ns)}
    mean_ns = round(statistics.fmean(durations_ns))
    return {"kind": "lognormal", "mean": duration_text(mean_ns),
            "sd": duration_text(round(statistics.stdev(durations_ns)))}


def _difference(first: list[Stage], other: list[Stage]) -> str:
    names, others = {stage.name: stage for stage in first}, {stage.name: stage for stage in other}
    for stage in other:
        if stage.name not in names:
            return f"{quoted(stage.name)} is not in the first"
    for stage in first:
        if stage.name not in others:
            return f"{quoted(stage.name)} is missing"
        if others[stage.name].after != stage.after or others[stage.name].kind != stage.kind:
            return f"{quoted(stage.name)} runs after {list(others[stage.name].after)} there, {list(stage.after)} here"
    return "the stages come in another order"


def duration_text(ns: int) -> str:
    """`ns` as exact milliseconds ("12.345678 ms"): the table reads it back to the same nanosecond."""
    whole, part = divmod(ns, 10**6)
    return f"{whole}.{part:06d}".rstrip("0").rstrip(".") + " ms"


def to_toml(imported: Imported, source: str) -> str:
    """The table as `[[application.stages]]` TOML, headed by comments on where it came from and what the
    traces said of the model call (its time and tokens: a workload to run it with)."""
    requests, count = imported.requests, len(imported.requests)
    spans = len(imported.stages) - imported.gaps - 1
    calls = max(len(request.calls) for request in requests)
    call = (f"the model call {quoted(requests[0].model.name)}" if calls == 1 else
            f"the calls of the model {quoted(requests[0].model.name)} (an agent loop of up to {calls})")
    said = [f"Imported from {source} by `tokenpath application import`: {count} trace{'s' if count > 1 else ''}, "
            f"the root span {quoted(requests[0].root.name)} {_shown_ms(imported.root_ns)}; {spans} spans and "
            f"{imported.gaps} gaps around {call}, which took {_shown_ms(imported.model_ns)} there (tokenpath "
            "simulates it)."]
    if count > 1 or calls > 1:
        said.append("Each stage's latency is the lognormal of its durations in the traces (fixed where they agree)"
                    + (", a stage between the calls counting each round." if calls > 1 else "."))
    if calls > 1:
        said.append("The loop's result_tokens and call_output are the calls' token counts (fixed where they agree, "
                    "else lognormal)." if imported.loop_tokens_traced else "The traces give no token counts for "
                    f"every call: the loop's result_tokens and call_output are the {LOOP_EXAMPLE} scenario's "
                    "illustrative ones; set them by hand.")
    counted = [(r.calls[0].input_tokens, r.calls[-1].output_tokens) for r in requests
               if r.calls[0].input_tokens is not None and r.calls[-1].output_tokens is not None]
    if counted:
        of = f" (in {len(counted)} of {count} traces)" if count > 1 else ""
        said.append(f"Its tokens{of}: {_shown_tokens([c[0] for c in counted])} in, the whole prompt (template and "
                    f"context: the model stage takes no prompt table), {_shown_tokens([c[1] for c in counted])} "
                    f"out{' (the first call in, the last out)' if calls > 1 else ''}. A workload with them:")
    else:
        said.append("The trace gives no token counts for the model call; set the workload's lengths by hand.")
    lines = [f"# {line}" for paragraph in said for line in textwrap.wrap(paragraph, COMMENT_CHARS)]
    if counted:
        lines += _workload_lines([c[0] for c in counted], [c[1] for c in counted])
    for row in imported.stages:
        lines += ["", "[[application.stages]]"]
        lines += [f"{key} = {_inline(value)}" for key, value in row.items()]
    return "\n".join(lines) + "\n"


def _workload_lines(inputs: list[int], outputs: list[int]) -> list[str]:
    """The workload's input and output lengths as TOML comments: fixed at one count, else the normal
    of their mean and sd."""
    lines = []
    for which, values in (("input", inputs), ("output", outputs)):
        lines.append(f"# [workload.{which}]")
        if len(set(values)) == 1:
            lines += ["# kind = \"fixed\"", f"# value = {max(values[0], 1)}"]
        else:
            lines += ["# kind = \"normal\"", f"# mean = {statistics.fmean(values):.1f}",
                      f"# sd = {statistics.stdev(values):.1f}"]
    return lines


def _shown_tokens(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else f"{statistics.fmean(values):.1f} on average"


def _shown_ms(values_ns: list[int]) -> str:
    if len(values_ns) == 1:
        return duration_text(values_ns[0])
    return f"{statistics.fmean(values_ns) / 1e6:.3f} ms on average"


def _inline(value: object) -> str:
    """`value` as a TOML value on one line (tables and arrays inline)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_inline(item)}" for key, item in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(item) for item in value) + "]"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")
