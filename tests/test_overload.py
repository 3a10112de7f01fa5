"""The bottleneck line sees overload: offered beyond what was served is said first, with the layer
that limits capacity; a run at half its capacity says nothing of it."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpath import load_scenario, simulate
from tokenpath.config.units import format_number
from tokenpath.diagnose.overload import Load, Steady, load_of, verdict_line
from tokenpath.sim.document import result_document

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


def test_overload_is_admission_queued_ttft_climbing_or_a_growing_backlog():
    assert Load(100.0, 45.0, 40.0).overloaded  # admission queued
    assert Load(float("inf"), 0.0, 40.0).overloaded
    assert Load(100.0, 95.0, 90.0, ttft_trend=2.5).overloaded
    assert Load(100.0, 95.0, 90.0, e2e_trend=2.5).overloaded
    assert not Load(100.0, 95.0, 90.0, ttft_trend=1.5, e2e_trend=1.5).overloaded
    # After it filled, 1,000 sends met 200 in the system: 800 finished is 20% growth, beyond 15% + 2 x 2%.
    assert Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 800, 200)).overloaded
    assert not Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 830, 200)).overloaded
    # The same growth over few sends is within a stable run's noise.
    assert not Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(1.0, 100, 80, 200)).overloaded
    assert not Load(34.0, 34.0, 32.7).overloaded


def test_a_backlog_that_grew_by_a_few_percent_after_filling_was_still_filling():
    # 1,000 sends after filling met 200 in the system (noise: sqrt(400) / 1000 = 2%).
    filling = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 900, 200))  # 10% > 5% + 2 x 2%
    assert filling.steady.growth == pytest.approx(0.10) and filling.filling
    assert not filling.overloaded and filling.settled is False
    assert filling.caveat().startswith("still filling") and "grew by 10% of the requests sent" in filling.caveat()
    document = filling.document()
    assert document["settled"] is False and document["backlog_growth"] == pytest.approx(0.10)
    settled = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 920, 200))  # 8% < 9%
    assert settled.settled is True and settled.caveat() == "" and not settled.overloaded
    overloaded = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 800, 200))  # 20%: growing
    assert overloaded.overloaded and not overloaded.filling and overloaded.settled is False
    assert Load(100.0, 95.0, 90.0).settled is None  # too short to watch


def _times(rate_per_s: float, e2e_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = len(e2e_s)
    sent = np.rint(np.arange(n) / rate_per_s * 1e9).astype(np.int64)
    e2e = np.rint(e2e_s * 1e9).astype(np.int64)
    return sent, np.full(n, 50_000_000, np.int64), e2e, np.ones(n, bool)


def test_a_run_of_one_request_was_sent_over_no_time():
    one = load_of(*_times(20.0, np.full(1, 5.0)))
    assert one.span_e2es == 0.0 and one.document()["span_e2es"] == 0.0
    assert one.caveat() == ("a short run, sent over 0.0 median E2Es: overload judged by admission and latency "
                            "trends only")


def test_a_backlog_that_grows_through_a_long_run_is_overload_at_any_send_rate_ratio():
    # 20 req/s for 100 s, each request 5 s in the system: stable, confident.
    stable = load_of(*_times(20.0, np.full(2000, 5.0)))
    assert stable.confident and not stable.overloaded and stable.document()["confidence"] == "high"
    assert stable.steady.served_per_s == pytest.approx(20.0, rel=0.02)
    # Served at 16 req/s: the n-th request finishes at n / 16 s, so its time in the system grows.
    n = np.arange(2000)
    growing = load_of(*_times(20.0, 5.0 + n / 15.0 - n / 20.0))
    assert growing.overloaded and growing.steady.served_per_s == pytest.approx(15.0, rel=0.05)
    assert any("served 15" in sign for sign in growing.signs())


def test_a_run_served_a_little_below_its_sends_is_still_filling_not_overloaded():
    # Sent at 20 req/s, 10 s in the system at first, finishing at 18.5 req/s: the backlog gains 7.5% of
    # the sends, and E2E grows 1.55x from the first quarter to the last, short of the overload trend.
    n = np.arange(2000)
    filling = load_of(*_times(20.0, 10.0 + n / 18.5 - n / 20.0))
    assert not filling.overloaded and filling.settled is False
    assert filling.steady.growth == pytest.approx(0.075, abs=0.01)
    assert load_of(*_times(20.0, np.full(2000, 5.0))).settled is True


def test_prompts_held_before_the_run_are_left_out_of_the_ttft_trend():
    # 40 requests, the first 10 of them held in the server's cache (5 ms first tokens), the rest 50 ms:
    # read together, TTFT grew 10x from the first quarter to the last; without the held ones it is flat.
    sent, ttft, e2e, completed = _times(1.0, np.full(40, 5.0))
    ttft[:10] = 5_000_000
    held = np.arange(40) < 10
    assert load_of(sent, ttft, e2e, completed).ttft_trend == pytest.approx(10.0)
    assert load_of(sent, ttft, e2e, completed).overloaded
    alike = load_of(sent, ttft, e2e, completed, held)
    assert alike.ttft_trend == pytest.approx(1.0) and not alike.overloaded


def test_a_run_shorter_than_two_fills_is_judged_by_admission_and_ttft_and_says_so():
    short = load_of(*_times(20.0, np.full(100, 5.0)))  # 5 s of sends, 5 s in the system
    assert not short.confident and short.steady is None and short.document()["confidence"] == "low"
    assert "short run" in short.caveat() and not short.overloaded


@pytest.mark.parametrize(("rate", "overloaded"), [(35, False), (50, True)])
def test_default_scenario_at_50_req_s_is_overloaded_by_its_growing_batch_and_at_35_is_not(rate, overloaded):
    # Every request sent at once, the default deployment serves about 43.7 req/s. At 50 req/s nothing
    # queues for admission (the batch grows instead), and the old served/offered ratio was 1.14. 3,000
    # requests: a run long enough to watch the backlog after it filled.
    document, reason = result_document(simulate(load_scenario(None, {"workload.arrival.rate": float(rate),
                                                                     "workload.num_requests": 3000})))
    load = document["load"]
    assert load["overloaded"] is overloaded and load["confidence"] == "high"
    assert reason.startswith("overloaded") is overloaded


def test_tp32_over_a_rail_fabric_overloads_in_a_run_shorter_than_two_e2es():
    # TTFT climbs 3.7x from the first quarter to the last.
    document, reason = result_document(simulate(load_scenario(None, {
        "deployment.chip": "h100", "deployment.chips": 32, "deployment.fabric": "h100-4x8-rail",
        "deployment.tp": 32, "workload.arrival.rate": 60.0})))
    load = document["load"]
    assert load["overloaded"] is True and load["confidence"] == "low" and load["ttft_trend"] > 3
    assert "short run" in reason and "traffic" in reason


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


def test_a_short_run_near_capacity_says_it_was_still_filling_and_reads_lower_than_a_long_one():
    # MLPerf Inference v4.1's H100 Llama-2-70B server deployment (diagnose/overload.py): four TP2
    # replicas at 75 req/s, near their capacity. 6,000 requests end while the batch still grows (p50
    # TPOT 68 ms); 40,000 settle, their p50 TPOT half as long again (104 ms).
    scenario = {"model.name": "llama-2-70b", "model.precision": "fp8", "model.kv_cache_precision": "fp8",
                "deployment.chip": "h100", "deployment.chips": 8, "deployment.tp": 2,
                "engine.scheduler": "trtllm", "engine.max_num_seqs": 1024, "engine.eager_host": False,
                "workload.input": {"kind": "lognormal", "mean": 300, "sd": 250, "max": 1024},
                "workload.output": {"kind": "lognormal", "mean": 290, "sd": 200, "max": 1024},
                "workload.arrival.rate": 75.0, "delivery.network_rtt": "0 ms"}
    short, reason = result_document(simulate(load_scenario(None, {**scenario, "workload.num_requests": 6000})))
    assert short["load"]["settled"] is False and not short["load"]["overloaded"]
    assert "still filling" in reason
    long, reason = result_document(simulate(load_scenario(None, {**scenario, "workload.num_requests": 40000})))
    assert long["load"]["settled"] is True and "still filling" not in reason
    assert long["latency_s"]["tpot"]["p50"] > 1.3 * short["latency_s"]["tpot"]["p50"]


def test_levers_and_sweep_frontiers_mark_a_run_still_filling_or_overloaded(monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from tokenpath.cli import levers, sweep

    def summary(settled, overloaded=False):
        return {"envelope": {"validated": True, "outside": []},
                "load": {"settled": settled, "overloaded": overloaded,
                         "confidence": "low" if settled is None else "high"}}

    console = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(levers, "console", console)
    change = {"value": 1.0, "relative": 0.0, "better": 0.0, "draws": {"within_noise": None}}
    document = {"objective": {"metric": "latency_s.ttft.p99", "name": "TTFT p99", "better": "lower",
                              "tie_break": None, "value": 1.0, "draws": {"seeds": [0], "values": [1.0]}},
                "baseline": summary(True), "skipped": [],
                "levers": [{"name": "more chips", "group": "wider", "change": change, "summary": summary(False)},
                           {"name": "half the chips", "group": "wider", "change": change,
                            "summary": summary(False, overloaded=True)},
                           {"name": "TP4", "group": "wider", "change": change, "summary": summary(None)}]}
    levers._print(document, 100)
    out = console.file.getvalue()
    assert "more chips ~" in out and "half the chips !" in out and "half the chips ! ~" not in out
    assert "TP4 ~" not in out and "TP4 !" not in out and "baseline ~" not in out and "baseline !" not in out
    # too short to watch: neither still filling nor overloaded can be told, and the table says so
    assert "TP4 ?" in out and "more chips ~ ?" not in out and "baseline ?" not in out
    assert "~ still filling when its sends stopped (load.settled)" in out
    assert "! overloaded (load.overloaded): its latencies are a growing queue's" in out
    assert "? too short to watch (load.confidence low, load.settled null)" in out
    console = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(sweep, "console", console)
    rows = [{"point": "a", "x": 1.0, "load.settled": False, "load.overloaded": False, "load.confidence": "high"},
            {"point": "b", "x": 2.0, "load.settled": True, "load.overloaded": False, "load.confidence": "high"},
            {"point": "c", "x": 3.0, "load.settled": None, "load.overloaded": False, "load.confidence": "low"},
            {"point": "d", "x": 4.0, "load.settled": None, "load.overloaded": True, "load.confidence": "low"}]
    sweep._write_pareto(tmp_path / "out.csv", [], [("x", "max")], rows)
    out = console.file.getvalue()
    assert "a ~" in out and "b ~" not in out and "~ still filling" in out
    assert "c ?" in out and "d !" in out and "d ! ?" not in out and "a ~ ?" not in out and "? too short" in out


def test_a_run_without_a_bottleneck_line_says_its_load_when_it_is_overloaded_or_still_filling():
    filling = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 900, 200)).document()
    assert filling["caveat"].startswith("still filling") and verdict_line(filling) == filling["caveat"]
    queued = Load(100.0, 45.0, 40.0, 1.5).document()  # admission queued, in a run of 1.5 median E2Es
    assert verdict_line(queued) == ("overloaded: first tokens came at 45 req/s (a short run, sent over 1.5 median "
                                    "E2Es: overload judged by admission and latency trends only)")
    settled = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 990, 200)).document()
    assert settled["caveat"] is None and verdict_line(settled) is None
    older = {"overloaded": False, "signs": []}  # a summary written before `settled` existed
    assert verdict_line(older) is None


def test_the_html_report_says_a_measured_runs_load_where_it_has_no_bottleneck_line():
    from types import SimpleNamespace

    from tokenpath.report.html import _verdicts

    filling = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 900, 200)).document()
    settled = Load(100.0, 95.0, 90.0, 5.0, 1.0, 1.0, Steady(10.0, 1000, 990, 200)).document()
    page = _verdicts(SimpleNamespace(runs=[SimpleNamespace(label="bench", summary={"bottleneck": None,
                                                                                   "load": filling})]))
    assert page.startswith("<p class='verdict'><b>bench: load</b> - still filling: after it filled once")
    page = _verdicts(SimpleNamespace(runs=[SimpleNamespace(label="bench", summary={"bottleneck": None,
                                                                                   "load": settled})]))
    assert page.startswith("<p class='note'>No bottleneck verdict")


def test_the_bottleneck_line_offers_the_rate_a_closed_loop_sent_not_its_arrival_schedule():
    """Capped at 64 in flight, a run scheduled all at once sends at the rate its requests finish: the line
    says the load block's rate, not "inf req/s"."""
    document, reason = result_document(simulate(load_scenario(None, {
        "workload.arrival.rate": float("inf"), "workload.max_concurrency": 64, "workload.num_requests": 400})))
    offered = document["load"]["offered_requests_per_s"]
    assert 10 < offered < 40
    assert f"the engine was busy 100% of the time at {format_number(offered)} req/s offered" in reason
    assert "inf req/s" not in reason
