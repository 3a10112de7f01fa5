"""Simulating a scenario with overrides, many at a time: the one way levers and capacity run a what-if
(the same steps as `tokenpath simulate --set`, so the numbers are the same)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpath.config.errors import UserError
from tokenpath.sim.forked import available_cpus, can_fork, map_forked
from tokenpath.sim.overrides import apply_overrides
from tokenpath.sim.scenario import Scenario, build_scenario


@dataclass(frozen=True)
class Base:
    """A scenario's raw table as read (with the command line's changes), where it came from and its
    folder: every what-if starts from a copy of it."""

    table: dict[str, Any]
    source: str
    base_dir: Path | None

    def scenario(self, overrides: dict[str, Any] | None = None) -> Scenario:
        table = apply_overrides(copy.deepcopy(self.table), overrides or {})
        return build_scenario(table, self.source, self.base_dir)


@dataclass(frozen=True)
class Outcome:
    """A what-if's result document, or the one-line reason it could not be simulated."""

    summary: dict[str, Any] | None
    error: str | None = None
    chips: dict[str, int] = field(default_factory=dict)  # every chip it runs on by name (objective.chips_in_use)


def simulate_summary(base: Base, overrides: dict[str, Any]) -> Outcome:
    """The result document of `base` with `overrides`, as `tokenpath simulate` writes it; a scenario
    the overrides make impossible (a split that does not divide, a model that does not fit) is an
    Outcome with its error instead."""
    from tokenpath.sim.simulate import simulate
    from tokenpath.whatif.objective import chips_in_use

    try:
        scenario = base.scenario(overrides)
        document = simulate(scenario, workers=1).summary
    except UserError as error:
        return Outcome(None, str(error))
    except OverflowError:
        return Outcome(None, "the simulated run lasts more than 292 years (the range of int64 nanoseconds)")
    return Outcome(document, None, chips_in_use(scenario))


def simulate_many(base: Base, override_sets: Sequence[dict[str, Any]], workers: int | None = None,
                  progress: Callable[[int], None] | None = None) -> list[Outcome]:
    """`simulate_summary` for each override set, in up to `workers` forked processes (default: one per
    CPU); the results in the order given, and the same for any number of workers."""
    workers = min(len(override_sets), workers or available_cpus())

    def work(overrides: dict[str, Any], report: Callable[[int], None]) -> Outcome:
        outcome = simulate_summary(base, overrides)
        report(1)
        return outcome

    if workers > 1 and can_fork():
        return map_forked(work, list(override_sets), workers, progress)
    return [work(overrides, progress or (lambda _: None)) for overrides in override_sets]
