"""What a what-if is judged by: a summary metric by its dotted path, goodput at the scenario's SLO, or
the cost per million output tokens from a chip price table; and which way is better."""

from __future__ import annotations

import difflib
import math
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted
from tokenpath.sim.metrics import higher_is_better, known_metrics
from tokenpath.sim.summary import metric_value

if TYPE_CHECKING:
    from tokenpath.sim.scenario import Scenario

# The default: p99 time to first visible text, then mean E2E (see `Objective.default`).
DEFAULT_OBJECTIVE = "latency_s.ttfv.p99"
DEFAULT_TIE_BREAK = "latency_s.e2e.mean"
# Levers are ranked by their change in the objective rounded to steps of this share of the baseline's
# value; levers in the same step are ordered by the tie-break metric (levers.py, `rank_key`). Whether a
# change stands out of the noise is measured over draws of the workload (levers.py, `draw_changes`).
RESOLUTION_SHARE = 0.01
COST = "cost"
COST_NAME = "cost per million output tokens (USD)"
ALIASES = {"goodput": "throughput.goodput_requests_per_s"}


@dataclass(frozen=True)
class Prices:
    """US dollars per chip-hour by catalog chip name, and where each figure comes from."""

    usd_per_hour: dict[str, float]
    source: dict[str, str]

    @staticmethod
    def load(path: str | None = None) -> Prices:
        """The embedded table (catalog/prices.toml), or a user's file of the same format."""
        if path is None:
            text = (resources.files("tokenpath.catalog") / "prices.toml").read_text(encoding="utf-8")
            where = "catalog prices.toml"
        else:
            files.check_path(path, "--prices")
            text, where = files.read_text(path, "--prices file"), files.shown(path)
        table = files.parse_toml(text, where)
        usd, source = {}, {}
        for chip, row in table.items():
            if not isinstance(row, dict) or set(row) != {"usd_per_hour", "source"}:
                raise UserError(f"{where}: [{chip}] needs exactly usd_per_hour (a number) and source (where it "
                                "comes from)")
            price = row["usd_per_hour"]
            if (isinstance(price, bool) or not isinstance(price, (int, float))
                    or not (price > 0 and math.isfinite(price))):
                raise UserError(f"{where}: [{chip}] usd_per_hour must be a price > 0, got {quoted(price)}")
            usd[chip], source[chip] = float(price), str(row["source"])
        return Prices(usd, source)



def application_chips(scenario: Scenario) -> dict[str, int]:
    """The chips the scenario's application stages run on, besides the deployment's, by catalog name: one
    for each stage served by a model on a chip of its own, and one for each index searched on a chip of
    another kind than the deployment's (an index on the deployment's kind scans on its GPUs:
    docs/application.md, "Retrieval from an index")."""
    from tokenpath.application.served import SHARED
    from tokenpath.compute.chip import load_chip

    if scenario.application is None:
        return {}
    own = load_chip(scenario.deployment.chip).name
    names = [stage.served.on for stage in scenario.application.stages
             if stage.served is not None and stage.served.on not in ("cpu", SHARED)]
    names += [stage.index.on for stage in scenario.application.stages
              if stage.index is not None and stage.index.on != "cpu" and load_chip(stage.index.on).name != own]
    return dict(Counter(load_chip(name).name for name in names))


def chips_in_use(scenario: Scenario) -> dict[str, int]:
    """Every chip the scenario runs on, by catalog name: the deployment's and its application's."""
    from tokenpath.compute.chip import load_chip

    chips = Counter(application_chips(scenario))
    chips[load_chip(scenario.deployment.chip).name] += scenario.deployment.chips
    return dict(chips)


@dataclass(frozen=True)
class Objective:
    """A metric to improve, which way is better, and a metric that breaks near-ties."""

    metric: str                      # a dotted summary path, or COST
    tie_break: str | None = None
    prices: Prices | None = None

    @staticmethod
    def parse(text: str | None, prices: Prices | None = None) -> Objective:
        if text is None:
            return Objective(DEFAULT_OBJECTIVE, DEFAULT_TIE_BREAK)
        text = ALIASES.get(text.strip(), text.strip())
        if text == COST:
            return Objective(COST, DEFAULT_OBJECTIVE, prices or Prices.load())
        objective = Objective(text)
        objective.check()
        return objective

    def check(self) -> None:
        """An objective that is no metric of the summary schema is a one-line error naming the closest."""
        if self.metric == COST or self.metric in known_metrics():
            return
        close = difflib.get_close_matches(self.metric, known_metrics(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"--objective: {quoted(self.metric)} is not a metric of the summary; {hint}use goodput, cost "
                        "or a dotted path: latency_s.METRIC.STAT (METRIC ttft, ttfv, tpot, itl, e2e; STAT mean, p50, "
                        "p90, p99, p999), throughput.output_tokens_per_s, throughput.requests_per_s, "
                        "throughput.goodput_requests_per_s, attribution_s.LAYER (queue, compute, traffic, delivery), "
                        "continuity.qoe.STAT (mean, p1, p10, p50, below_0_9), continuity.stalls_per_request, "
                        "continuity.stall_s_per_request, continuity.requests_with_stalls, continuity.stall_s_max")

    @property
    def name(self) -> str:
        return COST_NAME if self.metric == COST else self.metric

    @property
    def higher_is_better(self) -> bool:
        """Cost is better low; a metric's direction is metrics.py's (throughput and QoE high, the rest low)."""
        return self.metric != COST and bool(higher_is_better(self.metric))

    def value(self, summary: dict[str, Any], chips: dict[str, int]) -> float | None:
        """The objective's value for one simulated scenario (`chips`, its chip counts by name, for the cost:
        every chip it runs on, each at its own price; None where one has no price)."""
        if self.metric != COST:
            value = metric_value(summary, self.metric)
            return float(value) if isinstance(value, (int, float)) else None
        tokens_per_s = summary["throughput"]["output_tokens_per_s"]
        if self.prices is None or self.unpriced(chips) or not tokens_per_s:
            return None
        usd_per_hour = sum(count * self.prices.usd_per_hour[chip] for chip, count in chips.items())
        return usd_per_hour / 3600.0 / tokens_per_s * 1e6

    def unpriced(self, chips: dict[str, int]) -> list[str]:
        """The chips of `chips` the price table has no price for."""
        prices = self.prices.usd_per_hour if self.prices else {}
        return [chip for chip in chips if chip not in prices]

    def better(self, change: float) -> float:
        """A change expressed so that larger is better."""
        return change if self.higher_is_better else -change
