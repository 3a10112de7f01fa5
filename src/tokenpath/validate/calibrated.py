"""Measure once at light load, predict any load (`tokenpath validate --calibrated`).

For each configuration a source measured at three or more loads (row_keys.configuration_key), the
constants are fitted by `calibrate engine --from`'s own fit (calibrate/fit.py's `fit_engine`) on its
lightest row alone, and every other row of the configuration is predicted with them. The fit starts
from, and keeps what it does not fit at, the values the latency rows' constants take with the source's
rows left out (its fold of `validate --cross`, cross.fold_fit): the registry's are fitted on every row,
the ones predicted here among them. Beside each prediction, "uncalibrated" is the fold's values alone.

A published row has no per-request data, so its phase is built from what it states
(`row_phase`): the requests the latency group simulates for it (its lengths drawn as the source
drew them, its Poisson arrivals or its closed loop's concurrency, its request count, warm-up and
measured window), and the published TTFT and TPOT or ITL as the figures to reproduce, with the
statistic the source reported (mean or median). With one phase the fit has two figures, so it fits
up to two constants: the first of its candidates, in its order of preference, that moves them, and the
next that moves them differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpath.calibrate.measured import Measured, Statistic
from tokenpath.config.assumptions import format_value
from tokenpath.config.errors import UserError
from tokenpath.sim.forked import can_fork, map_forked
from tokenpath.validate.fit import median_abs_error
from tokenpath.validate.latency import (
    predict_row,
    relative_errors,
    row_error,
    row_prepared,
    row_scenario,
    simulated_requests,
)
from tokenpath.validate.row_keys import configuration_key, label, lengths_label, load, load_label

Row = dict[str, Any]
# Fewest distinct loads of one configuration for it to be calibrated on one and predicted at the others.
MIN_LOADS = 3


@dataclass(frozen=True)
class Configuration:
    """Rows (indices) of one configuration measured at MIN_LOADS or more loads; `lightest` is fitted on."""

    rows: tuple[int, ...]
    lightest: int


def configurations(rows: Sequence[Row]) -> list[Configuration]:
    """The configurations of `rows` measured at MIN_LOADS or more distinct loads, in the order their
    first rows come; each one's lightest row is the first at its lowest rate or concurrency."""
    grouped: dict[tuple, list[int]] = {}
    for k, row in enumerate(rows):
        if load(row) is not None:
            grouped.setdefault(configuration_key(row), []).append(k)
    found = []
    for members in grouped.values():
        if len({load(rows[k]) for k in members}) >= MIN_LOADS:
            found.append(Configuration(tuple(members), min(members, key=lambda k: (load(rows[k]), k))))
    return found


def row_phase(row: Row, sharegpt: dict[str, Any]) -> Measured:
    """A published row as the phase `calibrate engine` fits: the requests the latency group simulates
    for it, their scheduled arrivals (a closed loop capped at its concurrency), the ones its window
    counts, and its published TTFT and decode figure with the row's statistic."""
    requests = row_prepared(row, sharegpt).requests
    _, skip = simulated_requests(row)
    return Measured(
        name=f"{row['source']} {load_label(row)}", requests=requests, counted=np.arange(len(requests)) >= skip,
        ttft_s=row["ttft_ms"] / 1e3, decode_s=row["decode_ms"] / 1e3, results=row["source"],
        concurrency=row.get("concurrency") if row["arrival"] == "concurrency" else None,
        rate=row["rate"] if row["arrival"] == "poisson" else math.inf,
        statistic=Statistic(row["ttft_stat"], row["decode_stat"], row["decode_metric"]), sent=False)


def _row_result(k: int, row: Row, predicted: dict[str, float], uncalibrated: dict[str, float]) -> dict[str, Any]:
    errors, before = relative_errors(row, predicted), relative_errors(row, uncalibrated)
    return {"row": k, "load": load_label(row), "ttft_ms": row["ttft_ms"],
            "predicted_ttft_ms": predicted["ttft_s"] * 1e3, "ttft_error": errors["ttft"], "decode_ms": row["decode_ms"],
            "predicted_decode_ms": predicted["decode_s"] * 1e3, "decode_error": errors["decode"],
            "uncalibrated_ttft_error": before["ttft"], "uncalibrated_decode_error": before["decode"]}


def calibrate_configuration(configuration: Configuration, rows: Sequence[Row], sharegpt: dict[str, Any],
                            start: Mapping[str, float]) -> dict[str, Any]:
    """The fit on the configuration's lightest row, from the values `start` (the source's fold's), and every
    other row predicted with it, beside the prediction with `start` alone."""
    from tokenpath.calibrate.fit import fit_engine

    k = configuration.lightest
    light = rows[k]
    start = dict(start)
    try:
        fit = fit_engine(row_scenario(light, sharegpt, start), [row_phase(light, sharegpt)])
    except UserError as error:
        raise row_error(k, light, error) from None
    predicted = []
    for j in configuration.rows:
        if j == k:
            continue
        try:
            predicted.append(_row_result(j, rows[j], predict_row(rows[j], sharegpt, {**start, **fit.values}),
                                         predict_row(rows[j], sharegpt, start)))
        except UserError as error:
            raise row_error(j, rows[j], error) from None
    after, before = fit.predicted_after[0], fit.predicted_before[0]
    return {"source": light["source"], "configuration": f"{label(light)}, {lengths_label(light)}",
            "fitted_on": _row_result(k, light, {"ttft_s": after[0], "decode_s": after[1]},
                                     {"ttft_s": before[0], "decode_s": before[1]}),
            "started_from": start,  # (the fold's values)
            "fitted": dict(fit.values), "start": dict(fit.start), "not_fitted": dict(fit.not_fitted),
            "rows": predicted}


