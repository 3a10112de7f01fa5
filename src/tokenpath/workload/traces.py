"""Recorded request traces: read them as `Requests`, write `Requests` back out.

Formats:
- azure: Azure LLM inference trace CSV (Azure/AzurePublicDataset), header
  `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is a date-time such as
  `2023-11-16 18:15:46.6805900` (up to 9 fractional digits, optional `Z` or `+HH:MM`) or plain seconds.
- burstgpt: BurstGPT CSV (HPMLL/BurstGPT), columns `Timestamp` (seconds), `Request tokens`,
  `Response tokens` and others, which are ignored.
- mooncake: Mooncake JSONL (kvcache-ai/Mooncake), one object per line with `timestamp` (ms),
  `input_length` and `output_length`, and optionally `hash_ids`: the prompt's blocks of 512 tokens,
  equal ids marking equal prefixes (the trace's README), replayed as shared prefixes
  (prefixes.py); other keys are ignored.

Rows are sorted by time (stably) and arrivals are measured from the earliest row. Rows with 0 input or
0 output tokens are skipped, and their count is logged as a warning: a 0-token response marks a failed
request in BurstGPT, and a simulated request needs at least one token each way. A malformed row is a
`UserError` naming the file and its 1-based line number.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import IO

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.config.files import shown
from tokenpath.prefixes import chain
from tokenpath.workload._files import open_text
from tokenpath.workload.lengths import parse_count, shown_count
from tokenpath.workload.requests import Requests
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, MAX_TOKENS

TRACE_FORMATS = ("azure", "burstgpt", "mooncake")

_log = logging.getLogger(__name__)

# Header names of the (time, input tokens, output tokens) columns of the CSV formats.
_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
_BURSTGPT_HEADER = (
    "Timestamp", "Session ID", "Elapsed time", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type",
)
# Both read a whole field, ASCII spaces around it allowed (str.strip and float() also take Unicode ones).
_DATETIME = re.compile(r"\s*(\d{4}-\d\d-\d\d)[ T](\d\d):(\d\d):(\d\d(?:\.\d{1,9})?)\s*(Z|[+-]\d\d:?\d\d)?\s*",
                       re.ASCII)
# Times as traces write them: ASCII decimals only, so '1_000', '١٢' (Arabic-Indic digits), 'inf' and
# 'nan', which Python's float() takes, are errors.
_DECIMAL = re.compile(r"\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII)
# Real UTC offsets run from -12:00 to +14:00.
_MAX_ZONE_OFFSET_S = 14 * 3600
# The date written traces start on (the first day of the Azure 2023 trace).
_WRITE_EPOCH = dt.date(2023, 11, 16)
_TICKS_PER_S = 10**7  # Azure timestamps carry 7 fractional digits
_MOONCAKE_BLOCK_TOKENS = 512


class _RowError(Exception):
    """A problem with one row; the reader adds the file and line."""


Rows = Iterator[tuple[float, int, int]]  # (time in seconds, input tokens, output tokens)


def read_trace(path: str | os.PathLike[str], format: str, *, time_scale: float = 1.0) -> Requests:
    """The requests in the trace at `path`, sorted by time, arrivals in seconds after the earliest
    row and divided by `time_scale` (2.0 replays twice as fast)."""
    if format not in TRACE_FORMATS:
        raise UserError(f"trace format {format!r} is unknown; use one of {', '.join(TRACE_FORMATS)}")
    if not 0 < time_scale < math.inf:
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    times_s: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    hash_ids: list[list[int]] = []
    skipped = 0
    with open_text(path, f"{format} trace") as file:
        rows = _mooncake_rows(file, path) if format == "mooncake" else _csv_rows(file, format, path)
        for time_s, input_tokens, output_tokens, *ids in rows:
            if input_tokens == 0 or output_tokens == 0:
                skipped += 1
                continue
            times_s.append(time_s)
            inputs.append(input_tokens)
            outputs.append(output_tokens)
            if ids:
                hash_ids.append(ids[0])
    if skipped:
        _log.warning("%s: skipped %d of %d rows with 0 input or 0 output tokens", path, skipped, skipped + len(times_s))
    if not times_s:
        detail = f"all {skipped} rows have 0 input or 0 output tokens" if skipped else "it has no rows"
        raise UserError(f"{path}: no requests in the {format} trace ({detail}); point at a trace with requests")
    times = np.array(times_s, dtype=np.float64)
    order = np.argsort(times, kind="stable")
    times = times[order]
    arrival_s = (times - times[0]) / time_scale
    if not arrival_s[-1] <= MAX_ARRIVAL_SPAN_S:  # also catches inf
        raise UserError(_span_error(path, format, float(times[-1] - times[0]), time_scale))
    input_tokens = np.array(inputs, dtype=np.int64)[order]
    prefixes = None
    if any(hash_ids):
        ordered = [hash_ids[k] for k in order.tolist()]
        prefixes = chain(ordered, [min(len(ids) * _MOONCAKE_BLOCK_TOKENS, int(tokens))
                                   for ids, tokens in zip(ordered, input_tokens.tolist())], _MOONCAKE_BLOCK_TOKENS)
    return Requests(
        arrival_s=arrival_s,
        input_tokens=input_tokens,
        output_tokens=np.array(outputs, dtype=np.int64)[order],
        prefixes=prefixes,
    )


def _span_error(path: object, format: str, span_s: float, time_scale: float) -> str:
    """Why a trace's arrivals cannot be replayed: they span more than MAX_ARRIVAL_SPAN_S."""
    years = span_s / time_scale / (365 * 86400)
    span = f"{years:,.0f} years" if np.isfinite(years) else "more time than a float holds"
    read_as, unit_hint = ("milliseconds", "microseconds") if format == "mooncake" else ("seconds", "milliseconds")
    return (f"{shown(path)}: the {format} trace's arrivals span {span} (time_scale {time_scale:g}); at most "
            f"{MAX_ARRIVAL_SPAN_S / 86400:.0f} days are replayed. Its times are read as {read_as}: if they are "
            f"{unit_hint}, convert them or set workload.trace.time_scale = 1000")


