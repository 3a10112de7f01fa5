"""LangSmith / LangChain run trees read into spans.

A run (LangSmith's span) has an `id`, a `name`, a `run_type` (llm, chain, tool, retriever, embedding,
prompt, parser), `start_time` and `end_time` (ISO 8601 strings, UTC where they give no offset; LangSmith's
JS client writes epoch milliseconds) and a `parent_run_id`, or its children nested in `child_runs`;
`trace_id` names its root. Schema: langsmith-sdk's `RunBase` and `Run`
(https://github.com/langchain-ai/langsmith-sdk/blob/main/python/langsmith/schemas.py;
https://reference.langchain.com/python/langsmith/schemas/RunBase/run_type). The file holds a run tree (one
run, its children nested), a list of runs, `{"runs": [...]}` as the API's run query returns, or one run
per line.

llm runs are model calls, retriever runs `retrieval` stages, tool runs `tool` stages, embedding, prompt
and parser runs `cpu` stages; chain runs group others. An llm run's tokens: the run's `prompt_tokens` and
`completion_tokens`, else LangChain's `usage_metadata` (input_tokens, output_tokens) in its outputs, its
message or its metadata, else the provider's `llm_output.token_usage` (prompt_tokens, completion_tokens).
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from tokenpath.application.spec import StageKind
from tokenpath.application.traces.document import field, whole_number
from tokenpath.application.traces.spans import Span, Trace, kind_by_name
from tokenpath.config.errors import UserError, quoted

RUN_TYPES: dict[str, StageKind | None] = {
    "llm": "model", "retriever": "retrieval", "tool": "tool", "embedding": "cpu", "prompt": "cpu",
    "parser": "cpu", "chain": None,
}
MODEL_HINT = "run_type llm"
# Where LangChain and LangSmith put an llm run's token counts, in the order they are looked for: a path
# into the run and the names of the input and output counts there.
USAGE_PATHS = (
    ((), ("prompt_tokens", "completion_tokens")),
    (("outputs", "usage_metadata"), ("input_tokens", "output_tokens")),
    (("outputs", "generations", 0, 0, "message", "kwargs", "usage_metadata"), ("input_tokens", "output_tokens")),
    (("outputs", "generations", 0, 0, "message", "usage_metadata"), ("input_tokens", "output_tokens")),
    (("extra", "metadata", "usage_metadata"), ("input_tokens", "output_tokens")),
    (("outputs", "llm_output", "token_usage"), ("prompt_tokens", "completion_tokens")),
)
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?",
                  re.ASCII | re.IGNORECASE)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def read_traces(documents: list[Any], source: str) -> list[Trace]:
    """Every trace in the documents: the runs grouped by their `trace_id`, or where a run has none, by the
    root its parents lead to."""
    runs: list[tuple[Span, str | None]] = []
    for document in documents:
        if isinstance(document, dict) and "runs" in document and "run_type" not in document:
            document = document["runs"]
            if not isinstance(document, list):
                raise UserError(f"{source}: runs is {quoted(document)}; it must be a list of runs")
        for raw in document if isinstance(document, list) else [document]:
            runs += _flatten(raw, source)
    if not runs:
        raise UserError(f"{source}: no runs; export a trace with its runs")
    parents = {span.span_id: span.parent_id for span, _ in runs}
    traces: dict[str, list[Span]] = {}
    for span, trace_id in runs:
        traces.setdefault(trace_id or _top(span.span_id, parents), []).append(span)
    return [Trace(trace_id, spans) for trace_id, spans in traces.items()]


def _flatten(raw: Any, source: str) -> list[tuple[Span, str | None]]:
    """A run and every run nested in its `child_runs`, each with its trace id (None where not given)."""
    found = []
    pending: list[tuple[Any, str | None, str]] = [(raw, None, "a run")]
    while pending:
        run, parent, where = pending.pop()
        if not isinstance(run, dict):
            raise UserError(f"{source}: {where} is {quoted(run)}; each run is an object with id, name, run_type, "
                            "start_time and end_time")
        span, trace_id = _run(run, parent, source)
        found.append((span, trace_id))
        children = field(run, "child_runs", list, f"{source}: run {quoted(span.span_id)}", "a list of runs",
                         required=False) or []
        pending += [(child, span.span_id, f"a child run of {quoted(span.span_id)}") for child in reversed(children)]
    return found


def _run(run: dict, parent: str | None, source: str) -> tuple[Span, str | None]:
    run_id = field(run, "id", str, f"{source}: a run", "the run's id (a UUID string)")
    where = f"{source}: run {quoted(run_id)}"
    name = field(run, "name", str, where, "a name", required=False) or ""
    where = f"{source}: run {quoted(name)} (id {quoted(run_id)})"
    run_type = field(run, "run_type", str, where, f"one of {', '.join(RUN_TYPES)}")
    if run_type not in RUN_TYPES:
        raise UserError(f"{where}: run_type {quoted(run_type)} is not one of LangSmith's ({', '.join(RUN_TYPES)})")
    if parent is None:
        parent = field(run, "parent_run_id", str, where, "the parent run's id or null", required=False)
    trace_id = field(run, "trace_id", str, where, "the root run's id", required=False)
    start_ns = _time_ns(run.get("start_time"), where, "start_time")
    if run.get("end_time") is None:
        raise UserError(f"{where}: no end_time (the run had not ended when it was exported); export finished runs")
    end_ns = _time_ns(run["end_time"], where, "end_time")
    kind = RUN_TYPES[run_type] or kind_by_name(name)
    tokens = _tokens(run, where) if kind == "model" else (None, None)
    return Span(run_id, parent, name, start_ns, end_ns, kind, *tokens), trace_id


def _time_ns(value: Any, where: str, what: str) -> int:
    """An ISO 8601 time (to the nanosecond; no offset: UTC) or epoch milliseconds, as ns since the epoch."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            ns = Decimal(repr(value)) * 10**6
        except InvalidOperation:
            ns = Decimal(-1)
        if ns.is_finite() and ns >= 0:
            return int(ns.to_integral_value())
    elif isinstance(value, str) and (match := _ISO.fullmatch(value.strip())):
        year, month, day, hour, minute, second, fraction, offset = match.groups()
        try:
            moment = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                                 tzinfo=dt.timezone.utc)
        except ValueError as error:
            raise UserError(f"{where}: {what} {quoted(value)} is no time ({error})") from None
        seconds = (moment - _EPOCH) // dt.timedelta(seconds=1) - _offset_s(offset)
        return seconds * 10**9 + int((fraction or "0").ljust(9, "0"))
    raise UserError(f"{where}: {what} is {quoted(value)}; it must be an ISO 8601 time such as "
                    "'2024-05-01T12:00:00.123456Z', or epoch milliseconds")


