"""Ranked levers: simulate a scenario and each what-if in full, and order them by the change in an
objective, each with the layer its change came from. Users add their own levers in a TOML file."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenpath.config import files
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError
from tokenpath.sim.overrides import apply_overrides, flatten
from tokenpath.sim.scenario import MAX_SEED, build_scenario
from tokenpath.sim.summary import APPLICATION, LAYERS
from tokenpath.whatif.catalog import Lever, catalog
from tokenpath.whatif.objective import RESOLUTION_SHARE, Objective
from tokenpath.whatif.run import Base, Outcome, simulate_many

SCHEMA = "tokenpath.levers/1"
NAME_CHARS = 60  # of a lever's name in an error line
# Each lever and the baseline run on this many draws of the workload, the scenario's seed and the next ones:
# a lever's change on each draw tells it from noise (`draw_changes`).
DEFAULT_DRAWS = 3
MAX_DRAWS = 20  # a bound on --draws


class _UserLever(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200)
    group: str = Field("custom", min_length=1, max_length=40)
    overrides: dict[str, Any] = Field(min_length=1, description="dotted scenario keys and their values")

    @field_validator("overrides")
    @classmethod
    def _dotted(cls, value: dict[str, Any]) -> dict[str, Any]:
        return flatten(value)


def read_levers_file(path: str, base: Base) -> list[Lever]:
    """A user's `[[levers]]` (name, group, overrides), each checked against the scenario `base`: an unknown
    key (in a lever or its overrides), a value the scenario refuses and a name given twice are errors.
    A lever the scenario accepts but cannot run (a split that does not divide) is listed as not applicable."""
    files.check_path(path, "--levers")
    where = files.shown(path)
    table = files.parse_toml(files.read_text(path, "levers file"), where)
    rows = table.get("levers")
    if set(table) != {"levers"} or not isinstance(rows, list) or not rows:
        raise UserError(f"{where}: a levers file holds [[levers]] tables only (name, group, overrides), "
                        f"e.g. [[levers]] name = \"TP4\" overrides = {{ \"deployment.tp\" = 4 }}")
    levers: list[Lever] = []
    numbers: dict[str, int] = {}  # of the levers by name
    for number, row in enumerate(rows, 1):
        name = row.get("name") if isinstance(row, dict) else None
        source = f"{where}: lever {number}" + (f" ({_clip(name)})" if isinstance(name, str) else "")
        try:
            lever = _UserLever.model_validate(row)
        except ValidationError as error:
            raise UserError(explain(error, source, _UserLever)) from None
        if lever.name in numbers:
            raise UserError(f"{source}: lever {numbers[lever.name]} has this name too; give each lever its own name")
        # An unknown key or a refused value: the lever, its key and why.
        build_scenario(apply_overrides(copy.deepcopy(base.table), lever.overrides, flag=f"{source}:"), source,
                       base.base_dir)
        numbers[lever.name] = number
        levers.append(Lever(lever.name, lever.group, lever.overrides))
    return levers


def _clip(name: str) -> str:
    """A lever's name as an error line shows it: at most NAME_CHARS characters."""
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "..."


def _change(objective: Objective, base: Outcome, outcome: Outcome, base_value: float) -> dict[str, Any]:
    """How a lever moved the objective and each layer's mean time, and the layer that moved most."""
    value = objective.value(outcome.summary, outcome.chips)
    delta = None if value is None else value - base_value
    change: dict[str, Any] = {
        "value": value, "baseline": base_value, "delta": delta,
        "relative": delta / abs(base_value) if delta is not None and base_value else None,
        "better": objective.better(delta) if delta is not None else None,
    }
    if objective.prices is not None:  # what the cost prices
        change["chips"] = outcome.chips
    if objective.tie_break is not None:
        tie = Objective(objective.tie_break)
        before = tie.value(base.summary, base.chips)
        after = tie.value(outcome.summary, outcome.chips)
        change["tie_break"] = {"metric": tie.metric, "value": after, "baseline": before,
                               "better": tie.better(after - before) if None not in (after, before) else None}
    parts_before, parts_after = base.summary["attribution_s"], outcome.summary["attribution_s"]
    if parts_before and parts_after:
        layers = LAYERS + ((APPLICATION,) if APPLICATION in parts_before and APPLICATION in parts_after else ())
        moved = {part: parts_after[part] - parts_before[part] for part in layers}  # (not the details)
        change["attribution_s"] = moved
        layer = max(moved, key=lambda part: abs(moved[part]))
        change["layer"] = layer if moved[layer] else None  # (a change that moved no layer names none)
    return change