def _csv_rows(file: IO[str], format: str, path: object) -> Rows:
    reader = csv.reader(file)
    try:
        yield from _csv_records(reader, format, path)
    except csv.Error as error:
        raise UserError(f"{path}:{reader.line_num}: not readable as CSV ({error}); fix the row") from None


def _csv_records(reader: Iterator[list[str]], format: str, path: object) -> Rows:
    columns = _CSV_COLUMNS[format]
    header = [name.strip() for name in next(reader, [])]
    missing = [name for name in columns if name not in header]
    if missing:
        raise UserError(
            f"{path}:1: header lacks {', '.join(map(repr, missing))}; the {format} format's header names the columns "
            f"{', '.join(columns)}"
        )
    time_at, input_at, output_at = (header.index(name) for name in columns)
    time_name, input_name, output_name = columns
    width = len(header)
    parse_time: Callable[[str], float] | None = None
    for row in reader:
        if len(row) != width:
            if not row:
                continue
            raise UserError(
                f"{path}:{reader.line_num}: row has {len(row)} fields, the header has {width}; fix or remove the row"
            )
        try:
            if parse_time is None:
                parse_time = _time_parser(format, time_name, row[time_at])
            yield parse_time(row[time_at]), _tokens(row[input_at], input_name), _tokens(row[output_at], output_name)
        except _RowError as error:
            raise UserError(f"{path}:{reader.line_num}: {error}") from None


