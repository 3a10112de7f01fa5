"""OTLP JSON traces (resourceSpans -> scopeSpans -> spans) read into spans, the kind of each from the GenAI
semantic conventions or, where a span has none, from OpenInference's span kind.

- OTLP JSON encoding: ids as hex strings, 64-bit integers (times, intValue) as strings or numbers;
  https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding. The collector's file exporter writes
  one `TracesData` per line: https://opentelemetry.io/docs/specs/otel/protocol/file-exporter/
- `gen_ai.operation.name`: chat, text_completion and generate_content are model calls; embeddings a
  `cpu` stage, retrieval a `retrieval` stage, execute_tool a `tool` stage; invoke_agent, create_agent and
  invoke_workflow group others. Token counts: `gen_ai.usage.input_tokens` and `output_tokens` (before
  them `gen_ai.usage.prompt_tokens` and `completion_tokens`).
  https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/ and the attribute registry,
  https://opentelemetry.io/docs/specs/semconv/attributes-registry/gen-ai/ (semantic-conventions v1.41;
  the conventions have since moved to github.com/open-telemetry/semantic-conventions-genai).
- `openinference.span.kind` (LLM, EMBEDDING, RETRIEVER, RERANKER, TOOL; CHAIN and AGENT group others) and
  `llm.token_count.prompt` / `completion`:
  https://github.com/Arize-ai/openinference/blob/main/spec/semantic_conventions.md
"""

from __future__ import annotations

from typing import Any

from tokenpath.application.spec import StageKind
from tokenpath.application.traces.document import field, whole_number
from tokenpath.application.traces.spans import Span, Trace, kind_by_name
from tokenpath.config.errors import UserError, quoted

OPERATIONS: dict[str, StageKind | None] = {
    "chat": "model", "text_completion": "model", "generate_content": "model", "embeddings": "cpu",
    "retrieval": "retrieval", "execute_tool": "tool", "invoke_agent": None, "create_agent": None,
    "invoke_workflow": None,
}
OPENINFERENCE: dict[str, StageKind | None] = {
    "LLM": "model", "EMBEDDING": "cpu", "RETRIEVER": "retrieval", "RERANKER": "rerank", "TOOL": "tool",
}
TOKENS = {"input": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"),
          "output": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")}
MODEL_HINT = ("gen_ai.operation.name chat, text_completion or generate_content, or openinference.span.kind LLM")


def read_traces(documents: list[Any], source: str) -> list[Trace]:
    """Every trace in the documents (each a `TracesData`), its spans in file order, by trace id."""
    spans: dict[str, list[Span]] = {}
    for line, document in enumerate(documents, 1):
        at = f"{source}: line {line}" if len(documents) > 1 else source
        if not isinstance(document, dict) or "resourceSpans" not in document:
            raise UserError(f"{at}: not an OTLP traces document (no resourceSpans); give OTLP JSON as an OTLP/HTTP "
                            "exporter or the collector's file exporter writes it")
        for r, resource in enumerate(_list(document, "resourceSpans", at)):
            where = f"{at}: resourceSpans[{r}]"
            resource = _table(resource, where)
            scopes = "scopeSpans" if "scopeSpans" in resource else "instrumentationLibrarySpans"
            for s, scope in enumerate(_list(resource, scopes, where)):
                where_scope = f"{where}.{scopes}[{s}]"
                for k, raw in enumerate(_list(_table(scope, where_scope), "spans", where_scope)):
                    trace_id, span = _span(_table(raw, f"{where_scope}.spans[{k}]"), f"{where_scope}.spans[{k}]")
                    spans.setdefault(trace_id, []).append(span)
    if not spans:
        raise UserError(f"{source}: no spans; export a trace with its spans")
    return [Trace(trace_id, found) for trace_id, found in spans.items()]


def _span(raw: dict, where: str) -> tuple[str, Span]:
    trace_id = field(raw, "traceId", str, where, "the trace's id (hex)")
    span_id = field(raw, "spanId", str, where, "the span's id (hex)")
    name = field(raw, "name", str, where, "a name", required=False) or ""
    where = f"{where} ({quoted(name)})"
    parent = field(raw, "parentSpanId", str, where, "the parent span's id (hex) or empty", required=False) or None
    start_ns = whole_number(raw.get("startTimeUnixNano"), where, "startTimeUnixNano")
    end_ns = whole_number(raw.get("endTimeUnixNano"), where, "endTimeUnixNano")
    attributes = _attributes(raw.get("attributes"), where)
    kind = _kind(attributes, name)
    tokens = {which: _tokens(attributes, keys, where) for which, keys in TOKENS.items()}
    return trace_id, Span(span_id, parent, name, start_ns, end_ns, kind, tokens["input"], tokens["output"])


def _kind(attributes: dict[str, Any], name: str) -> StageKind | None:
    operation = attributes.get("gen_ai.operation.name")
    if isinstance(operation, str) and operation in OPERATIONS:
        return OPERATIONS[operation]
    span_kind = attributes.get("openinference.span.kind")
    if isinstance(span_kind, str) and span_kind.upper() in OPENINFERENCE:
        return OPENINFERENCE[span_kind.upper()]
    return kind_by_name(name)


def _tokens(attributes: dict[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for key in keys:
        if attributes.get(key) is not None:
            return whole_number(attributes[key], where, key)
    return None


def _attributes(raw: Any, where: str) -> dict[str, Any]:
    """An OTLP attribute list ([{key, value: {stringValue|intValue|doubleValue|boolValue|...}}]) as a dict
    of its scalar values; arrays, key-value lists and bytes are kept as None (no key here reads them)."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise UserError(f"{where}: attributes is {quoted(raw)}; it must be a list of {{key, value}}")
    found: dict[str, Any] = {}
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise UserError(f"{where}: the attribute {quoted(item)} has no key; each is {{key, value}}")
        value = item.get("value")
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{where}: attribute {quoted(item['key'])}'s value is {quoted(value)}; it must be a "
                            "typed value such as {\"stringValue\": ...} or {\"intValue\": ...}")
        value = value or {}
        found[item["key"]] = next((value[typed] for typed in ("stringValue", "intValue", "doubleValue", "boolValue")
                                   if typed in value), None)
    return found


def _list(table: dict, key: str, where: str) -> list:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise UserError(f"{where}: {key} is {quoted(value)}; it must be a list")
    return value


def _table(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise UserError(f"{where} is {quoted(value)}; it must be an object")
    return value