def _medians(rows: Sequence[dict[str, Any]], prefix: str = "") -> dict[str, float]:
    return {"ttft_median": median_abs_error([r[f"{prefix}ttft_error"] for r in rows]),
            "tpot_median": median_abs_error([r[f"{prefix}decode_error"] for r in rows])}


def calibrated_validation(rows: Sequence[Row], sharegpt: dict[str, Any], starts: Mapping[str, Mapping[str, float]],
                          workers: int = 1, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The document `validate --calibrated --json` writes (errors as fractions): every configuration's
    fit and predictions, per source and overall the median |error| of the predicted rows, and the
    same rows' medians with the values the fits start from ("uncalibrated"): `starts`, by source, each
    source's fold's values (calibrating_sources names the sources). `progress(1)` as each configuration
    is done."""
    found = configurations(rows)
    if not found:
        raise UserError(f"--calibrated: no configuration has rows at {MIN_LOADS} or more loads (rates or "
                        "concurrencies) with the same model, chip, tp, engine, settings and lengths")

    def work(configuration: Configuration, report: Callable[[int], None]) -> dict[str, Any]:
        source = rows[configuration.lightest]["source"]
        result = calibrate_configuration(configuration, rows, sharegpt, starts[source])
        report(1)
        return result

    if workers > 1 and len(found) > 1 and can_fork():
        results = map_forked(work, found, min(workers, len(found)), progress)
    else:
        results = [work(c, progress or (lambda _: None)) for c in found]
    by_source = []
    for source in dict.fromkeys(r["source"] for r in results):
        mine = [r for r in results if r["source"] == source]
        predicted = [row for r in mine for row in r["rows"]]
        by_source.append({"source": source, "rows": len(predicted), **_medians(predicted),
                          "uncalibrated": _medians(predicted, "uncalibrated_"), "configurations": mine})
    predicted = [row for r in results for row in r["rows"]]
    return {"sources": len(by_source), "configurations": len(results), "rows": len(predicted), **_medians(predicted),
            "uncalibrated": _medians(predicted, "uncalibrated_"), "by_source": by_source}


def calibrating_sources(rows: Sequence[Row]) -> list[str]:
    """The sources of the configurations `calibrated_validation` fits, in order."""
    return list(dict.fromkeys(rows[c.lightest]["source"] for c in configurations(rows)))


def print_calibrated(console: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    console.print("Latency rows calibrated at light load: each configuration's constants fitted on its lightest row "
                  "by `calibrate engine`'s fit, from the values fitted on the other sources' rows (its fold of "
                  "--cross), its other rows predicted with them (uncalibrated: the fold's values alone; --json says "
                  "why each other candidate was not fitted)\n", highlight=False)
    for source in document["by_source"]:
        for c in source["configurations"]:
            fitted = ", ".join(f"{name} {format_value(name, c['start'][name])} -> {format_value(name, value)}"
                               for name, value in c["fitted"].items()) or "nothing (its fold's values)"
            table = Table(title=f"{source['source']}: {c['configuration']}\nfitted on the first load: {fitted}",
                          title_justify="left")
            for column in ("load", "TTFT", "predicted", "TPOT / ITL", "predicted", "uncalibrated"):
                table.add_column(column, justify="left" if column == "load" else "right", no_wrap=True)
            for r in [c["fitted_on"], *c["rows"]]:
                table.add_row(r["load"], f"{r['ttft_ms']:.1f} ms",
                              f"{r['predicted_ttft_ms']:.1f} ms {r['ttft_error']:+.1%}", f"{r['decode_ms']:.2f} ms",
                              f"{r['predicted_decode_ms']:.2f} ms {r['decode_error']:+.1%}",
                              f"{r['uncalibrated_ttft_error']:+.0%} / {r['uncalibrated_decode_error']:+.0%}")
            console.print(table)
    summary = Table(title="median |error| of the rows predicted (the fitted rows left out), calibrated and with the "
                          "values the fits started from", title_justify="left")
    for column in ("source", "rows", "TTFT", "TPOT / ITL", "uncalibrated\nTTFT", "uncalibrated\nTPOT / ITL"):
        summary.add_column(column, justify="left" if column == "source" else "right")
    for s in [*document["by_source"], {**document, "source": "all"}]:
        summary.add_row(s["source"], str(s["rows"]), f"{s['ttft_median']:.1%}", f"{s['tpot_median']:.1%}",
                        f"{s['uncalibrated']['ttft_median']:.1%}", f"{s['uncalibrated']['tpot_median']:.1%}")
    console.print(summary)
