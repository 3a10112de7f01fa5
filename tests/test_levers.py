"""`tokenpath levers` and `tokenpath capacity`: the ranked catalog on the default scenario, a lever's
numbers equal to `simulate --set` with its overrides, levers that do not apply with their reasons, a
user's levers file, the cost objective, and capacity on both sides of its answer."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_user_error, run_cli, simulate_json, toml_value
from tokenpath.overrides import apply_overrides
from tokenpath.scenario import read_scenario_table
from tokenpath.whatif.capacity import misses, parse_slo
from tokenpath.whatif.catalog import GROUPS, catalog
from tokenpath.whatif.objective import Objective, Prices
from tokenpath.whatif.run import Base, simulate_summary

SMALL_SETS = ["--set", "model.name=llama-3.1-8b", "--set", "deployment.chip=h100", "--set", "deployment.chips=1",
              "--set", "deployment.tp=1", "--num-requests", "300"]



@pytest.fixture(scope="module")
def default_levers(tmp_path_factory):
    """`tokenpath levers --json FILE` on the default scenario: (exit status, printed table, document)."""
    import os
    import subprocess
    import sys

    target = tmp_path_factory.mktemp("levers") / "levers.json"
    done = subprocess.run([sys.executable, "-m", "tokenpath", "levers", "--json", str(target)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path_factory.mktemp("empty"),
                          env={**os.environ, "COLUMNS": "200"})
    return done.returncode, done.stdout + done.stderr, json.loads(target.read_text(encoding="utf-8"))


def test_levers_on_the_default_scenario_are_ranked_with_every_group(default_levers):
    code, out, document = default_levers
    assert code == 0, out
    levers = document["levers"]
    assert {lever["group"] for lever in levers} == set(GROUPS)
    assert document["objective"]["metric"] == "latency_s.ttfv.p99"
    base = document["baseline"]["latency_s"]["ttfv"]["p99"]
    assert document["objective"]["value"] == base
    for lever in levers:  # each value is the lever's own summary's, each change against the baseline
        change = lever["change"]
        assert change["value"] == lever["summary"]["latency_s"]["ttfv"]["p99"]
        assert change["delta"] == pytest.approx(change["value"] - base)
        parts = lever["summary"]["attribution_s"]
        moved = {part: parts[part] - document["baseline"]["attribution_s"][part] for part in parts}
        assert change["layer"] == max(moved, key=lambda part: abs(moved[part]))
    # best first: the improvements (lower is better) never increase down the list beyond the tie band
    better = [-lever["change"]["delta"] for lever in levers]
    assert all(a >= b - 0.01 * base for a, b in zip(better, better[1:]))
    assert better[0] > 0 and better[-1] < 0
    # the table shows them in that order, the baseline first, and what was skipped and why
    rows = [line for line in out.splitlines() if "│" in line]
    for rank, lever in enumerate(levers, 1):
        row = next(line for line in rows if f" {lever['name']} " in line)
        assert row.split("│")[1].strip() == str(rank) and lever["group"] in row
    assert rows.index(next(line for line in rows if " baseline " in line)) < rows.index(
        next(line for line in rows if f" {levers[0]['name']} " in line))
    skipped = {lever["name"]: lever["reason"] for lever in document["skipped"]}
    assert "needs 2 or more replicas" in skipped["disaggregated prefill"]
    assert "no scale-out network" in skipped["faster scale-out network"]
    assert "Not applicable here" in out


def test_two_levers_equal_simulate_with_their_overrides(default_levers, monkeypatch, capsys):
    _, _, document = default_levers
    by_name = {lever["name"]: lever for lever in document["levers"]}
    links = next(lever for name, lever in by_name.items() if name.startswith("scale-up links"))
    for lever in (by_name["async detokenization"], links):
        argv = [arg for dotted, value in lever["overrides"].items() for arg in ("--set", f"{dotted}={toml_value(value)}")]
        assert simulate_json(argv, monkeypatch, capsys) == lever["summary"]
    assert links["summary"] != document["baseline"]


def _small_base(**overrides) -> Base:
    """Llama-3.1-8B on two H100s (two replicas), with `overrides`."""
    table, source, base_dir = read_scenario_table(None)
    apply_overrides(table, {"model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 2,
                            "deployment.tp": 1, "workload.num_requests": 200, **overrides})
    return Base(table, source, base_dir)


def test_levers_that_do_not_apply_say_why(tmp_path):
    torus = _small_base(**{"deployment.fabric": {"kind": "torus", "dims": [2]}})
    levers = {lever.name: lever for lever in catalog(torus.scenario(), torus.table, tmp_path)}
    assert "this scale-up fabric is a torus" in levers["NVLS"].skipped
    assert "no delivery-calibration.toml here" in levers["this machine's last mile"].skipped
    assert "caches prefixes already" in levers["prefix caching"].skipped  # on by default, as in vLLM V1
    assert levers["prefix-aware routing"].overrides == {"deployment.routing": "prefix_aware"}
    uncached = _small_base(**{"engine.prefix_caching": False})
    without = {lever.name: lever for lever in catalog(uncached.scenario(), uncached.table, tmp_path)}
    assert without["prefix caching"].overrides == {"engine.prefix_caching": True}
    assert "does not cache prefixes" in without["prefix-aware routing"].skipped
    # two replicas: disaggregation applies, one of them prefilling
    assert levers["disaggregated prefill (1 of 2 replicas)"].overrides == {"deployment.prefill_replicas": 1}
    # the scenario gives a fabric table: a lever changes the key it needs, nothing else
    links = next(lever for name, lever in levers.items() if name.startswith("scale-up links"))
    assert list(links.overrides) == ["deployment.fabric.link_bw"]
    # a calibration file where levers runs turns the measured last mile on
    (tmp_path / "delivery-calibration.toml").write_text("", encoding="utf-8")
    levers = {lever.name: lever for lever in catalog(torus.scenario(), torus.table, tmp_path)}
    assert levers["this machine's last mile"].overrides["delivery.calibration"].endswith("delivery-calibration.toml")


def test_a_tp_split_that_does_not_divide_is_skipped(tmp_path):
    base = _small_base(**{"deployment.tp": 2})
    levers = {lever.name: lever for lever in catalog(base.scenario(), base.table, tmp_path)}
    assert levers["TP2 / 4"].skipped == "tp=2 does not divide by 4"
    assert levers["TP2 -> TP1x2"].overrides == {"deployment.tp": 1}


def test_user_levers_run_and_their_keys_are_checked(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[levers]]\nname = "far client"\ngroup = "mine"\noverrides = { delivery.network_rtt = "200 ms" }\n'
                    '[[levers]]\nname = "two per event"\noverrides = { "delivery.stream_interval" = 2 }\n',
                    encoding="utf-8")
    code, out, err = run_cli(["levers", *SMALL_SETS, "--levers", str(mine), "--no-catalog", "--workers", "1",
                              "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    names = [lever["name"] for lever in document["levers"]]
    assert names == ["two per event", "far client"]  # the far client is worse: ranked last
    far = document["levers"][1]
    assert far["group"] == "mine" and far["overrides"] == {"delivery.network_rtt": "200 ms"}
    assert far["change"]["delta"] == pytest.approx(0.18, abs=0.01) and far["change"]["layer"] == "delivery"
    assert document["levers"][0]["group"] == "custom"
    mine.write_text('[[levers]]\nname = "x"\noverrides = { "delivery.rtt" = "1 ms" }\n', encoding="utf-8")
    assert_user_error(*run_cli(["levers", "--levers", str(mine)], monkeypatch, capsys),
                      "lever 1 (x)", "unknown key 'rtt' in delivery")
    mine.write_text('[[levers]]\nname = "x"\noverrides = { "seed" = 1 }\ngroupe = "mine"\n', encoding="utf-8")
    assert_user_error(*run_cli(["levers", "--levers", str(mine)], monkeypatch, capsys), "unknown key", "groupe", "did you mean 'group'?")


def test_objectives(monkeypatch, capsys):
    assert_user_error(*run_cli(["levers", *SMALL_SETS, "--objective", "latency_s.ttft.p98"], monkeypatch, capsys),
                      "--objective", "'latency_s.ttft.p98'", "did you mean 'latency_s.ttft.p99'?")
    prices = Prices.load()
    assert prices.usd_per_hour["h100"] > 0 and "AWS" in prices.source["h100"]
    base = Base(*read_scenario_table(None))
    outcome = simulate_summary(base, {"workload.num_requests": 200})
    cost = Objective.parse("cost").value(outcome.summary, "h200", 8)
    tokens_per_hour = outcome.summary["throughput"]["output_tokens_per_s"] * 3600
    assert cost == pytest.approx(8 * prices.usd_per_hour["h200"] / tokens_per_hour * 1e6)
    assert Objective.parse("goodput").metric == "throughput.goodput_requests_per_s"
    assert Objective.parse("goodput").higher_is_better and not Objective.parse(None).higher_is_better


def test_capacity_meets_the_slo_at_its_answer_and_misses_it_5_percent_above(monkeypatch, capsys):
    slo = "tpot_p99=8ms,ttft_p99=500ms"
    code, out, err = run_cli(["capacity", *SMALL_SETS, "--slo", slo, "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    rate = document["request_rate"]
    assert document["binding"]["metric"] == "tpot_p99" and document["layer"] in ("queue", "compute", "traffic", "delivery")
    at = simulate_json([*SMALL_SETS, "--request-rate", repr(rate)], monkeypatch, capsys)
    above = simulate_json([*SMALL_SETS, "--request-rate", repr(rate * 1.05)], monkeypatch, capsys)
    targets = parse_slo(slo)
    assert at == document["summary"] and not misses(at, targets)
    assert "tpot_p99" in misses(above, targets)
    assert document["above"]["request_rate"] <= rate * 1.01


@pytest.mark.parametrize("slo, fragment", [
    ("ttft_p98=2s", "unknown metric 'ttft_p98'; use METRIC_STAT"),
    ("ttft_p99=fast", "--slo ttft_p99: cannot read 'fast'"),
    ("ttft_p99", "needs NAME=DURATION"),
])
def test_capacity_slo_errors(slo, fragment, monkeypatch, capsys):
    assert_user_error(*run_cli(["capacity", "--slo", slo], monkeypatch, capsys), fragment)
