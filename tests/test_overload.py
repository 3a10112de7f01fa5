"""The bottleneck line sees overload: offered beyond what was served is said first, with the layer
that limits capacity; a run at half its capacity says nothing of it."""

from __future__ import annotations

import pytest

from tokenpath.diagnose.bottleneck import Load
from tokenpath.pipeline import simulate
from tokenpath.report.simulation import result_document
from tokenpath.scenario import load_scenario

# Llama-3.1-8B on one H100: it serves about 54 requests/s with every request sent at once.
SMALL = {"model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
         "workload.num_requests": 1000}


def _document(rate: float) -> tuple[dict, str]:
    return result_document(simulate(load_scenario(None, {**SMALL, "workload.arrival.rate": rate})))


def test_capacity_first():
    saturated, _ = _document(float("inf"))
    capacity = saturated["throughput"]["requests_per_s"]
    assert saturated["load"]["overloaded"] and saturated["load"]["offered_requests_per_s"] is None
    over, reason = _document(2.2 * capacity)
    assert over["load"]["overloaded"] is True
    assert reason.startswith(f"overloaded: offered {over['load']['offered_requests_per_s']:.3g} req/s, served ")
    assert over["load"]["served_requests_per_s"] == pytest.approx(capacity, rel=0.15)
    assert over["bottleneck"] == "compute" and "compute limits capacity" in reason
    half, reason = _document(0.5 * capacity)
    assert half["load"]["overloaded"] is False and "overloaded" not in reason
    assert half["load"]["offered_requests_per_s"] == pytest.approx(0.5 * capacity, rel=0.1)
    assert half["load"]["served_requests_per_s"] == pytest.approx(0.5 * capacity, rel=0.1)


def test_overload_is_served_well_below_offered():
    assert Load(100.0, 45.0, 40.0, False).overloaded  # admission queued
    assert Load(100.0, 95.0, 40.0, True).overloaded   # a pile of running requests, long run
    assert Load(float("inf"), 0.0, 40.0, False).overloaded
    assert not Load(100.0, 95.0, 40.0, False).overloaded  # a burst shorter than its E2Es
    assert not Load(34.0, 34.0, 32.7, True).overloaded


@pytest.mark.parametrize("seed", [0, 1])
def test_default_scenario_overloaded_at_2x_capacity_and_not_at_half_or_0_9x(seed):
    # The default scenario, 1,000 requests a run: capacity is the rate it serves with every request sent
    # at once (about 40 req/s); the verdict must flip between 0.9x and 2x of it.
    def run(rate: float) -> dict:
        document, _ = result_document(simulate(load_scenario(None, {"workload.num_requests": 1000, "seed": seed,
                                                                    "workload.arrival.rate": rate})))
        return document

    capacity = run(float("inf"))["load"]["served_requests_per_s"]
    assert 30 < capacity < 50
    over = run(2.0 * capacity)
    assert over["load"]["overloaded"] is True and over["bottleneck_reason"].startswith("overloaded: offered ")
    for share in (0.5, 0.9):
        under = run(share * capacity)
        assert under["load"]["overloaded"] is False, share
        assert "overloaded" not in under["bottleneck_reason"]
        assert under["load"]["offered_requests_per_s"] == pytest.approx(share * capacity, rel=0.1)