def _offset_s(offset: str | None) -> int:
    if offset is None or offset.upper() == "Z":
        return 0
    digits = offset[1:].replace(":", "")
    seconds = int(digits[:2]) * 3600 + int(digits[2:]) * 60
    return seconds if offset[0] == "+" else -seconds


def _tokens(run: dict, where: str) -> tuple[int | None, int | None]:
    for path, (input_key, output_key) in USAGE_PATHS:
        usage = _dig(run, path)
        if isinstance(usage, dict) and usage.get(input_key) is not None and usage.get(output_key) is not None:
            shown = ".".join(str(step) for step in path)
            return (whole_number(usage[input_key], where, f"{shown}.{input_key}".lstrip(".")),
                    whole_number(usage[output_key], where, f"{shown}.{output_key}".lstrip(".")))
    return None, None


def _dig(value: Any, path: tuple) -> Any:
    for step in path:
        if isinstance(step, int):
            value = value[step] if isinstance(value, list) and len(value) > step else None
        else:
            value = value.get(step) if isinstance(value, dict) else None
    return value


def _top(run_id: str, parents: dict[str, str | None]) -> str:
    """The run `run_id`'s parents followed within the file to the last one found (a cycle stops it)."""
    seen = {run_id}
    while (parent := parents.get(run_id)) is not None and parent in parents and parent not in seen:
        seen.add(parent)
        run_id = parent
    return run_id
