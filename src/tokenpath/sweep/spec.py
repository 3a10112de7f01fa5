"""A sweep spec (TOML): a base scenario, optional overrides, and axes to vary.

    scenario = "typical"            # a catalog name, or a scenario file relative to this spec
    samples = 20                    # ranges only: how many random draws
    seed = 0                        # ranges only: the draws' seed
    [overrides]
    "workload.num_requests" = 10000
    [axes]
    "deployment.tp" = [4, 8]                              # a grid axis: every value
    "workload.arrival.rate" = {min = 5, max = 40, log = true}  # a range: `samples` random draws

Every combination of the grid axes is crossed with the `samples` random draws of the range axes
(one point per combination when there are no ranges); a point drawn twice (an integer range can
repeat a value) is run once. Dotted keys may be quoted or written as TOML
dotted keys; both mean the same scenario key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config import files, memory
from tokenpath.config.errors import UserError, quoted
from tokenpath.sim.overrides import apply_overrides, flatten
from tokenpath.sim.scenario import build_scenario, read_scenario_table

SPEC_KEYS = ("scenario", "overrides", "axes", "samples", "seed")
RANGE_KEYS = {"min", "max", "log"}
MAX_POINTS = 1_000_000
# Memory a point holds in a run: its values (0.5 kB, measured on 40,000 points), its task until it runs,
# and its row, kept until the table is written (84 metrics of the typical scenario: 10 kB by tracemalloc).
POINT_BYTES = 12_000


@dataclass(frozen=True)
class SweepSpec:
    scenario: str                    # a catalog name or an absolute scenario file path
    overrides: dict[str, Any]        # dotted key -> value, applied before each point's values
    axes: list[str]                  # dotted keys, in the spec's order
    points: list[dict[str, Any]]     # each point's axis values, in a fixed order
    fingerprint: str                 # of the base scenario (overrides applied) and the axes' keys


def point_id(values: dict[str, Any]) -> str:
    """A point's identity: a hash of its axis values (so a rerun finds it again)."""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def _same_value(value: Any) -> Any:
    """What makes two listed values one point: a number's value (10 and 10.0 run alike), else its repr."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if numeric else repr(value)


def _is_range(value: dict) -> bool:
    return bool(value) and set(value) <= RANGE_KEYS and "min" in value


def _meant_as_range(value: dict) -> bool:
    """A range, or a table that reads as one (a number for min) with a key a range does not have: kept whole
    so that the error names the key, not the table's parts as axes of their own."""
    return _is_range(value) or (_number(value.get("min")) and "max" in value)


def _number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        return False


