"""Delivery calibration: the file format, the cost it implies per step, and simulate using it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from tokenpath.config.errors import UserError
from tokenpath.delivery import Detokenizer
from tokenpath.delivery.calibration import BatchCost, CalibratedCost, Calibration
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.measure import calibrate, token_streams
from tokenpath.delivery.spec import DeliverySpec


def write(tmp_path, batches, name="cal.toml"):
    path = tmp_path / name
    Calibration(batches=batches, machine={"cpu": "test"}).write(path)
    return str(path)


TWO = [BatchCost(1, 10e-6, 2e-6, 0.5e-6), BatchCost(100, 20e-6, 1e-6, 0.25e-6)]


def test_cost_is_interpolated_between_batch_sizes_and_extended_linearly(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, TWO))
    t1, t100 = 10e-6 + 2e-6, 20e-6 + 100 * 1e-6          # whole-step cost at the measured sizes
    slope = (t100 - t1) / 99
    assert cost.host_s(1, 1) == pytest.approx(t1)
    assert cost.host_s(100, 100) == pytest.approx(t100)
    assert cost.host_s(50, 50) == pytest.approx(t1 + 49 * slope)
    assert cost.host_s(300, 300) == pytest.approx(t100 + 200 * slope)
    assert cost.host_s(0, 0) == 0.0


def test_grouped_events_pay_framing_per_event(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, TWO))
    assert cost.host_s(100, 25) == pytest.approx(cost.host_s(100, 100) - 75 * 0.25e-6)


def test_a_single_batch_size_gives_a_line_through_it(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, [BatchCost(8, 4e-6, 1e-6, 0.1e-6)]))
    assert cost.host_s(8, 8) == pytest.approx(12e-6)
    assert cost.host_s(16, 16) == pytest.approx(20e-6)


def test_last_mile_charges_the_calibrated_host_cost(tmp_path):
    path = write(tmp_path, TWO)
    constant = LastMile(DeliverySpec(detokenize="engine"))
    measured = LastMile(DeliverySpec(detokenize="engine", calibration=path))
    blocking_constant, *_ = constant.on_step(0, 50, 50)
    blocking_measured, leave, _, framing_ns = measured.on_step(0, 50, 50)
    copy_ns = blocking_constant - round(50 * DeliverySpec().detokenize_per_token * 1e9)
    # Detokenizing blocks the engine; the API server then frames the 50 events.
    calibrated = CalibratedCost.from_file(path)
    assert framing_ns == round(calibrated.frame_s(50, 50) * 1e9)
    assert blocking_measured + framing_ns == pytest.approx(copy_ns + calibrated.host_s(50, 50) * 1e9, abs=1)
    assert leave == blocking_measured + framing_ns


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("schema = 'other/1'\n", "expected 'tokenpath.delivery-calibration/1'"),
    ("schema = 'tokenpath.delivery-calibration/1'\n[[batch]]\nbatch_size = 1\n", "batch[0] lacks"),
    ("schema = 'tokenpath.delivery-calibration/1'\n", "no [[batch]] rows"),
    ("not = [toml", "not valid TOML"),
])
def test_a_bad_calibration_file_names_the_field_and_the_fix(tmp_path, content, message):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match="delivery.calibration") as error:
        LastMile(DeliverySpec(calibration=str(path)))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_measuring_writes_a_file_that_reads_back(tmp_path):
    det = Detokenizer.load("tokenizer.model.v1")
    calibration = calibrate(det, [1, 4], steps=10, repeats=1)
    path = tmp_path / "m.toml"
    calibration.write(path)
    back = Calibration.read(path)
    assert [b.batch_size for b in back.batches] == [1, 4]
    assert back.batches == calibration.batches
    assert back.tokenizer == {"name": "tokenizer.model.v1", "kind": "sentencepiece", "vocab_size": 32000}
    assert all(b.step_s >= 0 and b.per_token_s >= 0 and 0 <= b.frame_per_event_s <= b.per_token_s
               for b in back.batches)


def test_token_streams_are_windows_of_the_sample_text():
    det = Detokenizer.load("tokenizer.model.v1")
    ids = token_streams(det, batch=3, steps=7000)
    assert ids.shape == (7000, 3) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < det.vocab_size


def test_the_cli_writes_a_calibration_and_refuses_bad_batch_sizes(tmp_path):
    from tokenpath.cli import app

    out = tmp_path / "host.toml"
    result = CliRunner().invoke(app, ["calibrate", "delivery", "--tokenizer", "tokenizer.model.v1", "--out", str(out),
                                      "--batch-sizes", "2", "4", "--steps", "10", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert [b.batch_size for b in Calibration.read(out).batches] == [2, 4]
    bad = CliRunner().invoke(app, ["calibrate", "delivery", "--batch-sizes", "0", "--out", str(out)])
    assert isinstance(bad.exception, UserError) and "--batch-sizes" in str(bad.exception)


def test_simulate_uses_the_calibration(tmp_path):
    from tokenpath import load_scenario, simulate

    slow = write(tmp_path, [BatchCost(1, 1e-3, 1e-3, 0.0), BatchCost(256, 1e-3, 1e-3, 0.0)], "slow.toml")
    overrides = {"workload.num_requests": 60, "delivery.detokenize": "engine"}
    base = simulate(load_scenario("typical", overrides)).run
    calibrated = simulate(load_scenario("typical", {**overrides, "delivery.calibration": slow})).run
    # 1 ms of fixed cost plus 1 ms per token, inline: every step a request takes part in (one per
    # output token) blocks at least 2 ms instead of the constant model's few microseconds.
    growth = calibrated.delivery_ns.astype(np.int64) - base.delivery_ns
    assert np.all(growth >= 1.9e6 * calibrated.output_tokens)
