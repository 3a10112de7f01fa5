"""Per-request results: one row per request, simulated or measured, in the same columns.

Times are seconds (float64) from the run's start, durations are seconds, and every duration is
computed from the run's integer nanoseconds exactly as the summary computes it, so the mean of a
column over the measured requests (`ok` and not `warmup`) is the summary's mean.

A column a run does not have is null: a measured run has no attribution, no engine times and no
replica, and the continuity metrics (stalls after the first visible text, their total, Andes' QoE)
where the run has token times.

Parquet files carry the run's summary and scenario lines in their metadata, so `tokenpath report
RESULTS.parquet` rebuilds the whole report from the file alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.sim.run import Run
from tokenpath.sim.summary import DELIVERY_DETAIL, continuity_per_request

SCHEMA = "tokenpath.requests/1"
FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}
# Metadata keys of a Parquet results file.
META_SCHEMA, META_SUMMARY, META_SCENARIO = b"tokenpath.schema", b"tokenpath.summary", b"tokenpath.scenario"

# The columns, in order, and what each is (docs/report.md lists them for users).
COLUMNS = {
    "request": "the request's index in the workload",
    "ok": "completed (false: failed, measured runs only)",
    "warmup": "one of the first workload.warmup_requests, left out of the summary",
    "replica": "the engine that made its last token (simulated runs)",
    "arrival_s": "when the workload meant to send it",
    "send_s": "when it was sent (with an application: by the user, before its stages)",
    "model_call_s": "when the model call (an agent's last) was sent: send_s, or later by the application before it",
    "prefill_start_s": "when its first engine step began (simulated runs)",
    "first_token_s": "when the first event carrying a token reached the client",
    "first_visible_s": "when the first visible character reached the client",
    "engine_done_s": "when the step that made its last token ended (simulated runs)",
    "last_token_s": "when its last token reached the client: last_byte_s, less an application's stages after the model",
    "last_byte_s": "when its last byte reached the client",
    "input_tokens": "prompt tokens",
    "output_tokens": "output tokens",
    "ttft_s": "time to first token",
    "ttfv_s": "time to first visible character",
    "tpot_s": "(last token - first token) / (output tokens - 1), at the client; null for one token",
    "e2e_s": "sent -> last byte",
    "queue_s": "attribution: waiting (E2E less the other layers)",
    "compute_s": "attribution: engine compute of the steps it took part in",
    "traffic_s": "attribution: fabric traffic of those steps",
    "delivery_s": "attribution: upload, host time blocking its steps, and the last mile",
    "network_s": "of delivery: the client's network, both ways (simulated runs)",
    "frontend_queue_s": "of delivery: waiting for the front end's busy processes (simulated runs)",
    "frontend_work_s": "of delivery: the front end's work on the request and its last tokens (simulated runs)",
    "engine_host_s": "of delivery: the engine's host time (the ids' copy, detokenizing there; simulated runs)",
    "application_s": "attribution: an application's stages on the critical path (simulated runs with one)",
    "application.STAGE_s": "of application: that stage's share, one column per stage (simulated runs with one)",
    "preemptions": "how often it lost its KV cache and was recomputed (simulated runs)",
    "stalls": "gaps over the stall threshold after the first visible text (continuity.py)",
    "stall_s": "their summed length",
    "qoe": "Andes' QoE: delivered text against a reader's expected timeline, 1 when never behind",
}


def request_columns(run: Run, warmup_requests: int = 0,
                    request_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The per-request table of a run as named columns: a value the run lacks is NaN (float columns)
    or -1 (replica, preemptions, stalls), both written as null."""
    n = len(run)
    ok = run.completed
    seconds = lambda ns: np.asarray(ns, dtype=np.float64) / 1e9  # noqa: E731  as summary.stats_s does
    missing = np.full(n, np.nan)
    sent_s = seconds(run.sent_ns)

    def at(offset_ns: np.ndarray | None) -> np.ndarray:
        """A time relative to the send as a time from the run's start; NaN for failed requests."""
        if offset_ns is None:
            return missing
        return np.where(ok, seconds(run.sent_ns + offset_ns), np.nan)

    def duration(ns: np.ndarray | None) -> np.ndarray:
        return missing if ns is None else np.where(ok, seconds(ns), np.nan)

    tpot = np.where(ok, run.tpot_ns() / 1e9, np.nan)
    absolute = lambda ns: missing if ns is None else np.where((ns >= 0) & ok, seconds(ns), np.nan)  # noqa: E731
    columns: dict[str, np.ndarray] = {
        "request": np.asarray(_request_ids(run) if request_ids is None else request_ids, np.int64),
        "ok": ok,
        "warmup": np.arange(n) < warmup_requests,
        "replica": np.full(n, -1, np.int64) if run.replica is None else np.asarray(run.replica, np.int64),
        "arrival_s": seconds(run.scheduled_ns),
        "send_s": sent_s,
        "model_call_s": sent_s if run.model_sent_ns is None else seconds(run.model_sent_ns),
        "prefill_start_s": absolute(run.prefill_start_ns),
        "first_token_s": at(run.ttft_ns),
        "first_visible_s": at(run.ttfv_ns),
        "engine_done_s": absolute(run.engine_done_ns),
        "last_token_s": at(run.stream_ns()),
        "last_byte_s": at(run.e2e_ns),
        "input_tokens": np.asarray(run.input_tokens, np.int64),
        "output_tokens": np.asarray(run.output_tokens, np.int64),
        "ttft_s": duration(run.ttft_ns),
        "ttfv_s": duration(run.ttfv_ns),
        "tpot_s": tpot,
        "e2e_s": duration(run.e2e_ns),
        "queue_s": duration(run.queue_ns),
        "compute_s": duration(run.compute_ns),
        "traffic_s": duration(run.traffic_ns),
        "delivery_s": duration(run.delivery_ns),
        **{f"{part}_s": duration(getattr(run, f"{part}_ns")) for part in DELIVERY_DETAIL},
        "application_s": duration(run.application_ns),
        **{f"application.{stage}_s": duration(ns) for stage, ns in (run.application_detail_ns or {}).items()},
        "preemptions": np.full(n, -1, np.int64) if run.preemptions is None else np.asarray(run.preemptions, np.int64),
    }
    flow = continuity_per_request(run)
    columns["stalls"] = np.full(n, -1, np.int64) if flow is None else np.where(ok, flow["stalls"], -1)
    columns["stall_s"] = missing if flow is None else duration(flow["stall_ns"])
    columns["qoe"] = missing if flow is None else np.where(ok, flow["qoe"], np.nan)
    return columns


