"""Leave-one-source-out cross-validation of the latency rows (`tokenpath validate --cross`).

The latency group's in-sample medians score rows with the registry's constants, fitted on every row.
Here each source's rows are predicted with every constant of validate/fit.py refitted on the other
sources' rows (all of them, calibration flags ignored: every row is predicted out of its fold). Nothing
of a fold's fit comes from the registry, whose values were fitted on every row, the held-out source's
among them: each constant starts at, and its grid runs through, a value no row sets (the procedure's
held_out_start, the middle of its bounds), and each fold's fits repeat from there until they settle
(fit_all). A constant no other source's row informs stays at that value, and the fold says so: the
registry's would be the held-out source's own fit. One fitted on a published group of rows from another
source (validate/groups.py) holds its fitted value in every fold. The headline is the median |error|
over every row's out-of-fold prediction; beside it the in-sample medians, as `validate --group latency`
reports them (registry values, calibration rows left out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenpath.config.assumptions import format_value
from tokenpath.validate.fit import PROCEDURES, Fit, FitAll, Procedure, RowErrors, fit_all, median_abs_error


def _medians(errors: Sequence[dict[str, float]]) -> dict[str, float]:
    return {"ttft_median": median_abs_error([e["ttft"] for e in errors]),
            "tpot_median": median_abs_error([e["decode"] for e in errors])}


def latency_errors(data: Mapping[str, Any], workers: int,
                   progress: Callable[[int], None] | None = None) -> tuple[RowErrors, dict[str, tuple[str, Fit]]]:
    """The latency rows' errors (`load_latency`'s data) as the folds score them, the constants published
    groups fit held at those fits (validate/groups.fit_group_constants), which it returns too."""
    from tokenpath.validate.fit import latency_predictor
    from tokenpath.validate.groups import fit_group_constants

    group_fits = fit_group_constants()
    base = {name: fitted.value for name, (_, fitted) in group_fits.items()}
    return RowErrors(data["rows"], latency_predictor(data["sharegpt"], base), workers=workers,
                     progress=progress), group_fits


def fold_fit(source: str, errors: RowErrors, procedures: Sequence[Procedure] = PROCEDURES) -> FitAll:
    """The constants fitted on every row but `source`'s, nothing from the registry (fit_all's `held_out`):
    the values that predict `source`'s rows out of their fold."""
    train = [k for k, row in enumerate(errors.rows) if row["source"] != source]
    return fit_all(train, errors, procedures, held_out=True)


def cross_validate(errors: RowErrors, procedures: Sequence[Procedure] = PROCEDURES,
                   on_fold: Callable[[int, str], None] | None = None,
                   elsewhere: Mapping[str, tuple[str, Fit]] | None = None) -> dict[str, Any]:
    """The cross-validation of `errors.rows` (each row's errors under given values, cached): the
    document `validate --cross --json` writes, errors as fractions (`row_errors`: each row's out of its
    fold, in the rows' order; `all_rows`: the constants fitted on every row, beside the registry's).
    `on_fold(folds done, source)` is called as each fold starts; a fold's `not_fitted` constants, which
    no other source's row informs, are at their procedures' held_out_start. `elsewhere`:
    the constants `errors`' predictor holds at values fitted on published groups no latency row shares
    ({name: (group, its Fit)}, validate/groups.fit_group_constants), which the document records."""
    rows = errors.rows
    sources = list(dict.fromkeys(row["source"] for row in rows))
    # On every row first, on grids through the registry's values: the values the registry holds
    every = fit_all(range(len(rows)), errors, procedures)
    out_of_fold: list[dict[str, float]] = []
    row_errors: list[dict[str, float]] = [{} for _ in rows]
    by_source = []
    for done, source in enumerate(sources):
        if on_fold is not None:
            on_fold(done, source)
        held_out = [k for k, row in enumerate(rows) if row["source"] == source]
        fitted = fold_fit(source, errors, procedures)
        values, fits = fitted.values, fitted.fits
        predicted = errors.get([(k, values) for k in held_out])
        out_of_fold += predicted
        for k, errors_k in zip(held_out, predicted):
            row_errors[k] = errors_k
        by_source.append({"source": source, "rows": len(held_out), **_medians(predicted), "fitted": values,
                          "fitted_on": {name: fit.rows for name, fit in fits.items() if fit is not None},
                          "not_fitted": [name for name, fit in fits.items() if fit is None],
                          "passes": fitted.passes, "converged": fitted.converged})
    registry = {p.name: p.start() for p in procedures}
    all_rows = {"fitted": every.values, "registry": registry,
                "fitted_on": {name: fit.rows for name, fit in every.fits.items() if fit is not None},
                "passes": every.passes, "converged": every.converged}
    scored = [k for k, row in enumerate(rows) if not row.get("calibration")]
    in_sample = errors.get([(k, registry) for k in scored])
    # (the rows a constant is calibrated on have no in-sample figure: the cross-validated one over the same
    # rows is the like-for-like comparison)
    same_rows = _medians([row_errors[k] for k in scored])
    return {"rows": len(rows), "sources": len(sources), "cross": _medians(out_of_fold),
            "in_sample": {**_medians(in_sample), "rows": len(scored), "cross_on_these_rows": same_rows},
            "all_rows": all_rows, "by_source": by_source,
            "row_errors": row_errors,
            "fitted_elsewhere": {name: {"value": fitted.value, "group": group, "rows": fitted.rows}
                                 for name, (group, fitted) in (elsewhere or {}).items()}}


