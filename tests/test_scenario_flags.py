"""The scenario flags are the same on every command that takes a scenario, and each command runs the
scenario they give."""

from __future__ import annotations

import json

import pytest

import tokenpath.calibrate.probe
import tokenpath.sim.scenario
import tokenpath.whatif.levers
import tokenpath.whatif.run
from cli_helpers import assert_user_error, run_cli, simulate_json
from tokenpath.config.errors import UserError

SMALL = ["--model", "llama-3.1-8b", "--chip", "h100", "--chips", "4", "--tp", "4", "--num-requests", "200"]

# (command, what else it needs to reach its scenario, whether it takes the arrival and prompt flags)
COMMANDS = [
    (["simulate"], [], True),
    (["levers"], [], True),
    (["capacity"], ["--slo", "ttft_p99=2s"], True),
    (["scenario", "show"], [], True),
    (["assumptions"], [], True),
    (["bench"], ["--base-url", "http://127.0.0.1:1", "--model", "served-name"], True),
    (["serve"], ["--port", "0"], False),
    (["calibrate", "engine"], [], False),
]


@pytest.fixture
def built(monkeypatch, tmp_path):
    """The scenarios commands build, each stopping the command once built (nothing is simulated)."""
    scenarios = []
    real = tokenpath.sim.scenario.build_scenario

    def build_and_stop(*args, **kwargs):
        scenarios.append(real(*args, **kwargs))
        raise UserError("stopped once the scenario was built")

    # Every module that binds build_scenario at import, each imported above so that none binds the
    # stand-in for good by being first imported while it is in place.
    for module in (tokenpath.sim.scenario, tokenpath.whatif.run, tokenpath.whatif.levers, tokenpath.calibrate.probe):
        monkeypatch.setattr(module, "build_scenario", build_and_stop)
    monkeypatch.chdir(tmp_path)  # where bench and calibrate engine would write their files
    return scenarios


@pytest.mark.parametrize("command, needs, takes_arrivals", COMMANDS, ids=[" ".join(c) for c, _, _ in COMMANDS])
def test_every_command_runs_the_scenario_its_flags_give(command, needs, takes_arrivals, built, monkeypatch, capsys):
    flags = ["--tp", "4", "--chips", "4", "--network-rtt", "5 ms", "--set", "engine.max_num_seqs=64"]
    flags += ["--request-rate", "7", "--input-len", "100", "--input-sd", "0"] if takes_arrivals else []
    assert_user_error(*run_cli([*command, *needs, *flags], monkeypatch, capsys), "stopped once the scenario was built")
    scenario = built[0]
    assert (scenario.deployment.tp, scenario.deployment.chips, scenario.engine.max_num_seqs) == (4, 4, 64)
    assert scenario.delivery.network_rtt == pytest.approx(5e-3)
    if takes_arrivals:
        assert scenario.workload.arrival.rate == 7.0
        assert (scenario.workload.input.kind, scenario.workload.input.value) == ("fixed", 100)


@pytest.mark.parametrize("command, flag", [(["serve"], "--request-rate"), (["serve"], "--input-len"),
                                           (["calibrate", "engine"], "--output-sd"),
                                           (["calibrate", "engine"], "--request-rate")])
def test_a_flag_for_what_a_command_replaces_is_refused(command, flag, monkeypatch, capsys):
    """serve's clients send their own prompts at their own times; calibrate engine's probe sets the workload."""
    assert_user_error(*run_cli([*command, flag, "1"], monkeypatch, capsys), f"No such option: {flag}")


def test_levers_ranks_against_the_scenario_its_flags_give(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[levers]]\nname = "detokenizer"\noverrides = { "delivery.detokenize" = "detokenizer" }\n',
                    encoding="utf-8")
    flags = [*SMALL, "--request-rate", "20"]
    code, out, err = run_cli(["levers", *flags, "--levers", str(mine), "--no-catalog", "--workers", "1", "--draws", "1",
                              "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["baseline"] == simulate_json(flags, monkeypatch, capsys)
    detokenizer = simulate_json([*flags, "--detokenize", "detokenizer"], monkeypatch, capsys)
    assert document["levers"][0]["summary"] == detokenizer


def test_a_duration_without_a_unit_is_seconds_as_the_help_says(monkeypatch, capsys):
    def network_rtt(*flags: str) -> str:
        code, out, err = run_cli(["scenario", "show", *flags], monkeypatch, capsys)
        assert code == 0, err
        return next(line for line in out.splitlines() if line.startswith("network_rtt = "))

    assert network_rtt("--set", "delivery.network_rtt=20") == 'network_rtt = "20 s"'
    assert network_rtt("--set", "delivery.network_rtt=0.02") == network_rtt("--network-rtt", "20 ms") \
        == 'network_rtt = "20 ms"'
    assert network_rtt("--network-rtt", "20") == 'network_rtt = "20 s"'
    code, out, _ = run_cli(["simulate", "--help"], monkeypatch, capsys)
    shown = " ".join(out.split())
    assert "a duration without a unit is seconds" in shown and "(a bare number is seconds;" in shown


def test_length_flags_keep_the_scenarios_kind_spread_and_bounds():
    from tokenpath.cli.options import scenario_overrides

    lognormal = {"workload": {"input": {"kind": "lognormal", "mean": 550.0, "sd": 300.0, "max": 4000}}}
    assert scenario_overrides(lognormal, input_len=1000)["workload.input"] == {
        "kind": "lognormal", "mean": 1000.0, "sd": 300.0, "max": 4000}  # (it read normal(1000, 300), max dropped)
    uniform = {"workload": {"input": {"kind": "uniform", "mean": 1000.0, "range_ratio": 0.5}}}
    table = scenario_overrides(uniform, input_len=2000)["workload.input"]
    # the uniform's own sd, 1000 x 0.5 / sqrt(3) = 288.7, i.e. range_ratio 0.25 at mean 2000 (it read normal(2000, 150))
    assert table["kind"] == "uniform" and table["mean"] == 2000.0 and abs(table["range_ratio"] - 0.25) < 1e-12
    default = {"workload": {}}
    assert scenario_overrides(default, input_len=700)["workload.input"] == {"kind": "normal", "mean": 700.0,
                                                                             "sd": 150.0}
