"""The results file of a bench run, and the measured `Run` and summary rebuilt from it.

A results file is JSONL: a header line (what was run, against what, with which SLOs), then one line
per finished request in the order they finished, and one line per worker as it ends, of its own CPU
and event loop lag (`{"client": ..., "worker": w}`, bench/client.py); `read_results` gathers those
into the header's "client" list. A run cut short leaves a valid file: every line is
a whole request, and a torn last line (a crash mid-write: no newline after it) is skipped with a
warning. Any other damaged line is a one-line error naming the file, the line and the field.

Token arrival times: each token arrives with the event that carried it (an event carrying several
tokens gives them all its time), so ITL, the gaps between successive arrivals, has one sample per
event after the first, as vLLM's `bench serve` counts it. Events the client read together share the
read's time and each is still an arrival, one nanosecond after the one before (token_times): vLLM's client
stamps each message it parses (`time.perf_counter()`), so its ITL has a near-zero sample for each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

from tokenpath.bench.client import client_block
from tokenpath.bench.stream import MAX_USAGE_TOKENS
from tokenpath.config.errors import UserError, check_version, same_family
from tokenpath.sim.continuity import ContinuitySpec, spec_of
from tokenpath.sim.run import Run
from tokenpath.sim.summary import continuity_per_request, stats_s, summarize

RESULTS_SCHEMA = "tokenpath.bench/1"
SLO_KEYS = ("ttft", "ttfv", "tpot", "e2e")
# Bounds a results row is checked against, so a damaged file is an error rather than an overflow or
# a huge allocation: times within 2^62 ns (146 years) of the run's start; at most MAX_USAGE_TOKENS (2^24,
# 16.8M) tokens in one request, beyond the longest context any model has (10M), as bench records them.
_MAX_ABS_NS = 2**62


def read_results(path: str | Path,
                 warn: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, request rows sorted by index) of a results file; a `UserError` if it is not one.

    A torn last line is skipped, and `warn` (when given) is told so.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file; give the --results file of a `tokenpath bench` run") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror or error})") from None
    lines = data.split(b"\n")
    try:
        header = orjson.loads(lines[0]) if lines and lines[0].strip() else None
    except orjson.JSONDecodeError:
        header = None
    if isinstance(header, dict):
        check_version(header.get("schema"), RESULTS_SCHEMA, str(path), "bench results",
                      "run `tokenpath bench` again with this version")
    if not isinstance(header, dict) or header.get("schema") != RESULTS_SCHEMA:
        raise UserError(f"{path}: not a tokenpath bench results file (its first line is not a {RESULTS_SCHEMA} header)")
    _check_header(header, f"{path}:1")
    rows: dict[int, dict[str, Any]] = {}
    line_of: dict[int, int] = {}
    header["client"] = []
    torn = not data.endswith(b"\n")  # a crash mid-write leaves the last line without its newline
    numbered = [(number, line) for number, line in enumerate(lines[1:], start=2) if line.strip()]
    for position, (number, line) in enumerate(numbered):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            if torn and position == len(numbered) - 1 and number == len(lines):
                if warn is not None:
                    warn(f"{path}:{number}: skipped a torn last line (the run was cut off while writing it)")
                continue
            raise UserError(f"{path}:{number}: not a JSON line; the file is damaged") from None
        if isinstance(row, dict) and "client" in row and "i" not in row:
            _check_client(row, f"{path}:{number}")
            header["client"].append(row)
            continue
        _check_row(row, f"{path}:{number}")
        i = row["i"]
        if i in rows:
            raise UserError(f"{path}:{number}: request {i} is already on line {line_of[i]}; the file is damaged")
        rows[i], line_of[i] = row, number
    return header, [rows[i] for i in sorted(rows)]


def is_results_header(document: Any) -> bool:
    """Whether a file's first line is the header of a results file, of this version or another (which
    `read_results` refuses, naming both versions)."""
    return isinstance(document, dict) and same_family(document.get("schema"), RESULTS_SCHEMA)


def _short(value: Any) -> str:
    """A value as JSON, cut to about 100 characters, for an error line."""
    text = orjson.dumps(value).decode() if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_ns(value: Any) -> bool:
    return type(value) is int and -_MAX_ABS_NS < value < _MAX_ABS_NS


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_USAGE_TOKENS


def _field(document: dict[str, Any], name: str, check: Callable[[Any], bool], what: str, where: str) -> Any:
    if name not in document:
        raise UserError(f"{where}: no field '{name}'; the file is damaged")
    value = document[name]
    if not check(value):
        raise UserError(f"{where}: '{name}' must be {what}, got {_short(value)}; the file is damaged")
    return value


def _check_header(header: dict[str, Any], where: str) -> None:
    scenario = _field(header, "scenario", lambda v: isinstance(v, dict), "an object", where)
    _field(scenario, "name", lambda v: isinstance(v, str), "a string", f"{where}: scenario")
    _field(scenario, "fingerprint", lambda v: isinstance(v, str), "a string", f"{where}: scenario")
    if "table" in scenario:
        _field(scenario, "table", lambda v: isinstance(v, dict), "an object", f"{where}: scenario")
        try:
            continuity_spec(header)
        except (ValidationError, ValueError) as error:
            raise UserError(f"{where}: scenario.table.continuity: {str(error).splitlines()[-1].strip()}; the file "
                            "is damaged") from None
    if "planned" in header:
        _field(header, "planned", lambda v: _is_int(v) and 0 <= v < _MAX_ABS_NS, "a count >= 0", where)
    slo = header.get("slo")
    if slo is not None:
        _field(header, "slo", lambda v: isinstance(v, dict), "an object", where)
        for key, limit in slo.items():
            if key not in SLO_KEYS or not (
                    limit is None or (isinstance(limit, (int, float)) and not isinstance(limit, bool))):
                raise UserError(f"{where}: slo {_short(key)} = {_short(limit)} is not an SLO "
                                f"({', '.join(SLO_KEYS)}: seconds or null); the file is damaged")


def _is_seconds(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value < _MAX_ABS_NS / 1e9


def _check_client(line: dict[str, Any], where: str) -> None:
    """A worker's line of its own CPU and loop lag has what `client_block` reads, with the right types."""
    _field(line, "worker", lambda v: _is_int(v) and 0 <= v < _MAX_ABS_NS, "a worker index >= 0", where)
    measured = _field(line, "client", lambda v: isinstance(v, dict), "an object", where)
    for name in ("cpu_s", "wall_s"):
        _field(measured, name, _is_seconds, "a number of seconds >= 0", f"{where}: client")
    if measured.get("cpu_wait_s") is not None:
        _field(measured, "cpu_wait_s", _is_seconds, "a number of seconds >= 0, or null", f"{where}: client")
    _field(measured, "lag_us", lambda v: isinstance(v, list) and all(map(_is_count_us, v)),
           "a list of microseconds >= 0", f"{where}: client")