def _mooncake_rows(file: IO[str], path: object) -> Rows:
    for line_number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        try:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise _RowError(f"not valid JSON ({error.msg}); write one JSON object per line") from None
            except RecursionError:
                raise _RowError("not valid JSON (nested too deep); write one flat JSON object per line") from None
            except ValueError as error:  # an integer of more digits than Python converts
                raise _RowError(f"not valid JSON ({str(error).split(';')[0]}); "
                                "write one JSON object per line") from None
            if not isinstance(record, dict):
                raise _RowError("not a JSON object; write one object per line")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in record:
                    raise _RowError(f"missing {key!r}; each line needs timestamp, input_length and output_length")
            input_tokens = _json_tokens(record["input_length"], "input_length")
            yield (
                _json_seconds(record["timestamp"], "timestamp", per_s=1000),
                input_tokens,
                _json_tokens(record["output_length"], "output_length"),
                _hash_ids(record.get("hash_ids", []), input_tokens),
            )
        except _RowError as error:
            raise UserError(f"{path}:{line_number}: {error}") from None


def _hash_ids(value: object, input_tokens: int) -> list[int]:
    """A row's hash_ids: whole numbers, at most one per 512-token block of its prompt."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _RowError(f"hash_ids {quoted(value)} is not a list of integers; "
                        "write the prompt's block ids, e.g. [0, 1, 2]")
    blocks = -(-input_tokens // _MOONCAKE_BLOCK_TOKENS)
    if len(value) > blocks:
        raise _RowError(f"hash_ids has {len(value)} ids but input_length {input_tokens} makes {blocks} blocks of "
                        f"{_MOONCAKE_BLOCK_TOKENS} tokens; drop the extra ids")
    return value


def _tokens(text: str, name: str) -> int:
    count = parse_count(text)
    if count is None:
        raise _RowError(f"{name} {quoted(text)} is not an integer; token counts are whole numbers in digits 0-9")
    return _token_range(count, name, shown_count(text))


def _json_tokens(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _RowError(f"{name} {quoted(value)} is not an integer; token counts are whole numbers")
    return _token_range(value, name, quoted(value))


def _token_range(count: int, name: str, as_written: str) -> int:
    if not 0 <= count <= MAX_TOKENS:
        raise _RowError(f"{name} {as_written} is out of range; token counts run from 0 to {MAX_TOKENS}")
    return count


def _seconds(text: str | float, name: str, per_s: int = 1) -> float:
    """A time written as a number of units, `per_s` units to the second."""
    if isinstance(text, str) and not _DECIMAL.fullmatch(text):
        if text.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
            raise _RowError(f"{name} {quoted(text)} must be a finite time of 0 or more")
        raise _RowError(f"{name} {quoted(text)} is not a number; write the time as a decimal number in digits 0-9")
    try:
        number = float(text)
    except (ValueError, OverflowError):
        number = math.inf
    if not 0 <= number < math.inf:
        raise _RowError(f"{name} {quoted(text)} must be a finite time of 0 or more")
    return number / per_s


def _json_seconds(value: object, name: str, per_s: int) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _RowError(f"{name} {quoted(value)} is not a number; write the time as a number")
    return _seconds(value, name, per_s)


def _time_parser(format: str, name: str, first: str) -> Callable[[str], float]:
    """How to read the time column, decided by the first row: Azure TIMESTAMPs are date-times (the
    rows must then all be) or plain seconds."""
    if format == "azure" and ":" in first:
        return _DateTimes(name).seconds
    return functools.partial(_seconds, name=name)


class _DateTimes:
    """Reads date-times as seconds after midnight of the first one's date (shifted to UTC where a
    zone is given)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.first_ordinal: int | None = None
        self.day_s: dict[str, int] = {}  # date text -> its midnight, in seconds after the first date's

    def seconds(self, text: str) -> float:
        match = _DATETIME.fullmatch(text)
        if match is None:
            raise _RowError(
                f"{self.name} {quoted(text)} is not a date-time like '2023-11-16 18:15:46.6805900'; "
                "every row must use the same style as the first"
            )
        date, hour, minute, second, zone = match.groups()
        day_s = self.day_s.get(date)
        if day_s is None:
            day_s = self._midnight_s(date, text)
        hour, minute, second = int(hour), int(minute), float(second)
        if hour > 23 or minute > 59 or second >= 61:
            raise _RowError(f"{self.name} {quoted(text)} has an invalid time of day")
        time_s = day_s + hour * 3600 + minute * 60 + second
        if zone and zone != "Z":
            zone_hours, zone_minutes = int(zone[1:3]), int(zone[-2:])
            offset_s = zone_hours * 3600 + zone_minutes * 60
            if zone_minutes > 59 or offset_s > _MAX_ZONE_OFFSET_S:
                raise _RowError(f"{self.name} {quoted(text)} has an invalid time-zone offset {zone}; "
                                "offsets run from -12:00 to +14:00")
            time_s += -offset_s if zone[0] == "+" else offset_s
        return time_s

    def _midnight_s(self, date: str, text: str) -> int:
        try:
            ordinal = dt.date.fromisoformat(date).toordinal()
        except ValueError as error:
            raise _RowError(f"{self.name} {quoted(text)} has an invalid date ({error})") from None
        if self.first_ordinal is None:
            self.first_ordinal = ordinal
        self.day_s[date] = day_s = (ordinal - self.first_ordinal) * 86400
        return day_s


