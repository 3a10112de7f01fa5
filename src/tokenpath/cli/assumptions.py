"""`tokenpath assumptions`: every constant that sets a prediction, with its unit, source and guard."""

from __future__ import annotations

from typing import Any

import typer

from tokenpath.cli.app import app, console, write_json
from tokenpath.cli.options import JsonOut, load_with_flags, scenario_flags
from tokenpath.config import files

ASSUMPTIONS_EXAMPLE = """
A scenario overrides any of them by name in its [assumptions] table (serving_gemm_fraction = 0.6,
host_step_s = "1 ms"), or applies a calibration file (calibration = "engine-calibration.toml").
Given a scenario, the list shows the values it runs with.

Examples:

  tokenpath assumptions

  tokenpath assumptions my.toml --json -
"""


@app.command(help="List the model's assumptions: name, value, unit, source and what guards each." + ASSUMPTIONS_EXAMPLE)
@scenario_flags()
def assumptions(
    scenario: str | None = typer.Argument(None, help="a scenario (.toml or catalog name): show the values it uses"),
    json_out: JsonOut = None,
    *, flags: dict[str, Any],
) -> None:
    from rich.table import Table

    from tokenpath.config.assumptions import listing
    from tokenpath.config.units import format_bandwidth, format_bytes, format_duration

    if json_out is not None:
        files.check_writable(json_out, "--json")
    chosen = scenario is not None or any(value is not None for value in flags.values())
    resolved = load_with_flags(scenario, flags).resolved_assumptions() if chosen else None
    rows = listing(resolved.values if resolved is not None else None)
    for row in rows:
        if resolved is not None:
            row["origin"] = ("scenario" if row["name"] in resolved.overridden
                             else f"calibration {resolved.calibrated[row['name']]}"
                             if row["name"] in resolved.calibrated
                             else "default")
    if json_out is not None:
        write_json(rows, json_out)  # type: ignore[arg-type]  # a list: one object per assumption
        if json_out == "-":
            return
    shown = {"s": format_duration, "bytes": format_bytes, "B/s": format_bandwidth}
    table = Table(title="assumptions" + (f" of {scenario or 'typical'}" if chosen else ""))
    for column in ("name", "value", "source", "guarded by") + (("from",) if resolved is not None else ()):
        table.add_column(column, overflow="fold", no_wrap=column in ("name", "value"))
    for row in rows:
        value = shown.get(row["unit"], lambda v: f"{v:.4g}")(row["value"])
        table.add_row(row["name"], value, row["source"], row["guarded_by"],
                      *((row["origin"],) if resolved is not None else ()))
    console.print(table)
