"""A trace file read as JSON documents, and which format they are in.

One JSON document (an OTLP/HTTP JSON export, a LangSmith export), or JSON lines: the collector's file
exporter writes one OTLP `TracesData` object per line, and a LangSmith dump may hold one run per line.
"""

from __future__ import annotations

import json
from typing import Any

from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted

FORMATS = ("otlp", "langsmith")
WHAT = "trace file"
# Digits of a whole number read from a trace: nanoseconds since 1970 have 19, a uint64 at most 20.
MAX_DIGITS = 20
EXPECTED = ("give an OTLP JSON export (resourceSpans, as an OTLP/HTTP exporter or the collector's file exporter "
            "writes it) or a LangSmith export (runs with run_type)")


def read_documents(path: str) -> list[Any]:
    """The file's JSON documents: the whole file, or else each of its lines."""
    text = files.read_text(path, WHAT, files.MAX_DATA_BYTES)
    source = files.shown(path)
    if not text.strip():
        raise UserError(f"{source}: the {WHAT} is empty; {EXPECTED}")
    try:
        return [_parse(text, source)]
    except json.JSONDecodeError as whole:
        lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        documents = []
        for number, line in lines:
            try:
                documents.append(_parse(line, source))
            except json.JSONDecodeError as error:
                if not documents:  # not JSON lines either: the whole document's error says where
                    raise UserError(f"{source}: not JSON ({whole.msg} at line {whole.lineno}, column {whole.colno}); "
                                    f"{EXPECTED}") from None
                raise UserError(f"{source}: line {number} is not JSON ({error.msg} at column {error.colno}); each "
                                "line of a JSON lines file is one document") from None
        return documents


def _parse(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise UserError(f"{source}: the JSON is nested too deep to read; {EXPECTED}") from None
    except json.JSONDecodeError:
        raise
    except ValueError as error:  # a number of more digits than Python converts (sys.get_int_max_str_digits)
        raise UserError(f"{source}: holds a number it cannot read ({str(error).split(';')[0]}); {EXPECTED}") from None


def detect(documents: list[Any], source: str) -> str:
    """'otlp' or 'langsmith', from the first document's keys."""
    first = documents[0]
    if isinstance(first, list) and first:
        first = first[0]
    if isinstance(first, dict):
        if "resourceSpans" in first:
            return "otlp"
        if "run_type" in first or "runs" in first:
            return "langsmith"
    raise UserError(f"{source}: neither OTLP JSON (no resourceSpans) nor a LangSmith export (no runs with a "
                    f"run_type); {EXPECTED}")


def field(table: dict, key: str, kind: type | tuple[type, ...], where: str, expected: str,
          required: bool = True) -> Any:
    """`table[key]` when it is of `kind` (None where it is absent or null and not `required`); a UserError
    naming `where` and `key` otherwise."""
    value = table.get(key)
    if value is None:
        if required:
            raise UserError(f"{where}: no {key}; each needs {expected}")
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise UserError(f"{where}: {key} is {quoted(value)}; it must be {expected}")
    return value


def whole_number(value: Any, where: str, what: str) -> int:
    """A count or a time in a JSON document: an integer, written as a number or (as OTLP JSON writes 64-bit
    integers) a string of digits; a UserError naming `what` otherwise."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MAX_DIGITS:
        return value
    if isinstance(value, float) and value.is_integer() and 0 <= value < 10.0**MAX_DIGITS:
        return int(value)
    raise UserError(f"{where}: {what} is {quoted(value)}; it must be a whole number of 0 or more")