def write_trace(requests: Requests, path: str | os.PathLike[str], format: str) -> None:
    """Write `requests` as a trace in `format`. Times keep the resolution the format has: 100 ns for
    azure (dates start on 2023-11-16), exact for burstgpt (whose other columns get placeholders),
    1 ms for mooncake (whose `hash_ids` are fresh 512-token blocks, so no request shares a prefix)."""
    if format not in TRACE_FORMATS:
        raise UserError(f"trace format {format!r} is unknown; use one of {', '.join(TRACE_FORMATS)}")
    writer: Callable[[Requests], Iterator[str]] = {
        "azure": _azure_lines,
        "burstgpt": _burstgpt_lines,
        "mooncake": _mooncake_lines,
    }[format]
    try:
        with open(path, "w", encoding="utf-8", newline="") as file:
            file.writelines(writer(requests))
    except OSError as error:
        raise UserError(f"{path}: cannot write the trace: {error.strerror}; check the path") from None


def _rows(times: list, requests: Requests) -> Iterator[tuple[float, int, int]]:
    return zip(times, requests.input_tokens.tolist(), requests.output_tokens.tolist())


def _azure_lines(requests: Requests) -> Iterator[str]:
    yield "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    ticks = np.rint(requests.arrival_s * _TICKS_PER_S).astype(np.int64).tolist()
    epoch = _WRITE_EPOCH.toordinal()
    for tick, input_tokens, output_tokens in _rows(ticks, requests):
        days, tick = divmod(tick, 86400 * _TICKS_PER_S)
        second, fraction = divmod(tick, _TICKS_PER_S)
        hour, second = divmod(second, 3600)
        minute, second = divmod(second, 60)
        date = dt.date.fromordinal(epoch + days).isoformat()
        yield f"{date} {hour:02d}:{minute:02d}:{second:02d}.{fraction:07d},{input_tokens},{output_tokens}\r\n"


def _burstgpt_lines(requests: Requests) -> Iterator[str]:
    yield ",".join(_BURSTGPT_HEADER) + "\r\n"
    for time_s, input_tokens, output_tokens in _rows(requests.arrival_s.tolist(), requests):
        total = input_tokens + output_tokens
        yield f"{time_s!r},,0,ChatGPT,{input_tokens},{output_tokens},{total},Conversation log\r\n"


def _mooncake_lines(requests: Requests) -> Iterator[str]:
    times_ms = np.rint(requests.arrival_s * 1000).astype(np.int64).tolist()
    next_block = 0
    for time_ms, input_tokens, output_tokens in _rows(times_ms, requests):
        blocks = -(-input_tokens // _MOONCAKE_BLOCK_TOKENS)
        record = {
            "timestamp": time_ms,
            "input_length": input_tokens,
            "output_length": output_tokens,
            "hash_ids": list(range(next_block, next_block + blocks)),
        }
        next_block += blocks
        yield json.dumps(record) + "\n"
