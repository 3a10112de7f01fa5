"""`tokenpath validate`: predictions against published measurements."""

from __future__ import annotations

import typer

from tokenpath.cli.app import app, console, progress_bar, write_json
from tokenpath.config import files
from tokenpath.config.errors import UserError


@app.command(help="Compare predictions with published measurements.\n\nExamples:\n\n"
             "  tokenpath validate --group nccl_allreduce --json -\n\n"
             "  tokenpath validate --latency-rows my_measurements.toml   # your own rows, as latency.toml writes them"
             "\n\n  tokenpath validate --cross   # each latency source predicted with constants refitted on the others"
             "\n\n  tokenpath validate --cross --write-bands   # and regenerate the error bands' data"
             "\n\n  tokenpath validate --calibrated   # each configuration fitted at its lightest load, the others "
             "predicted")
def validate(
    json_out: str | None = typer.Option(
        None, "--json", help="write the rows (with --cross or --calibrated, their document) to PATH, or '-' for "
                             "stdout"),
    groups: list[str] | None = typer.Option(None, "--group", help="only this group of rows (repeatable)"),
    latency_rows: str | None = typer.Option(
        None, "--latency-rows", help="the latency group from this TOML file of rows tables (the form of "
                                     "catalog/validation/latency.toml) instead of the shipped one; alone, "
                                     "only that group"),
    cross: bool = typer.Option(False, "--cross", help="leave-one-source-out cross-validation of the latency group: "
                                                      "each source's rows predicted with the constants the rows set "
                                                      "refitted on the other sources' rows"),
    calibrated: bool = typer.Option(False, "--calibrated", help="each configuration of the latency rows measured "
                                                                "at 3 or more loads: `calibrate engine`'s fit on "
                                                                "its lightest row, its other rows predicted"),
    write_bands: bool = typer.Option(
        False, "--write-bands", help="with --cross: write each row's regime and errors to the shipped bands file "
                                     "(catalog/validation/bands.toml), which simulate's error bands come from"),
) -> None:
    from tokenpath.validate.groups import print_validation, run_validation

    if json_out is not None:
        files.check_writable(json_out, "--json")
    if cross and calibrated:
        raise UserError("--cross and --calibrated are two validations; give one of them")
    if write_bands and not cross:
        raise UserError("--write-bands: the bands come from the cross-validation; add --cross")
    if write_bands and latency_rows is not None:
        raise UserError("--write-bands: the shipped bands come from the shipped rows; drop --latency-rows")
    if write_bands:
        from tokenpath.validate.bands_build import bands_path

        files.check_writable(str(bands_path()), "--write-bands")
    if cross or calibrated:
        _latency_only(groups, "--cross" if cross else "--calibrated")
        if cross:
            _cross(latency_rows, json_out, write_bands)
        else:
            _calibrated(latency_rows, json_out)
        return
    if latency_rows is not None and not groups:
        groups = ["latency"]
    rows = run_validation(set(groups) if groups else None, latency_rows)
    if json_out is not None:
        write_json(rows, json_out)
    if json_out != "-":
        print_validation(console, rows)


def _latency_only(groups: list[str] | None, flag: str) -> None:
    from tokenpath.validate.latency import GROUP

    if groups and set(groups) != {GROUP}:
        other = next(g for g in groups if g != GROUP)
        raise UserError(f"{flag}: validates the latency group only, not {other!r}; drop --group or give "
                        f"--group {GROUP}")


def _calibrated(latency_rows: str | None, json_out: str | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from tokenpath.sim.forked import available_cpus
    from tokenpath.validate.calibrated import (
        calibrated_validation,
        calibrating_sources,
        configurations,
        print_calibrated,
    )
    from tokenpath.validate.cross import fold_fit, latency_errors
    from tokenpath.validate.latency import load_latency

    data = load_latency(latency_rows)
    quiet = json_out == "-"
    sources = calibrating_sources(data["rows"])
    folds = progress_bar(TextColumn("fitting the constants without {task.description}"), BarColumn(),
                         MofNCompleteColumn(), TimeElapsedColumn(), quiet=quiet)
    with folds:  # each source's fold of --cross: where its calibration starts
        task = folds.add_task("", total=len(sources))
        errors, _ = latency_errors(data, available_cpus())
        starts = {}
        for source in sources:
            folds.update(task, description=source)
            starts[source] = fold_fit(source, errors).values
            folds.advance(task)
    progress = progress_bar(TextColumn("fitting each configuration at its lightest load"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), quiet=quiet)
    with progress:
        task = progress.add_task("", total=len(configurations(data["rows"])))
        document = calibrated_validation(data["rows"], data["sharegpt"], starts, workers=available_cpus(),
                                         progress=lambda done: progress.advance(task, done))
    if json_out is not None:
        write_json(document, json_out)
    if not quiet:
        print_calibrated(console, document)


def _cross(latency_rows: str | None, json_out: str | None, write_bands: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from tokenpath.cli.app import err_console
    from tokenpath.sim.forked import available_cpus
    from tokenpath.validate.cross import cross_validate, latency_errors, print_cross
    from tokenpath.validate.latency import load_latency

    data = load_latency(latency_rows)
    quiet = json_out == "-"
    sources = len({row["source"] for row in data["rows"]})
    progress = progress_bar(TextColumn("cross-validating, fold {task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[simulations]} simulations"), TimeElapsedColumn(), quiet=quiet)
    with progress:
        task = progress.add_task("", total=sources, simulations=0)
        errors, group_fits = latency_errors(data, available_cpus(),
                                            lambda _: progress.update(task, simulations=errors.simulated))
        document = cross_validate(errors, on_fold=lambda done, source: progress.update(
            task, description=source, completed=done), elsewhere=group_fits)
        progress.update(task, completed=sources)
    if write_bands:
        from tokenpath.validate.bands_build import bands_path, build_bands
        from tokenpath.validate.bands_build import write_bands as write

        rows_progress = progress_bar(TextColumn("bands: each row simulated for its regime, and calibrated"),
                                     MofNCompleteColumn(), TimeElapsedColumn(), quiet=quiet)
        with rows_progress:
            rows_task = rows_progress.add_task("", total=None)
            bands = build_bands(data, document, available_cpus(), lambda k: rows_progress.advance(rows_task, k))
    if json_out is not None:
        write_json(document, json_out)
    if not quiet:
        print_cross(console, document)
    if write_bands:
        path = bands_path()
        write(bands, path)
        err_console.print(f"bands: {len(bands['rows'])} rows and {len(bands.get('calibrated', []))} calibrated "
                          f"predictions written to {files.shown(str(path))}", highlight=False)
