"""The Pareto frontier of a sweep's rows on two metrics, each to be maximized or minimized."""

from __future__ import annotations

from typing import Any

from tokenpath.config.errors import UserError
from tokenpath.sim.metrics import higher_is_better


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """`X[:max|min],Y[:max|min]` -> [(metric, "max"|"min"), ...]; directions inferred where left out."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise UserError(f"--pareto: give two metrics, X,Y (each optionally :max or :min), got {text!r}")
    objectives = []
    for part in parts:
        metric, _, direction = part.partition(":")
        if not direction:
            direction = _infer(metric)
        if direction not in ("max", "min"):
            raise UserError(f"--pareto: {part!r}: the direction is max or min, e.g. {metric}:min")
        objectives.append((metric, direction))
    return objectives


def _infer(metric: str) -> str:
    """The direction metrics.py knows for the metric: times and stalls better low, throughput and QoE high."""
    higher = higher_is_better(metric)
    if higher is not None:
        return "max" if higher else "min"
    raise UserError(f"--pareto: cannot tell whether {metric!r} is better high or low; write {metric}:max or "
                    f"{metric}:min")


def frontier(rows: list[dict[str, Any]], objectives: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The rows no other row beats on both metrics (at least as good on both, better on one), sorted
    by the first metric, best first. Rows without a value for a metric are left out."""
    if rows:
        for metric, _ in objectives:
            if metric not in rows[0]:
                known = ", ".join(key for key in rows[0] if key.startswith(("latency_s.", "throughput.")))
                raise UserError(f"--pareto: no metric {metric!r} in the rows; e.g. {known}")
    sign = [1.0 if direction == "max" else -1.0 for _, direction in objectives]
    scored = []
    for row in rows:
        values = [row.get(metric) for metric, _ in objectives]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            scored.append((tuple(s * v for s, v in zip(sign, values)), row))
    best = []
    for score, row in scored:
        beaten = any(all(o >= s for o, s in zip(other, score)) and other != score for other, _ in scored)
        if not beaten:
            best.append((score, row))
    best.sort(key=lambda item: item[0], reverse=True)
    return [row for _, row in best]
