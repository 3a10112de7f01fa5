"""What the catalog holds: `tokenpath scenario show|list`, `models`, `chips`."""

from __future__ import annotations

import sys
from typing import Any

import typer

from tokenpath.cli.app import app, console, scenario_app
from tokenpath.cli.options import load_with_flags, scenario_flags


@scenario_app.command("show", help="Print a scenario, every default filled in, as TOML."
                                   "\n\nExample:\n\n  tokenpath scenario show typical")
@scenario_flags()
def scenario_show(name: str | None = typer.Argument(None, help="catalog name or .toml path; default 'typical'"),
                  *, flags: dict[str, Any]) -> None:
    sys.stdout.write(load_with_flags(name, flags).to_toml())


@scenario_app.command("list", help="List the embedded scenarios.\n\nExample:\n\n  tokenpath scenario list")
def scenario_list() -> None:
    from tokenpath.sim.scenario import load_scenario, scenario_names

    for name in scenario_names():
        console.print(f"[bold]{name}[/bold]  {load_scenario(name).description}")


@app.command(help="List the models in the catalog.\n\nExample:\n\n  tokenpath models")
def models() -> None:
    from tokenpath.report.catalog import models_table

    console.print(models_table())


@app.command(help="List the chips in the catalog.\n\nExample:\n\n  tokenpath chips")
def chips() -> None:
    from tokenpath.report.catalog import chips_table

    console.print(chips_table())
