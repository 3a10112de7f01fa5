"""`tokenpath validate`: predictions against published measurements."""

from __future__ import annotations

from typing import Optional

import typer

from tokenpath import files
from tokenpath.cli.app import app, console, write_json


@app.command(help="Compare predictions with published measurements.\n\nExample:\n\n"
             "  tokenpath validate --group nccl_allreduce --json -")
def validate(
    json_out: Optional[str] = typer.Option(None, "--json", help="write the rows to PATH, or '-' for stdout"),
    groups: Optional[list[str]] = typer.Option(None, "--group", help="only this group of rows (repeatable)"),
) -> None:
    from tokenpath.validate import print_validation, run_validation

    if json_out is not None:
        files.check_writable(json_out, "--json")
    rows = run_validation(set(groups) if groups else None)
    if json_out is not None:
        write_json(rows, json_out)
    if json_out != "-":
        print_validation(console, rows)