def _request_ids(run: Run) -> np.ndarray:
    """Each row's request's index in the workload: its row, unless an application put the rows in the order
    of the model calls."""
    return np.arange(len(run), dtype=np.int64) if run.request_index is None else run.request_index


# Integer columns where -1 means "this run does not have it": written as null.
_NULL_IF_NEGATIVE = ("replica", "preemptions", "stalls")


def to_arrow(columns: Mapping[str, np.ndarray], summary: dict[str, Any] | None = None,
             scenario_lines: list[tuple[str, str]] | None = None) -> Any:
    """A pyarrow Table of the columns (NaN and -1 placeholders as nulls), with the summary and the
    scenario lines in its metadata."""
    import pyarrow as pa

    arrays = {}
    for name, values in columns.items():
        values = np.asarray(values)
        if name in _NULL_IF_NEGATIVE:
            arrays[name] = pa.array(values, mask=values < 0)
        elif values.dtype.kind == "f":
            arrays[name] = pa.array(values, mask=np.isnan(values))
        else:
            arrays[name] = pa.array(values)
    metadata = {META_SCHEMA: SCHEMA.encode()}
    if summary is not None:
        metadata[META_SUMMARY] = json.dumps(summary).encode()
    if scenario_lines is not None:
        metadata[META_SCENARIO] = json.dumps(scenario_lines).encode()
    return pa.table(arrays).replace_schema_metadata(metadata)


def check_results_path(path: str, flag: str = "--results") -> str:
    """The format a results path asks for by its extension (Parquet unless .csv or .jsonl); checked
    writable before any work."""
    if path == "-":
        raise UserError(f"{flag} -: per-request results are written to a file (Parquet, CSV or JSONL, by its "
                        "extension), not to stdout; give a path")
    suffix = Path(path).suffix.lower()
    if suffix and suffix not in FORMATS:
        raise UserError(f"{flag} {files.shown(path)}: unknown extension {suffix!r}; use .parquet (the default), "
                        ".csv or .jsonl")
    files.check_writable(path, flag)
    return FORMATS.get(suffix, "parquet")


def write_results(table: Any, path: str, flag: str = "--results") -> None:
    """Write a pyarrow table of results as Parquet, CSV or JSONL (by extension)."""
    kind = FORMATS.get(Path(path).suffix.lower(), "parquet")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
        elif kind == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, path)
        else:
            import orjson

            with open(path, "wb") as out:
                for row in table.to_pylist():
                    out.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    except OSError as error:
        raise UserError(f"{flag} {files.shown(path)}: cannot write it ({error.strerror}); "
                        "choose another path") from None


def read_results_table(path: str) -> tuple[Any, dict[str, Any] | None, list[tuple[str, str]] | None]:
    """(pandas DataFrame, summary or None, scenario lines or None) of a per-request results file."""
    import pandas as pd

    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path), None, None
        if suffix == ".jsonl":
            return pd.read_json(path, lines=True), None, None
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except FileNotFoundError:
        raise UserError(f"{files.shown(path)}: no such file") from None
    except Exception as error:  # pyarrow and pandas raise many kinds for a damaged file
        raise UserError(f"{files.shown(path)}: cannot read it as a results table ({error})") from None
    meta = table.schema.metadata or {}
    summary = json.loads(meta[META_SUMMARY]) if META_SUMMARY in meta else None
    lines = [tuple(line) for line in json.loads(meta[META_SCENARIO])] if META_SCENARIO in meta else None
    return table.to_pandas(), summary, lines
