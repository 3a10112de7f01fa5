"""`tokenpath validate`: predictions against published measurements."""

from __future__ import annotations

import typer

from tokenpath.cli.app import app, console, write_json
from tokenpath.config import files


@app.command(help="Compare predictions with published measurements.\n\nExamples:\n\n"
             "  tokenpath validate --group nccl_allreduce --json -\n\n"
             "  tokenpath validate --latency-rows my_measurements.toml   # your own rows, as latency.toml writes them")
def validate(
    json_out: str | None = typer.Option(None, "--json", help="write the rows to PATH, or '-' for stdout"),
    groups: list[str] | None = typer.Option(None, "--group", help="only this group of rows (repeatable)"),
    latency_rows: str | None = typer.Option(
        None, "--latency-rows", help="the latency group from this TOML file of rows tables (the form of "
                                     "catalog/validation/latency.toml) instead of the shipped one; alone, "
                                     "only that group"),
) -> None:
    from tokenpath.validate.groups import print_validation, run_validation

    if json_out is not None:
        files.check_writable(json_out, "--json")
    if latency_rows is not None and not groups:
        groups = ["latency"]
    rows = run_validation(set(groups) if groups else None, latency_rows)
    if json_out is not None:
        write_json(rows, json_out)
    if json_out != "-":
        print_validation(console, rows)
