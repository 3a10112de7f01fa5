"""The results file of a bench run, and the measured `Run` and summary rebuilt from it.

A results file is JSONL: a header line (what was run, against what, with which SLOs), then one line
per finished request in the order they finished. A run cut short leaves a valid file: every line is
a whole request, and a torn last line (a crash mid-write) is skipped.

Token arrival times: the tokens of one arrival (events read together, or one event carrying several
tokens) share the gap since the previous arrival evenly, so ITL is per token (SGLang's convention);
the tokens of the first arrival all arrive with it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenpath.errors import UserError
from tokenpath.run import Run
from tokenpath.summary import stats_s, summarize

RESULTS_SCHEMA = "tokenpath.bench/1"


def read_results(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, request rows sorted by index) of a results file; a `UserError` if it is not one."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file; give the --results file of a `tokenpath bench` run") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror})") from None
    lines = data.split(b"\n")
    try:
        header = orjson.loads(lines[0]) if lines and lines[0].strip() else None
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("schema") != RESULTS_SCHEMA:
        raise UserError(f"{path}: not a tokenpath bench results file (its first line is not a {RESULTS_SCHEMA} header)")
    rows: dict[int, dict[str, Any]] = {}
    numbered = [(number, line) for number, line in enumerate(lines[1:], start=2) if line.strip()]
    for position, (number, line) in enumerate(numbered):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            if position == len(numbered) - 1:
                continue  # the last line, torn by a crash mid-write
            raise UserError(f"{path}:{number}: not a JSON line; the file is damaged") from None
        if not isinstance(row, dict) or "i" not in row:
            raise UserError(f"{path}:{number}: not a request row (no 'i')")
        rows[int(row["i"])] = row
    return header, [rows[i] for i in sorted(rows)]


def token_times(arrival_ns: np.ndarray, arrival_tokens: np.ndarray) -> np.ndarray:
    """Per-token arrival times: each arrival's tokens split the gap since the previous arrival evenly."""
    arrival_ns = np.asarray(arrival_ns, dtype=np.int64)
    counts = np.asarray(arrival_tokens, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    previous = np.concatenate((arrival_ns[:1], arrival_ns[:-1]))
    gap = arrival_ns - previous
    owner = np.repeat(np.arange(len(counts)), counts)
    position = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + 1
    return previous[owner] + gap[owner] * position // counts[owner]


def build_run(rows: list[dict[str, Any]]) -> Run:
    """The measured run: one row per recorded request; failed ones carry no tokens."""
    n = len(rows)
    failed = np.array([not row["ok"] for row in rows], dtype=bool)
    scheduled = np.array([row["scheduled_ns"] for row in rows], dtype=np.int64)
    sent = np.array([row["sent_ns"] for row in rows], dtype=np.int64)
    inputs = np.array([row["input_tokens"] for row in rows], dtype=np.int64)
    outputs = np.zeros(n, np.int64)
    ttft = np.zeros(n, np.int64)
    ttfv = np.zeros(n, np.int64)
    e2e = np.zeros(n, np.int64)
    pieces = []
    for k, row in enumerate(rows):
        if failed[k]:
            continue
        times = token_times(row["arrival_ns"], row["arrival_tokens"])
        pieces.append(times)
        outputs[k] = len(times)
        ttft[k] = row["first_token_ns"] - row["sent_ns"]
        e2e[k] = row["end_ns"] - row["sent_ns"]
        visible = row["first_visible_ns"]
        # A reply with no visible character at all shows nothing until it ends.
        ttfv[k] = (visible if visible is not None else row["end_ns"]) - row["sent_ns"]
    offsets = np.concatenate(([0], np.cumsum(outputs))).astype(np.int64)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    return Run(
        source="bench", scheduled_ns=scheduled, sent_ns=sent, input_tokens=inputs, output_tokens=outputs,
        ttft_ns=ttft, ttfv_ns=ttfv, e2e_ns=e2e, token_client_ns=tokens, token_offsets=offsets, failed=failed,
    )


def bench_summary(header: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The shared result schema for a measured run, plus a `bench` block of what only a measurement has."""
    run = build_run(rows)
    slo = header.get("slo") or {}
    summary = summarize(run, header["scenario"]["name"], header["scenario"]["fingerprint"], slo)
    summary["bench"] = _bench_block(header, rows, run)
    return summary


def _bench_block(header: dict[str, Any], rows: list[dict[str, Any]], run: Run) -> dict[str, Any]:
    ok = [row for row in rows if row["ok"]]
    reasons = Counter(row["error"] for row in rows if not row["ok"])
    reasoning = [row for row in ok if row.get("reasoning_tokens")]
    thinking_ns = np.array(
        [(row["first_content_ns"] if row.get("first_content_ns") is not None else row["end_ns"]) - row["first_token_ns"]
         for row in reasoning], dtype=np.int64,
    )
    server_prompt = [row["prompt_tokens_server"] for row in ok if row.get("prompt_tokens_server") is not None]
    planned = int(header.get("planned", len(rows)))
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
        "client_wait_s": stats_s(run.sent_ns - run.scheduled_ns),
        "output_tokens_from": dict(sorted(Counter(row["tokens_from"] for row in ok).items())),
        "server_prompt_tokens_mean": float(np.mean(server_prompt)) if server_prompt else None,
        "reasoning": {
            "requests": len(reasoning),
            "tokens_mean": float(np.mean([row["reasoning_tokens"] for row in reasoning])) if reasoning else 0.0,
            "time_s": stats_s(thinking_ns),
        },
    }


def failures(rows: list[dict[str, Any]], limit: int = 5) -> list[str]:
    """A few failed requests as lines for people: index, reason, detail."""
    return [f"request {row['i']}: {row['error']}: {row['detail']}" for row in rows if not row["ok"]][:limit]
