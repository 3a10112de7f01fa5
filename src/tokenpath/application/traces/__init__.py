"""An application's stages imported from its traces: OpenTelemetry spans in OTLP JSON (the GenAI semantic
conventions mark the model call, embeddings, retrievals and tool calls) or LangSmith run trees.

Each format is read into spans (otlp.py, langsmith.py); spans.py checks each trace as one request (one
root, its model calls one after another: several are an agent loop) and picks the spans that are stages;
stages.py lays them out on the trace's clock (`after` from the timing, the gaps on the critical path as
`cpu` stages, the spans between two calls as the loop's rounds); table.py makes the table of one or
several traces and writes its TOML. docs/application.md describes the mapping and its errors.
"""

from __future__ import annotations

from typing import Any

from tokenpath.application.traces import document, langsmith, otlp
from tokenpath.application.traces.spans import request_of
from tokenpath.application.traces.stages import stages_of
from tokenpath.application.traces.table import Imported, application_of, to_toml
from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted

__all__ = ["FORMATS", "Imported", "import_documents", "import_file", "to_toml"]

FORMATS = ("auto", *document.FORMATS)
_READERS = {"otlp": (otlp.read_traces, otlp.MODEL_HINT), "langsmith": (langsmith.read_traces, langsmith.MODEL_HINT)}


def import_file(path: str, trace_format: str = "auto", trace_id: str | None = None) -> tuple[Imported, str]:
    """The application table of the traces in `path` (of `trace_id` alone where given), and the format
    they were read as."""
    if trace_format not in FORMATS:
        raise UserError(f"--format: unknown {quoted(trace_format)}; use one of {', '.join(FORMATS)}")
    return import_documents(document.read_documents(path), files.shown(path), trace_format, trace_id)


def import_documents(documents: list[Any], source: str, trace_format: str = "auto",
                     trace_id: str | None = None) -> tuple[Imported, str]:
    """`import_file` on a file's JSON documents; errors name `source`."""
    if trace_format == "auto":
        trace_format = document.detect(documents, source)
    read, model_hint = _READERS[trace_format]
    traces = read(documents, source)
    if trace_id is not None:
        chosen = [trace for trace in traces if trace.trace_id == trace_id]
        if not chosen:
            raise UserError(f"--trace: no trace {quoted(trace_id)} in {source}; its traces: "
                            f"{', '.join(quoted(trace.trace_id) for trace in traces[:5])}"
                            f"{', ...' if len(traces) > 5 else ''}")
        traces = chosen
    requests = [request_of(trace, source, model_hint) for trace in traces]
    stages = [stages_of(request, f"{source}: trace {quoted(request.trace_id)}") for request in requests]
    return application_of(requests, stages, source), trace_format