def _check_range(key: str, spec: dict) -> None:
    low, high, log = spec.get("min"), spec.get("max"), spec.get("log", False)
    if not (_number(low) and _number(high) and low < high):
        raise UserError(f"axes.{key}: a range needs numbers min < max, got min={quoted(low)}, max={quoted(high)}")
    if not math.isfinite(float(high) - float(low)):
        raise UserError(f"axes.{key}: a range from {low!r} to {high!r} is wider than a float holds; narrow it")
    if not isinstance(log, bool):
        raise UserError(f"axes.{key}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise UserError(f"axes.{key}: a log range needs min > 0, got {low!r}")


def _range_values(spec: dict, samples: int, rng: np.random.Generator) -> list:
    low, high, log = spec["min"], spec["max"], spec.get("log", False)
    draws = np.exp(rng.uniform(math.log(low), math.log(high), samples)) if log else rng.uniform(low, high, samples)
    if isinstance(low, int) and isinstance(high, int):  # an integer range draws integers
        return [int(v) for v in np.clip(np.rint(draws), low, high)]
    return [float(v) for v in draws]


def _check_size(source: str, combinations: int, samples: int | None) -> None:
    """Refuse, before any is drawn, more points than a sweep takes or this machine's memory holds:
    `combinations` of the listed values, each crossed with `samples` draws of the ranges (if any)."""
    if samples is None:
        count, what, fix = combinations, f"the listed values make {combinations:,} points", "list fewer values"
    else:
        count = combinations * samples
        crossed = f" with {combinations:,} combinations of the listed values" if combinations > 1 else ""
        what, fix = f"samples = {samples:,}{crossed} makes {count:,} points", "lower samples"
    if count > MAX_POINTS:
        raise UserError(f"{source}: {what}, more than {MAX_POINTS:,}; {fix}")
    memory.require(count * POINT_BYTES, f"{source}: {what}, which", fix)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec; every point's scenario is validated here, before anything runs."""
    path = Path(path)
    if not files.exists(str(path)):
        files.check_path(str(path), "sweep spec")
        raise UserError(f"{files.shown(str(path))}: no such sweep spec; give a .toml file")
    source = files.shown(str(path))
    table = files.parse_toml(files.read_text(str(path), "sweep spec"), source)
    unknown = [key for key in table if key not in SPEC_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; a sweep spec has "
                        f"{', '.join(SPEC_KEYS)}")
    scenario = table.get("scenario")
    if not isinstance(scenario, str) or not scenario:
        raise UserError(f"{source}: scenario = NAME or FILE is required (a catalog name or a .toml file "
                        "relative to the spec)")
    relative = path.resolve().parent / scenario
    if scenario.endswith(".toml") or relative.exists():
        scenario = str(relative)
    overrides = table.get("overrides", {})
    axes = table.get("axes")
    if not isinstance(overrides, dict):
        raise UserError(f"{source}: [overrides] must be a table of dotted keys and values")
    if not isinstance(axes, dict) or not axes:
        raise UserError(f"{source}: [axes] is required: dotted keys mapped to a list of values or a range "
                        "{min, max, log}")
    overrides = flatten(overrides)
    axes = flatten(axes, _meant_as_range)
    both = [key for key in axes if key in overrides]
    if both:
        raise UserError(f"{source}: {both[0]} is both an override and an axis; keep one")
    grid: dict[str, list] = {}
    ranges: dict[str, dict] = {}
    for key, value in axes.items():
        if isinstance(value, list):
            if not value:
                raise UserError(f"axes.{key}: an empty list of values; give at least one")
            for item in value:
                if not isinstance(item, (str, int, float, bool)):
                    hint = (f"; sweep a key inside it instead, e.g. axes.\"{key}.{next(iter(item))}\" = [...]"
                            if isinstance(item, dict) and item else "")
                    raise UserError(f"axes.{key}: {quoted(item)} is not a number, string or boolean; an axis's "
                                    f"values are one column of the results{hint}")
            grid[key] = value
        elif isinstance(value, dict):
            if not _is_range(value):
                raise UserError(f"axes.{key}: a range has min, max and optionally log, got "
                                f"{', '.join(sorted(value))}")
            _check_range(key, value)
            ranges[key] = value
        else:
            raise UserError(f"axes.{key}: must be a list of values or a range {{min, max, log}}, got {value!r}")
    samples, seed = table.get("samples"), table.get("seed", 0)
    if ranges:
        if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 1):
            raise UserError(f"{source}: samples = N (at least 1) is required with range axes "
                            f"({', '.join(ranges)})")
        if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            raise UserError(f"{source}: seed must be an integer >= 0, got {seed!r}")
    elif samples is not None:
        raise UserError(f"{source}: samples is for range axes, and every axis here is a list; remove it")
    elif "seed" in table:
        raise UserError(f"{source}: seed seeds the draws of range axes, and every axis here is a list; remove it "
                        "(the simulations' seed is the scenario's: overrides = { seed = N })")
    _check_size(source, math.prod(len(values) for values in grid.values()), samples if ranges else None)
    rng = np.random.default_rng(seed)
    drawn = {key: _range_values(spec, samples, rng) for key, spec in ranges.items()}
    draws = [{key: values[s] for key, values in drawn.items()} for s in range(samples)] if ranges else [{}]
    if any(len({_same_value(v) for v in values}) < len(values) for values in grid.values()):
        raise UserError(f"{source}: an axis lists a value twice; list each value once")
    points, seen = [], set()
    for combination in itertools.product(*grid.values()):
        for draw in draws:
            values = dict(zip(grid, combination)) | draw
            point = {key: values[key] for key in axes}
            if point_id(point) not in seen:  # an integer range can draw the same value twice: once is enough
                seen.add(point_id(point))
                points.append(point)

    base = scenario_for(scenario, overrides, {})
    for values in points:  # every user error surfaces before the first simulation
        scenario_for(scenario, overrides, values)
    fingerprint = hashlib.sha256(json.dumps([base.fingerprint(), list(axes)]).encode()).hexdigest()[:16]
    return SweepSpec(scenario, overrides, list(axes), points, fingerprint)


def scenario_for(scenario: str, overrides: dict[str, Any], values: dict[str, Any]):
    """The scenario of one point: the base, its overrides, then the point's axis values."""
    table, source, base_dir = read_scenario_table(scenario)
    apply_overrides(table, overrides | values, flag="sweep spec:")
    where = source + (" with " + ", ".join(f"{k}={v!r}" for k, v in values.items()) if values else "")
    return build_scenario(table, where, base_dir)
