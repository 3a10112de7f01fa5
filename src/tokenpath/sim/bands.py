"""How far to trust a simulated figure: its error band, from the validated rows of the nearest regime.

`catalog/validation/bands.toml` (written by `tokenpath validate --cross --write-bands`, validate/
bands_build.py) holds, per validated row, its regime (sim/regime.py: engine profile, load, model family,
chip generation) and its signed errors e = predicted / measured - 1: TTFT and the decode metric out of
its fold of the cross-validation, and output throughput where the row states one.

A band for a scenario comes from the rows of its regime: all four keys alike, else BACKOFF's keys
dropped one after another until at least MIN_BAND_ROWS rows match. With q_lo and q_hi the errors' k-th
lowest and k-th highest (`ranked_range`: k the split-conformal rank for eight in ten), what would be
measured of a predicted x lies in [x / (1 + q_hi), x / (1 + q_lo)].

A handful of rows, often from one source, understate how far off a deployment they do not include can
be. So the band is at least as wide as the spread every row shows around its own regime (`pooled_spread`):
each row's error against the median error of its regime's other rows (the error a band makes for a row it
has not seen), in log(1 + e), their ranked range, about the regime's own median.

A scenario whose engine profile no row runs on its chip's generation (outside the validated envelope,
sim/envelope.py) has no rows of its own pair to stand on: its latency bands are at least as wide as the
spread every row shows about the rows of the other pairs (`pair_spread`): each row's error against the
median error of the rows its band would come from were every row of its engine and generation left
out, the error a band makes for a pair it has not seen.

A scenario calibrated by `calibrate engine` takes its latency bands from the file's `calibrated` rows
instead: the rows `validate --calibrated` predicted from a fit on one lighter load of their
configuration, the workflow such a scenario follows (validate/calibrated.py), with the same back-off.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import tomllib

from tokenpath.config.errors import UserError

SCHEMA = "tokenpath.bands/1"
REGENERATE = "tokenpath validate --cross --write-bands"
# The four keys of a regime, as the result document's `regime` names them.
REGIME_KEYS = ("engine", "load", "model_family", "chip_generation")
# Dropped in this order when too few rows match all of them: what the hardware's generation changes is
# mostly in the roofline, which is measured per chip; the model family next; the load, then the engine
# profile, decide how requests are scheduled, which is what the rows test most.
BACKOFF = ("chip_generation", "model_family", "load", "engine")
KEY_NAMES = {"engine": "engine profile", "load": "load", "model_family": "model family",
             "chip_generation": "chip generation"}
# Eight rows in ten within the band: one in TAIL beyond each end.
TAIL = 10
# A regime with fewer rows is backed off.
MIN_BAND_ROWS = 3
METRICS = ("ttft", "decode", "throughput")


@dataclass(frozen=True)
class Record:
    """One validated row: where it sits and how far off its predictions were."""

    id: str
    source: str
    engine: str
    engine_version: str
    chip: str
    chip_generation: str
    model: str
    model_family: str
    load: str
    errors: dict[str, float] = field(default_factory=dict)  # METRICS present for the row
    cross_validated: bool = True  # False: a published group's row, predicted as validate predicts it
    calibrated: bool = False  # predicted after a fit on a lighter load of its configuration (module docstring)
    speculative: str = ""  # the row's speculative decoding method ("": none)
    attention_dp: bool = False  # the row runs attention data-parallel

    def key(self, name: str) -> str:
        return getattr(self, name)


@functools.cache
def shipped_records() -> tuple[Record, ...]:
    """The shipped file's rows; none before it is first written."""
    path = resources.files("tokenpath.catalog") / "validation" / "bands.toml"
    if not path.is_file():
        return ()
    return parse_bands(path.read_text(encoding="utf-8"), "catalog/validation/bands.toml")


def parse_bands(text: str, where: str) -> tuple[Record, ...]:
    """The rows of a bands file (its other keys say where it came from, for people)."""
    data = tomllib.loads(text)
    if data.get("schema") != SCHEMA:
        raise UserError(f"{where}: not a {SCHEMA} file; regenerate it with `{REGENERATE}`")
    records = []
    for table, calibrated in (("rows", False), ("calibrated", True)):
        for row in data.get(table, []):
            errors = {metric: float(row[f"{metric}_error"]) for metric in METRICS if f"{metric}_error" in row}
            records.append(Record(row["id"], row["source"], row["engine"], row.get("engine_version", ""), row["chip"],
                                  row["chip_generation"], row["model"], row["model_family"], row["load"], errors,
                                  row.get("cross_validated", True), calibrated, row.get("speculative", ""),
                                  row.get("attention_dp", False)))
    return tuple(records)