def _value_cell(fold: dict[str, Any], name: str, unfitted: str) -> str:
    """The value a fold used for a constant, and what set it (`unfitted` where no row did)."""
    rows = fold["fitted_on"].get(name)
    fitted = unfitted if rows is None else f"{rows} row{'s' if rows != 1 else ''}"
    return f"{format_value(name, fold['fitted'][name])}\n{fitted}"


def _header(name: str, width: int = 8) -> str:
    """A registry name broken after its underscores into lines of about `width` characters (the values
    table of four constants fits 80 columns)."""
    lines = [""]
    for part in name.split("_"):
        piece = part if not lines[-1] else "_" + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "_"
            piece = part
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def print_cross(console: Any, document: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="Latency rows, leave one source out: each source's rows predicted with the constants "
                        "refitted on the other sources' rows", title_justify="left")
    table.add_column("source left out", no_wrap=True)
    for column in ("rows", "TTFT", "TPOT / ITL"):
        table.add_column(column, justify="right")
    for fold in document["by_source"]:
        table.add_row(fold["source"], str(fold["rows"]), f"{fold['ttft_median']:.1%}", f"{fold['tpot_median']:.1%}")
    console.print(table)
    names = list(document["all_rows"]["fitted"])
    values = Table(title="The values used: each fitted on the other sources' rows it informs (no row: none does, "
                         "the middle of its bounds), and on every row", title_justify="left")
    values.add_column("source left out", no_wrap=True)
    for name in names:
        values.add_column(_header(name), justify="right")
    for fold in document["by_source"]:
        values.add_row(fold["source"], *(_value_cell(fold, name, "no row") for name in names))
    every = document["all_rows"]
    values.add_row("none (every row)", *(_value_cell(every, name, "registry") for name in names), style="bold")
    console.print(values)
    fitted, registry = every["fitted"], every["registry"]
    moved = [name for name in names if fitted[name] != registry[name]]
    if moved:
        console.print("Fitted on every row, these differ from the registry: " + "; ".join(
            f"{name} {format_value(name, fitted[name])} (registry {format_value(name, registry[name])})"
            for name in moved) + "; config/assumptions.py holds the registry", highlight=False)
    if not every["converged"]:
        console.print(f"On every row the fits did not settle in {every['passes']} passes (they cycle); the values "
                      "are the last pass's", highlight=False)
    for fold in document["by_source"]:
        if not fold["converged"]:
            console.print(f"{fold['source']} left out: the fits did not settle in {fold['passes']} passes (they "
                          "cycle); its values are the last pass's", highlight=False)
    for name, fitted in document["fitted_elsewhere"].items():
        console.print(f"{name}: {format_value(name, fitted['value'])} in every fold, fitted on the "
                      f"{fitted['rows']} rows of the published group {fitted['group']}, a source no latency row "
                      "shares", highlight=False)
    cross, in_sample = document["cross"], document["in_sample"]
    summary = Table(title="median |error|: every row predicted out of its fold (headline), and in-sample as "
                          "`validate --group latency` reports it", title_justify="left")
    same = in_sample["cross_on_these_rows"]
    for column in ("", "cross-validated", "in-sample", "cross-validated, the in-sample rows"):
        summary.add_column(column, justify="right" if column else "left")
    summary.add_row("TTFT", f"{cross['ttft_median']:.1%}", f"{in_sample['ttft_median']:.1%}",
                    f"{same['ttft_median']:.1%}")
    summary.add_row("TPOT / ITL", f"{cross['tpot_median']:.1%}", f"{in_sample['tpot_median']:.1%}",
                    f"{same['tpot_median']:.1%}")
    summary.add_row("rows", f"{document['rows']}, {document['sources']} folds",
                    f"{in_sample['rows']}, registry values", f"{in_sample['rows']}, out of their folds")
    console.print(summary)