def _is_count_us(value: Any) -> bool:
    return type(value) is int and 0 <= value < _MAX_ABS_NS // 1000


def _check_row(row: Any, where: str) -> None:
    """A request row has what the summary reads, with the right types."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: not a request row (a JSON object with 'i'); the file is damaged")
    _field(row, "i", lambda v: _is_int(v) and 0 <= v < _MAX_ABS_NS, "a request index >= 0", where)
    for name in ("scheduled_ns", "sent_ns"):
        _field(row, name, _is_ns, "an integer (ns)", where)
    _field(row, "input_tokens", _is_count, f"a count from 0 to {MAX_USAGE_TOKENS}", where)
    ok = _field(row, "ok", lambda v: isinstance(v, bool), "true or false", where)
    for name in ("reasoning_tokens", "prompt_tokens_server"):
        if row.get(name) is not None:
            _field(row, name, _is_count, f"a count from 0 to {MAX_USAGE_TOKENS}, or null", where)
    if not ok:
        _field(row, "error", lambda v: isinstance(v, str), "a failure reason", where)
        return
    sent = row["sent_ns"]
    first, end = (_field(row, name, _is_ns, "an integer (ns)", where) for name in ("first_token_ns", "end_ns"))
    if first < sent:
        raise UserError(f"{where}: 'first_token_ns' = {first} is before 'sent_ns' = {sent} (a token cannot arrive "
                        "before its request is sent); the file is damaged")
    if end < first:
        raise UserError(f"{where}: 'end_ns' = {end} is before 'first_token_ns' = {first} (a request cannot end "
                        "before its first token); the file is damaged")
    for name in ("first_visible_ns", "first_content_ns"):
        if row.get(name) is not None:
            _field(row, name, _is_ns, "an integer (ns) or null", where)
    _field(row, "tokens_from", lambda v: isinstance(v, str), "a string", where)
    times = _field(row, "arrival_ns", lambda v: isinstance(v, list) and all(map(_is_ns, v)),
                   "a list of integers (ns)", where)
    counts = _field(row, "arrival_tokens",
                    lambda v: isinstance(v, list) and all(map(_is_count, v)) and sum(v) <= MAX_USAGE_TOKENS,
                    f"a list of counts adding up to at most {MAX_USAGE_TOKENS}", where)
    if len(times) != len(counts):
        raise UserError(f"{where}: 'arrival_ns' has {len(times)} entries but 'arrival_tokens' {len(counts)}; "
                        "the file is damaged")


def token_times(arrival_ns: np.ndarray, arrival_tokens: np.ndarray) -> np.ndarray:
    """Per-token arrival times: each token at the time of the arrival that carried it, an arrival that
    shares its read's time with the ones before it 1 ns after the last of them, so that it is an arrival
    of its own (a gap of about 0, as vLLM's client times each message) and not merged into one."""
    times = np.asarray(arrival_ns, dtype=np.int64)
    if len(times) > 1:
        repeat = np.concatenate(([False], np.diff(times) == 0))
        run_start = np.maximum.accumulate(np.where(repeat, 0, np.arange(len(times))))
        times = times + (np.arange(len(times)) - run_start)
    return np.repeat(times, np.asarray(arrival_tokens, dtype=np.int64))


def continuity_spec(header: dict[str, Any] | None) -> ContinuitySpec:
    """The stall threshold and reader of the scenario the run was made from (its `[continuity]`)."""
    table = (header or {}).get("scenario", {}).get("table", {})
    return spec_of(table.get("continuity") if isinstance(table, dict) else None)


def build_run(rows: list[dict[str, Any]], header: dict[str, Any] | None = None) -> Run:
    """The measured run: one row per recorded request; failed ones carry no tokens. Its continuity is
    judged by the header's scenario's `[continuity]` settings (the defaults without a header), per
    request, once."""
    n = len(rows)
    failed = np.array([not row["ok"] for row in rows], dtype=bool)
    scheduled = np.array([row["scheduled_ns"] for row in rows], dtype=np.int64)
    sent = np.array([row["sent_ns"] for row in rows], dtype=np.int64)
    inputs = np.array([row["input_tokens"] for row in rows], dtype=np.int64)
    outputs = np.zeros(n, np.int64)
    ttft = np.zeros(n, np.int64)
    ttfv = np.zeros(n, np.int64)
    e2e = np.zeros(n, np.int64)
    last = np.zeros(n, np.int64)
    pieces = []
    for k, row in enumerate(rows):
        if failed[k]:
            continue
        times = token_times(row["arrival_ns"], row["arrival_tokens"])
        pieces.append(times)
        outputs[k] = len(times)
        ttft[k] = row["first_token_ns"] - row["sent_ns"]
        e2e[k] = row["end_ns"] - row["sent_ns"]
        last[k] = (times[-1] if len(times) else row["end_ns"]) - row["sent_ns"]
        visible = row.get("first_visible_ns")
        # A reply with no visible character at all shows nothing until it ends.
        ttfv[k] = (visible if visible is not None else row["end_ns"]) - row["sent_ns"]
    offsets = np.concatenate(([0], np.cumsum(outputs))).astype(np.int64)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    run = Run(
        source="bench", scheduled_ns=scheduled, sent_ns=sent, input_tokens=inputs, output_tokens=outputs,
        ttft_ns=ttft, ttfv_ns=ttfv, e2e_ns=e2e, token_client_ns=tokens, token_offsets=offsets, failed=failed,
        last_token_ns=last, continuity=continuity_spec(header),
    )
    # Each request's stalls and QoE, judged once here for the summary and the per-request rows alike.
    flow = continuity_per_request(run)
    return replace(run, stalls=flow["stalls"], stall_ns=flow["stall_ns"], qoe=flow["qoe"])


def warmup_rows(header: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """How many of the (index-sorted) rows are the warm-up: those of the first `warmup_requests`
    indices recorded, leaving at least one row."""
    workload = header["scenario"].get("table", {}).get("workload", {})
    warmup = workload.get("warmup_requests", 0) if isinstance(workload, dict) else 0
    warmup = warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else 0
    return min(sum(1 for row in rows if row["i"] < warmup), max(len(rows) - 1, 0))


def bench_summary(header: dict[str, Any], rows: list[dict[str, Any]], run: Run | None = None) -> dict[str, Any]:
    """The shared result schema for a measured run, plus a `bench` block of what only a measurement has;
    `run`: the rows' build_run, where the caller has it already."""
    from tokenpath.diagnose.overload import load_of

    run = build_run(rows, header) if run is None else run
    slo = header.get("slo") or {}
    warmup = warmup_rows(header, rows)
    summary = summarize(run, header["scenario"]["name"], header["scenario"]["fingerprint"], slo,
                        warmup_requests=warmup)
    # Offered against served over the measured requests, as a simulation's summary has it.
    measured = run.after(warmup)
    summary["load"] = load_of(measured.sent_ns, measured.ttft_ns, measured.e2e_ns, measured.completed).document()
    summary["bench"] = _bench_block(header, rows, warmup, measured)
    summary["bench"]["client"] = client_block(header.get("client") or [], summary["latency_s"],
                                              header.get("timestamps"))
    return summary


def _bench_block(header: dict[str, Any], rows: list[dict[str, Any]], warmup: int, measured: Run) -> dict[str, Any]:
    """What only a measurement has: every request recorded or not (the warm-up too), and the client's
    waits, the stream's events and the token counts' origins over the `measured` requests (the rows
    after the first `warmup`), as the summary's metrics are."""
    reasons = Counter(row["error"] for row in rows if not row["ok"])
    ok = [row for row in rows[warmup:] if row["ok"]]
    reasoning = [row for row in ok if row.get("reasoning_tokens")]
    thinking_ns = np.array(
        [(row["first_content_ns"] if row.get("first_content_ns") is not None else row["end_ns"]) - row["first_token_ns"]
         for row in reasoning], dtype=np.int64,
    )
    server_prompt = [row["prompt_tokens_server"] for row in ok if row.get("prompt_tokens_server") is not None]
    planned = int(header.get("planned", len(rows)))
    # Events the client read in one piece with the one before: they share its timestamp (the client was
    # behind), so their own gaps are lost and the ITL tail reads long.
    events = sum(len(row["arrival_ns"]) for row in ok)
    sharing = sum(int((np.diff(np.asarray(row["arrival_ns"], np.int64)) == 0).sum()) for row in ok)
    return {
        "server": header.get("base_url"),
        "model": header.get("model"),
        "endpoint": header.get("endpoint"),
        "tokenizer": header.get("tokenizer"),
        "workers": header.get("workers"),
        "planned": planned,
        "recorded": len(rows),
        "not_sent": planned - len(rows),
        "failure_reasons": dict(sorted(reasons.items())),
        # Scheduled -> sent: the client's own queue (a concurrency cap, or a late send).
        "client_wait_s": stats_s(measured.sent_ns - measured.scheduled_ns),
        "arrivals": {"events": events, "sharing_a_read": sharing},
        "output_tokens_from": dict(sorted(Counter(row["tokens_from"] for row in ok).items())),
        # How each completed stream ended ("none": [DONE] with no finish_reason): with ignore_eos asked, one
        # not at "length" stopped before its max_tokens, counted completed as vLLM's bench serve counts it.
        "finish_reasons": dict(sorted(Counter(row.get("finish_reason") or "none" for row in ok).items())),
        "server_prompt_tokens_mean": float(np.mean(server_prompt)) if server_prompt else None,
        "reasoning": {
            "requests": len(reasoning),
            "tokens_mean": float(np.mean([row["reasoning_tokens"] for row in reasoning])) if reasoning else 0.0,
            "time_s": stats_s(thinking_ns),
        },
    }


def failures(rows: list[dict[str, Any]], limit: int = 5) -> list[str]:
    """A few failed requests as lines for people: index, reason, detail."""
    return [f"request {row['i']}: {row['error']}: {row.get('detail')}" for row in rows if not row["ok"]][:limit]
