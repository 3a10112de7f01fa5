"""Token-count samplers for prompts and completions."""

from __future__ import annotations

import csv
import math
import os
import re

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.workload._files import open_text
from tokenpath.workload.sharegpt import redraw_long_pairs, sharegpt_draws
from tokenpath.workload.spec import MAX_TOKENS, LengthSpec

# Token counts as files write them: ASCII digits only, so '1_000' and '١٢' (Arabic-Indic digits),
# which Python's int() takes, are errors.
_COUNT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def parse_count(text: str) -> int | None:
    """A whole number written in ASCII digits (an optional sign, surrounding blanks), else None.

    Beyond 20 characters a number is outside int64 whatever it says; it is returned as -2^63 or 2^63
    rather than converted digit by digit.
    """
    text = text.strip()
    if not _COUNT.fullmatch(text):
        return None
    if len(text) > 20:
        return -(2**63) if text.startswith("-") else 2**63
    return int(text)


def shown_count(text: str) -> str:
    """A count's text for an error line: as written, cut when long."""
    text = text.strip()
    return text if len(text) <= 20 else quoted(text)


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator, field: str) -> np.ndarray:
    """`n` token counts (int64) drawn from `spec` with `rng`; `field` (e.g. "workload.input") names
    the spec in error messages."""
    if n < 0:
        raise ValueError(f"{field}: cannot draw {n} lengths")
    if spec.kind == "fixed":
        tokens = np.full(n, spec.value, dtype=np.int64)
    elif spec.kind == "normal":
        tokens = _normal(spec.mean, spec.sd, spec.min, n, rng)
    elif spec.kind == "lognormal":
        tokens = _lognormal(spec.mean, spec.sd, n, rng)
    elif spec.kind == "sharegpt":  # the prompt or the completion, as the field says
        tokens = sharegpt_draws("output" if field.endswith("output") else "input", n, rng)
    elif spec.kind == "uniform":
        low_tokens, high_tokens = uniform_bounds(spec.mean, spec.range_ratio)
        tokens = rng.integers(low_tokens, high_tokens, size=n, endpoint=True, dtype=np.int64)
    elif spec.kind == "empirical":
        values = read_length_file(spec.path, spec.column, field)
        tokens = values[rng.integers(0, len(values), size=n)]
    else:
        raise AssertionError(f"unhandled length kind {spec.kind!r}")
    return np.clip(tokens, spec.min, spec.max or MAX_TOKENS)


def uniform_bounds(mean: float, range_ratio: float) -> tuple[int, int]:
    """The least and greatest count a uniform draw takes, both included: vLLM's random dataset's
    floor(len * (1 - r)) and ceil(len * (1 + r)) in the same float arithmetic (vllm 0.27.1,
    vllm/benchmarks/datasets/utils.py, get_sampling_params), so 100 +- 10% is [90, 111] there too."""
    return math.floor(mean * (1 - range_ratio)), math.ceil(mean * (1 + range_ratio))


def sample_pair_lengths(input_spec: LengthSpec, output_spec: LengthSpec, n: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n input and n output lengths, drawn in that order; where both are `sharegpt`, a pair over the
    clients' combined bound is then drawn again (sharegpt.py), as the benchmark clients skip it."""
    input_tokens = sample_lengths(input_spec, n, rng, "workload.input")
    output_tokens = sample_lengths(output_spec, n, rng, "workload.output")
    if input_spec.kind == output_spec.kind == "sharegpt":
        input_tokens, output_tokens = redraw_long_pairs(input_tokens, output_tokens, rng)
        input_tokens = np.clip(input_tokens, input_spec.min, input_spec.max or MAX_TOKENS)
        output_tokens = np.clip(output_tokens, output_spec.min, output_spec.max or MAX_TOKENS)
    return input_tokens, output_tokens


def _lognormal(mean: float, sd: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rounded lognormal draws whose mean is `mean` and standard deviation `sd`."""
    mu, sigma = lognormal_parameters(mean, sd)
    return _as_tokens(np.rint(rng.lognormal(mu, sigma, size=n)))


def lognormal_parameters(mean: float, sd: float) -> tuple[float, float]:
    """The underlying normal's (mu, sigma) of a lognormal whose own mean is `mean` and sd is `sd`."""
    sigma = math.sqrt(math.log1p((sd / mean) ** 2))
    return math.log(mean) - sigma**2 / 2, sigma


def _normal(mean: float, sd: float, min_tokens: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """LLMPerf's `int(random.gauss(mean, sd))`, redrawing (vectorized) the rows below `min_tokens`."""
    tokens = _as_tokens(np.trunc(rng.normal(mean, sd, size=n)))
    low = np.flatnonzero(tokens < min_tokens)
    while low.size:
        tokens[low] = _as_tokens(np.trunc(rng.normal(mean, sd, size=low.size)))
        low = low[tokens[low] < min_tokens]
    return tokens


def _as_tokens(draws: np.ndarray) -> np.ndarray:
    """Whole-number float draws as int64, far tails held within the int64 range."""
    return np.clip(draws, -MAX_TOKENS, MAX_TOKENS).astype(np.int64)


def read_length_file(path: str | os.PathLike[str], column: str | None, field: str) -> np.ndarray:
    """The token counts in `path` (int64): one integer per line (blank lines skipped) or, with
    `column`, that column of a CSV file with a header row."""
    values: list[int] = []
    with open_text(path, f"{field} lengths file") as file:
        try:
            _read_counts(file, path, column, field, values)
        except csv.Error as error:
            raise UserError(f"{path}: not readable as CSV ({error}); fix the file") from None
    if not values:
        raise UserError(f"{path}: no lengths in the file; {field} kind 'empirical' needs at least one")
    return np.array(values, dtype=np.int64)


def _read_counts(file, path: object, column: str | None, field: str, values: list[int]) -> None:
    """Append the counts of `file` to `values`: one per line, or the `column` of a CSV file."""
    if column is None:
        for line_number, line in enumerate(file, start=1):
            if text := line.strip():
                values.append(_count(text, path, line_number, "length", "put one whole number per line"))
        return
    reader = csv.reader(file)
    header = [name.strip() for name in next(reader, [])]
    if column not in header:
        raise UserError(
            f"{path}:1: no column {column!r} in the header {quoted(header)}; set {field}.column to one of them"
        )
    position = header.index(column)
    for row in reader:
        if not row:
            continue
        if position >= len(row):
            raise UserError(f"{path}:{reader.line_num}: row has no {column!r} value; fill in the column")
        values.append(_count(row[position], path, reader.line_num, column, "use whole token counts"))


def _count(text: str, path: object, line_number: int, name: str, fix: str) -> int:
    value = parse_count(text)
    if value is None:
        raise UserError(f"{path}:{line_number}: {name} {quoted(text)} is not an integer in digits 0-9; {fix}")
    if not 0 <= value <= MAX_TOKENS:
        raise UserError(f"{path}:{line_number}: {name} {shown_count(text)} is out of range; "
                        f"use 0 to {MAX_TOKENS} tokens")
    return value
