"""A precision the chip has no tensor cores for: weight-only where serving engines run it (fp8 on A100,
fp4 on Hopper: stored low, multiplied at bf16), a one-line error where nothing does."""

from __future__ import annotations

import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.compute import ComputeModel, load_chip, load_model
from tokenpath.report.simulation import describe


def step(chip: str, precision: str, tokens: int, context: int) -> float:
    """One sequence's step of `tokens` new tokens after `context` cached ones."""
    cm = ComputeModel(load_model("llama-3.1-8b"), load_chip(chip), 1, precision, "bf16")
    return cm.step_time_s(tokens, 1, tokens * context + tokens * (tokens + 1) // 2, context + tokens)


def test_fp8_on_a100_streams_half_the_bytes_but_multiplies_at_bf16():
    a100 = ComputeModel(load_model("llama-3.1-8b"), load_chip("a100"), 1, "fp8", "bf16")
    bf16 = ComputeModel(load_model("llama-3.1-8b"), load_chip("a100"), 1, "bf16", "bf16")
    assert a100.weight_bytes_per_chip < 0.6 * bf16.weight_bytes_per_chip
    # Decode of one sequence reads the weights: about half the time.
    assert step("a100", "fp8", 1, 1000) < 0.65 * step("a100", "bf16", 1, 1000)
    # A large prefill is bound by the multiplies, which run at the bf16 rate.
    assert step("a100", "fp8", 8192, 0) == pytest.approx(step("a100", "bf16", 8192, 0), rel=0.02)
    # H100 has fp8 tensor cores: there the same prefill is faster.
    assert step("h100", "fp8", 8192, 0) < 0.8 * step("h100", "bf16", 8192, 0)


def test_the_report_says_the_weights_run_weight_only():
    sim = simulate(load_scenario(None, {"model.name": "llama-3.1-8b", "model.precision": "fp4",
                                        "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
                                        "workload.num_requests": 20}))
    line = dict(describe(sim))["model"]
    assert line.startswith("llama-3.1-8b, fp4 weights (weight-only: h100 has no fp4 tensor cores, so they "
                           "multiply at bf16), bf16 KV cache")
    native = simulate(load_scenario(None, {"model.name": "llama-3.1-8b", "deployment.chip": "b200",
                                           "deployment.chips": 1, "deployment.tp": 1, "model.precision": "fp4",
                                           "workload.num_requests": 20}))
    assert "weight-only" not in dict(describe(native))["model"]


def test_fp8_on_a_tpu_is_a_one_line_error(monkeypatch, capsys):
    code, out, err = run_cli(["simulate", "--chip", "tpu-v5p", "--precision", "fp8", "--num-requests", "10"],
                             monkeypatch, capsys)
    assert_user_error(code, out, err, "model.precision: fp8 does not run on tpu-v5p (deployment.chip)",
                      "use one it runs: bf16")
    # and what it names runs
    code, _, err = run_cli(["simulate", "--chip", "tpu-v5p", "--precision", "bf16", "--num-requests", "10"],
                           monkeypatch, capsys)
    assert code == 0, err