def _no_price(objective: Objective, outcome: Outcome) -> str:
    """Why a run has no cost: the chips it runs on that the price table leaves out (or no output)."""
    missing = objective.unpriced(outcome.chips)
    if not missing:
        return "no output tokens to price"
    return f"no price for {', '.join(missing)} in the price table"


def _value(objective: Objective, outcome: Outcome) -> float | None:
    """The objective's value of a run; None where it could not be simulated or has none."""
    return None if outcome.summary is None else objective.value(outcome.summary, outcome.chips)


# The confidence with which a lever's change over its draws is told from no change (draw_changes).
NOISE_CONFIDENCE = 0.95


def draw_changes(objective: Objective, base: list[Outcome], lever: list[Outcome]) -> dict[str, Any]:
    """A lever's change of the objective on each draw of the workload (the same requests as the baseline's
    draw), their mean and sample standard deviation, and whether no change lies within the mean's 95%
    confidence interval (`within_noise`: a change another draw could reverse; None from fewer than two
    draws). The interval is Student's t's for so few draws (NOISE_CONFIDENCE): 4.3 standard errors either
    side at 3 draws, where two would call a change of no effect real about one time in six. A deterministic
    change (a shorter round trip) moves every draw alike and stands out of the noise however small; one
    that only reshuffles batches moves the draws either way."""
    deltas = []
    for before, after in zip(base, lever):
        values = _value(objective, before), _value(objective, after)
        deltas.append(None if None in values else values[1] - values[0])
    known = [delta for delta in deltas if delta is not None]
    mean = statistics.fmean(known) if known else None
    spread = statistics.stdev(known) if len(known) > 1 else None
    within = None
    if spread is not None:
        from scipy.special import stdtrit  # (imported here: a lever run of one draw needs none)

        t = float(stdtrit(len(known) - 1, 0.5 + NOISE_CONFIDENCE / 2))
        within = abs(mean) <= t * spread / math.sqrt(len(known))
    return {"deltas": deltas, "mean": mean, "spread": spread, "within_noise": within}


def rank_key(lever: dict[str, Any], step: float) -> tuple:
    """A lever's place in the ranking, best first, as a sort key: (1) the improvement in the objective
    rounded to whole `step`s (RESOLUTION_SHARE of the baseline's value), larger first; (2) within a step,
    its direction (`direction`): an improvement that stands out of the draws' noise, one within it, no
    change, a worsening within the noise, one out of it; (3) the improvement in the tie-break metric,
    larger first; (4) the exact improvement; (5) the name. One key per lever, so the order is total and
    every pair of levers compares the same way whatever the others are. A lever without a value comes
    last; a missing tie-break counts as no change."""
    change = lever["change"]
    better = change["better"]
    if better is None:
        return (1, 0.0, 0, 0.0, 0.0, lever["name"])
    bucket = math.floor(better / step + 0.5) if step > 0 else better
    tie = (change.get("tie_break") or {}).get("better") or 0.0
    return (0, -bucket, -direction(change), -tie, -better, lever["name"])


def direction(change: dict[str, Any]) -> int:
    """A change's direction for the ranking within a step: 2 an improvement out of the draws' noise, 1 one
    within it (or with one draw), 0 none, -1 a worsening within the noise, -2 one out of it. Within 1% of
    the baseline a worsening and an improvement round to the same step; the improvement goes first."""
    better = change["better"]
    if not better:
        return 0
    certain = (change.get("draws") or {}).get("within_noise") is False
    return (1 + certain) * (1 if better > 0 else -1)