def latency_row_ids(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Each latency row's id in the bands file: `source:id` where the row has an id, else `source#n`,
    n counting that source's rows from 0."""
    seen: dict[str, int] = {}
    ids = []
    for row in rows:
        n = seen.get(row["source"], 0)
        seen[row["source"]] = n + 1
        ids.append(f"{row['source']}:{row['id']}" if row.get("id") else f"{row['source']}#{n}")
    return ids


def group_row_ids(group: str, count: int) -> list[str]:
    """The ids of a published group's rows: `group#n`."""
    return [f"{group}#{n}" for n in range(count)]


def tail_rank(count: int) -> int:
    """How many of `count` errors lie at or beyond each end of the band: k = floor((count + 1) / TAIL).
    A new row exchangeable with the rows (split conformal prediction) lies above their k-th highest with
    probability k / (count + 1) <= 1 / TAIL, and below their k-th lowest alike: inside, with at least 1 - 2 /
    TAIL. Percentiles fall short of that (the 10th and 90th of 10 rows hold a new one about 65% of the time,
    of 70 rows 78%). Fewer than TAIL - 1 errors give 0, which no finite band reaches (their smallest and
    largest are taken, and hold fewer)."""
    return (count + 1) // TAIL


def ranked_range(values: Sequence[float]) -> tuple[float, float, int]:
    """The k-th lowest and k-th highest of `values`, k = tail_rank (at least 1: their smallest and
    largest), and k."""
    ordered = sorted(values)
    k = max(tail_rank(len(ordered)), 1)
    return float(ordered[k - 1]), float(ordered[len(ordered) - k]), k


def residual_range(errors: Sequence[float]) -> tuple[float, float, str]:
    """(q_lo, q_hi, the rule in words) of signed errors: their ranked_range."""
    low, high, k = ranked_range(errors)
    if k == 1:
        return low, high, "min-max of their errors"
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return low, high, f"{k}{suffix} lowest to {k}{suffix} highest of their errors"


def bounds(value: float | None, q_low: float, q_high: float) -> dict[str, float | None]:
    """What would be measured of a predicted `value` whose error lies in [q_low, q_high]."""
    if value is None:
        return {"low": None, "high": None}
    return {"low": value / (1.0 + q_high), "high": value / (1.0 + q_low)}


@dataclass(frozen=True)
class Band:
    """The error range of one metric, and the rows it comes from."""

    q_low: float
    q_high: float
    rows: int
    basis: str


def nearest(records: Sequence[Record], regime: dict[str, Any], metric: str) -> tuple[list[Record], list[str]]:
    """The rows with `metric` of the nearest regime holding at least MIN_BAND_ROWS of them, and the keys
    dropped (BACKOFF's order) to reach it; every such row, all keys dropped, when none does."""
    having = [r for r in records if metric in r.errors]
    kept, dropped = list(REGIME_KEYS), []
    for drop in (None, *BACKOFF):
        if drop is not None:
            kept.remove(drop)
            dropped.append(drop)
        matching = [r for r in having if all(r.key(k) == regime[k] for k in kept)]
        if len(matching) >= MIN_BAND_ROWS:
            return matching, dropped
    return having, dropped


def _regime_words(regime: dict[str, Any], keys: Sequence[str]) -> str:
    words = {"engine": regime["engine"], "load": f"{regime['load']} load", "model_family": regime["model_family"],
             "chip_generation": regime["chip_generation"]}
    return ", ".join(words[k] for k in REGIME_KEYS if k in keys) or "rows of every regime"


def _regime_of(record: Record) -> dict[str, str]:
    return {key: record.key(key) for key in REGIME_KEYS}


@functools.lru_cache(maxsize=64)
def _spread(rows: tuple[tuple[str, str, str, str, str, str, float], ...],
            leave_out_pair: bool = False) -> tuple[float, float] | None:
    """pooled_spread of rows given as (id, source, engine, load, model_family, chip_generation, error), or
    with `leave_out_pair` pair_spread."""
    records = [Record(id_, source, engine, "", "", generation, "", family, load, {"e": error})
               for id_, source, engine, load, family, generation, error in rows]
    deviations = []
    for record in records:
        unseen = [r for r in records if r.source != record.source and not (
            leave_out_pair and (r.engine, r.chip_generation) == (record.engine, record.chip_generation))]
        others, _ = nearest(unseen, _regime_of(record), "e")
        if others:
            deviations.append(math.log1p(record.errors["e"]) - float(np.median([math.log1p(r.errors["e"])
                                                                                  for r in others])))
    if tail_rank(len(deviations)) == 0:
        return None
    low, high, _ = ranked_range(deviations)
    return low, high


def pooled_spread(records: Sequence[Record], metric: str) -> tuple[float, float] | None:
    """The ranked range of every row's error about its regime, in log(1 + e): each row's log(1 + e) less
    the median of those of the rows its band would come from were its source's rows not among them
    (`nearest`, the same back-off): a deployment the band has not seen is another source's, and a source's
    other loads of one configuration would stand in for it. None from fewer rows than a ranked range of
    eight in ten needs (tail_rank 0)."""
    return _spread(_spread_rows(records, metric))


def pair_spread(records: Sequence[Record], metric: str) -> tuple[float, float] | None:
    """As pooled_spread, each row against the rows its band would come from were every row of its engine
    profile and chip generation left out: how far a band is off for a pair no row runs."""
    return _spread(_spread_rows(records, metric), leave_out_pair=True)


def _spread_rows(records: Sequence[Record], metric: str) -> tuple[tuple[str, str, str, str, str, str, float], ...]:
    return tuple((r.id, r.source, r.engine, r.load, r.model_family, r.chip_generation, r.errors[metric])
                 for r in records if metric in r.errors)


def unseen_pair(records: Sequence[Record], regime: dict[str, Any]) -> bool:
    """Whether no latency row runs the regime's engine profile on its chip generation."""
    return not any(r.engine == regime["engine"] and r.chip_generation == regime["chip_generation"]
                   for r in records if "ttft" in r.errors)


def band(records: Sequence[Record], regime: dict[str, Any], metric: str, calibrated: bool = False) -> Band | None:
    """The band of `metric` for a run of `regime` (`calibrated`: from the calibrated rows); None when no
    row has the metric. The regime's rows' range, widened to the pooled spread about their median and,
    for a latency metric of an engine no row runs on the chip's generation, to the pair spread."""
    pool = [r for r in records if r.calibrated == calibrated]
    chosen, dropped = nearest(pool, regime, metric)
    if not chosen:
        return None
    q_low, q_high, rule = residual_range([r.errors[metric] for r in chosen])
    centre = float(np.median([math.log1p(r.errors[metric]) for r in chosen]))
    counted = sum(metric in r.errors for r in pool)
    widenings = [(pooled_spread(pool, metric), f"the pooled spread of {counted} rows")]
    if metric != "throughput" and unseen_pair(pool, regime):
        widenings.append((pair_spread(pool, metric), f"the spread of {counted} rows about other engine-and-"
                          f"generation pairs' rows (no row runs {regime['engine']} on {regime['chip_generation']})"))
    for spread, what in widenings:
        if spread is not None:
            low, high = math.expm1(centre + spread[0]), math.expm1(centre + spread[1])
            if low < q_low or high > q_high:
                q_low, q_high = min(q_low, low), max(q_high, high)
                rule += f", widened to {what}"
    crossed = sum(r.cross_validated for r in chosen)
    grouped = "as validate predicts them (the constant their group fits, fitted on its other rows)"
    sources = len({r.source for r in chosen})
    how = (f"{sources} sources, each predicted after a fit on a lighter load of its configuration "
           "(validate --calibrated)" if calibrated else
           "cross-validated" if crossed == len(chosen) else
           f"{crossed} cross-validated, {len(chosen) - crossed} {grouped}" if crossed else grouped)
    kept = [k for k in REGIME_KEYS if k not in dropped]
    where = _regime_words(regime, kept)
    if dropped:
        what, last = ", ".join(KEY_NAMES[k] for k in dropped) if kept else "every key", dropped[-1]
        where += (f" ({what} dropped: fewer than {MIN_BAND_ROWS} rows also have its {KEY_NAMES[last]}, "
                  f"{regime[last]})")
    basis = f"{where}: {len(chosen)} rows, {how}, {rule}"
    if len(chosen) < MIN_BAND_ROWS:
        basis += f"; fewer than {MIN_BAND_ROWS} rows in all: a band this thin is not an error range"
    return Band(q_low, q_high, len(chosen), basis)


# The band each latency metric takes: time to first token (or visible text) TTFT's, time per token the
# decode metric's. E2E is both (attach_bands).
_LATENCY_BAND = {"ttft": "ttft", "ttfv": "ttft", "tpot": "decode", "itl": "decode"}
_STATS = ("mean", "p50", "p90", "p99")
_THROUGHPUTS = ("output_tokens_per_s", "requests_per_s")


def calibration_note(files: Sequence[str], calibrated_band: bool) -> str:
    """What a calibrated scenario's band says of its calibration."""
    if calibrated_band:
        return f"; the scenario is calibrated ({', '.join(files)}): the band of calibrated predictions"
    return (f"; the scenario is calibrated ({', '.join(files)}): this is the uncalibrated model's band, no "
            "calibrated prediction of this figure is validated")


def _block(stats: dict[str, Any], q_low: float, q_high: float, rows: int, basis: str,
           calibration: Sequence[str], calibrated_band: bool = False, given_s: float = 0.0) -> dict[str, Any]:
    """The band of one latency. `given_s`: the mean time of an application's stages in it, which no
    validated row covers: only the rest of each figure takes the band."""
    block: dict[str, Any] = {}
    for stat in _STATS:
        value = stats.get(stat)
        modelled = None if value is None else max(0.0, value - given_s)
        block[stat] = {end: None if bound is None else bound + min(given_s, value)
                       for end, bound in bounds(modelled, q_low, q_high).items()}
    if given_s > 0:
        basis += (f"; the application's stages in it ({given_s * 1e3:.3g} ms mean) kept out of the band: the rows "
                  "validate the model call, not them")
    block.update(rows=rows, basis=basis + (calibration_note(calibration, calibrated_band) if calibration else ""),
                 calibrated=bool(calibration))
    return block


def attach_bands(document: dict[str, Any], records: Sequence[Record], calibration: Sequence[str] = (),
                 engine_calibrated: bool = False, given_s: dict[str, float] | None = None) -> None:
    """Each latency's and the throughput's `band` in a result document with a `regime`: `calibration` the
    scenario's calibration files, if any; `engine_calibrated`: one of them is an engine calibration, so
    the latencies take the calibrated rows' bands where the file has them; `given_s`: per latency, the
    mean time of an application's stages in it (_block)."""
    given_s = given_s or {}
    regime, latency = document["regime"], document["latency_s"]
    found = {metric: band(records, regime, metric) for metric in METRICS}
    calibrated_band = False
    if engine_calibrated:
        for metric in ("ttft", "decode"):
            calibrated = band(records, regime, metric, calibrated=True)
            if calibrated is not None:
                found[metric], calibrated_band = calibrated, True
    for key, metric in _LATENCY_BAND.items():
        b = found[metric]
        if b is not None and latency[key].get("mean") is not None:  # no band for a metric never measured
            latency[key]["band"] = _block(latency[key], b.q_low, b.q_high, b.rows, b.basis, calibration,
                                          calibrated_band, given_s.get(key, 0.0))
    ttft, decode = found["ttft"], found["decode"]
    e2e = latency["e2e"]
    if ttft is not None and decode is not None and e2e.get("mean") and latency["ttft"].get("mean") is not None:
        # E2E is the first token and the rest: TTFT's band on its share of the mean, the decode band on
        # the rest, both ends taken together (errors of the two alike: the wider band).
        ttft_s = latency["ttft"]["mean"] - given_s.get("ttft", 0.0)
        e2e_s = e2e["mean"] - given_s.get("e2e", 0.0)
        share = min(1.0, max(0.0, ttft_s) / e2e_s) if e2e_s > 0 else 1.0
        low = share / (1.0 + ttft.q_high) + (1.0 - share) / (1.0 + decode.q_high)
        high = share / (1.0 + ttft.q_low) + (1.0 - share) / (1.0 + decode.q_low)
        basis = (f"TTFT's band on its first token ({share:.0%} of the mean), the decode band on the rest; "
                 f"decode: {decode.basis}")
        e2e["band"] = _block(e2e, 1.0 / high - 1.0, 1.0 / low - 1.0, decode.rows, basis, calibration,
                             calibrated_band, given_s.get("e2e", 0.0))
    throughput = found["throughput"]
    if throughput is not None:
        block = {key: bounds(document["throughput"].get(key), throughput.q_low, throughput.q_high)
                 for key in _THROUGHPUTS}
        block.update(rows=throughput.rows, basis=throughput.basis + (calibration_note(calibration, False)
                                                                     if calibration else ""),
                     calibrated=bool(calibration))
        document["throughput"]["band"] = block
