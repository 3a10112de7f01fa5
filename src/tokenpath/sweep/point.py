"""One point of a sweep: a full simulation (the same pipeline as `tokenpath simulate`), as one flat row.

This is what a local worker process or a Ray task runs; it takes and returns plain data only.
"""

from __future__ import annotations

import json
from typing import Any

from tokenpath.config.errors import UserError
from tokenpath.sim.overrides import flatten
from tokenpath.sweep.spec import point_id, scenario_for


def flatten_summary(document: dict[str, Any]) -> dict[str, Any]:
    """Nested summary keys joined with dots (`latency_s.ttft.p99`); lists become JSON text."""
    return {key: json.dumps(value) if isinstance(value, (list, tuple)) else value
            for key, value in flatten(document).items()}


def axis_columns(columns: list[str]) -> list[str]:
    """A sweep table's axis columns: each row is its point's id, the sweep's fingerprint, its axis values,
    then its summary, which opens with `schema` (simulate_point)."""
    if "sweep" not in columns or "schema" not in columns:
        return []
    return columns[columns.index("sweep") + 1:columns.index("schema")]


def simulate_point(scenario: str, overrides: dict[str, Any], values: dict[str, Any], sweep: str) -> dict[str, Any]:
    """The row of one point: its id, the sweep's fingerprint, its axis values, then every summary metric.
    A metric named like an axis key is kept as `summary.<key>`."""
    from tokenpath.sim.simulate import prepare, simulate

    try:
        simulation = simulate(prepare(scenario_for(scenario, overrides, values)), workers=1)
    except UserError as error:  # a deployment that cannot be built: say which point
        shown = ", ".join(f"{key}={value!r}" for key, value in values.items())
        raise UserError(f"point {shown}: {error}") from None
    row: dict[str, Any] = {"point": point_id(values), "sweep": sweep, **values}
    for key, value in flatten_summary(simulation.summary).items():
        row[f"summary.{key}" if key in row else key] = value
    return row