def rank(levers: list[dict[str, Any]], base_value: float) -> list[dict[str, Any]]:
    """The levers best first by `rank_key`."""
    step = RESOLUTION_SHARE * abs(base_value)
    return sorted(levers, key=lambda lever: rank_key(lever, step))


def run_levers(base: Base, objective: Objective, extra: list[Lever] | None = None, use_catalog: bool = True,
               workers: int | None = None, progress: Callable[[int], None] | None = None,
               here: Path | None = None, draws: int = DEFAULT_DRAWS) -> dict[str, Any]:
    """The levers document: the objective, the baseline's summary, the levers ranked best first (each
    with its overrides, summary and change) and the levers skipped with their reasons. Every run is
    simulated on `draws` draws of the workload (the scenario's seed and the next ones): the summaries and
    the ranking are the scenario's own draw's, and each change also says how it moved on every draw
    (`draw_changes`)."""
    scenario = base.scenario()
    levers = (catalog(scenario, base.table, here) if use_catalog else []) + list(extra or [])
    runnable = [lever for lever in levers if lever.skipped is None]
    seeds = [(scenario.seed + k) % (MAX_SEED + 1) for k in range(draws)]
    # Each run on every draw, the scenario's own first: (1 + levers) x draws outcomes.
    runs = [{}] + [lever.overrides for lever in runnable]
    outcomes = simulate_many(base, [{**overrides, **({"seed": seed} if k else {})}
                                    for overrides in runs for k, seed in enumerate(seeds)], workers, progress)
    by_run = [outcomes[n * draws:(n + 1) * draws] for n in range(len(runs))]
    baseline = by_run[0][0]
    if baseline.summary is None:
        raise UserError(baseline.error or "the scenario could not be simulated")
    base_value = _value(objective, baseline)
    if base_value is None and objective.prices is not None:
        raise UserError(f"--objective cost: {_no_price(objective, baseline)}; give --prices FILE "
                        "(see `tokenpath levers --help`)")
    if base_value is None:
        raise UserError(f"--objective {objective.metric}: the baseline has no value for it (e.g. no request "
                        "completed); choose another objective")
    ranked, skipped = [], [{"name": lever.name, "group": lever.group, "overrides": lever.overrides,
                            "reason": lever.skipped} for lever in levers if lever.skipped is not None]
    for lever, lever_draws in zip(runnable, by_run[1:]):
        outcome = lever_draws[0]
        if outcome.summary is None:
            skipped.append({"name": lever.name, "group": lever.group, "overrides": lever.overrides,
                            "reason": outcome.error})
            continue
        change = _change(objective, baseline, outcome, base_value)
        if change["value"] is None:
            skipped.append({"name": lever.name, "group": lever.group, "overrides": lever.overrides,
                            "reason": _no_price(objective, outcome) if objective.prices
                            else f"no value for {objective.metric}"})
            continue
        change["draws"] = draw_changes(objective, by_run[0], lever_draws)
        ranked.append({"name": lever.name, "group": lever.group, "overrides": lever.overrides,
                       "summary": outcome.summary, "change": change})
    ranked = rank(ranked, base_value)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "objective": {"metric": objective.metric, "name": objective.name,
                      "better": "higher" if objective.higher_is_better else "lower",
                      "tie_break": objective.tie_break, "value": base_value,
                      "resolution": RESOLUTION_SHARE * abs(base_value),
                      "draws": {"seeds": seeds, "values": [_value(objective, draw) for draw in by_run[0]]},
                      **({"chips": baseline.chips} if objective.prices is not None else {})},
        "baseline": baseline.summary,
        "levers": ranked,
        "skipped": skipped,
    }
    if objective.prices is not None:
        document["objective"]["prices"] = {chip: {"usd_per_hour": price, "source": objective.prices.source[chip]}
                                           for chip, price in objective.prices.usd_per_hour.items()}
    return document
