"""`validate --calibrated` (each configuration fitted on its lightest row, its other loads predicted) and the
latency group's ranking of configurations measured at one load point."""

import json

import numpy as np
import pytest
import tomli_w

from cli_helpers import assert_user_error, run_cli
from tokenpath.calibrate.fit import Fit, _Model
from tokenpath.config.assumptions import lookup
from tokenpath.validate.calibrated import Configuration, configurations, row_phase
from tokenpath.validate.fit import PROCEDURES
from tokenpath.validate.latency import predict_row, relative_errors, simulated_requests
from tokenpath.validate.latency_rows import read_latency_rows
from tokenpath.validate.ranking import kendall_tau, ranking, wrong_pairs

SHIPPED = read_latency_rows()
# AIConfigurator's vLLM closed loop, Llama 70B FP8 on 8 H100 (mean TTFT and TPOT), at its 4 slots.
LOOP = next(r for r in SHIPPED["rows"] if r.get("id", "").endswith("1024x1024_c4_tp8_ep1_725"))
# DataCrunch's SGLang run at 1 req/s (median TTFT and ITL, 300 Poisson arrivals).
# Scored at the engine (no front end): the tests below check the fit's mechanics on the engine's own
# timing, where a few requests' medians move smoothly enough with one constant to find it again.
POISSON = {**next(r for r in SHIPPED["rows"] if r["source"] == "datacrunch_h200" and r.get("rate") == 1.0),
           "endpoint": "engine"}
# The host time per eager kernel the fits below are made to find again: 37.5% above the registry's.
MADE_EAGER_HOST_S = 1.375 * lookup("eager_host_per_kernel_s").value
# The SGLang cookbook's DeepSeek-V3.1 on 8 MI300X, 1000/1000 at concurrency 1 (median TTFT and TPOT).
MI300X_C1 = next(r for r in SHIPPED["rows"] if r.get("id", "").startswith("DeepSeek-V3_1.md 1000/1000 c1 "))


def _row(**changes):
    base = {"source": "lab", "engine": "vllm", "engine_settings": {"max_num_seqs": 256}, "model": "llama-3.1-8b",
            "precision": "bf16", "chip": "h100", "tp": 1, "lengths": "fixed", "input_len": 512, "output_len": 128,
            "arrival": "poisson", "rate": 1.0}
    return {**base, **changes}


def test_a_configuration_needs_three_loads_and_is_fitted_on_its_first_lightest_row():
    uniform = {"lengths": "uniform", "input_max": 1024, "output_max": 1024, "arrival": "concurrency"}
    rows = [
        _row(rate=4.0), _row(rate=1.0), _row(rate=2.0), _row(rate=1.0),     # 0-3: three loads, rows 1 and 3 lightest
        _row(tp=2, rate=1.0), _row(tp=2, rate=2.0),                        # 4-5: two loads only
        _row(tp=2, rate=4.0, engine_settings={"max_num_seqs": 128}),        # 6: other settings, not a third load
        _row(source="other", rate=8.0),                                      # 7: another source's run
        _row(arrival="all_at_once", rate=None, num_requests=100),            # 8: no rate or concurrency
        # 9-11: uniform draws whose means differ run to run are one configuration by their range
        _row(**uniform, input_mean=510.0, output_mean=505.0, concurrency=16),
        _row(**uniform, input_mean=498.0, output_mean=512.0, concurrency=1),
        _row(**uniform, input_mean=520.0, output_mean=509.0, concurrency=64),
        _row(**{**uniform, "input_max": 8000}, input_mean=4000.0, output_mean=509.0, concurrency=2),  # 12: longer
    ]
    assert configurations(rows) == [Configuration((0, 1, 2, 3), 1), Configuration((9, 10, 11), 10)]


@pytest.mark.parametrize("row", [LOOP, POISSON], ids=["closed loop, means", "poisson, median ITL"])
def test_a_published_row_replays_in_the_fit_as_the_latency_group_simulates_it(row):
    """The fit's phase of a row (no per-request data: the requests the group simulates, their scheduled sends,
    capped at the loop's concurrency) predicts what validate predicts for the row."""
    phase = row_phase(row, SHIPPED["sharegpt"])
    count, skip = simulated_requests(row)
    assert len(phase.requests) == count and int(phase.counted.sum()) == count - skip and not phase.sent
    assert (phase.ttft_s, phase.decode_s) == (row["ttft_ms"] / 1e3, row["decode_ms"] / 1e3)
    assert (phase.statistic.ttft, phase.statistic.decode, phase.statistic.decode_metric) == \
        (row["ttft_stat"], row["decode_stat"], row["decode_metric"])
    from tokenpath.validate.latency import row_scenario
    [(ttft_s, decode_s)] = _Model(row_scenario(row, SHIPPED["sharegpt"]), [phase], []).predict({})
    expected = predict_row(row, SHIPPED["sharegpt"])
    assert (ttft_s, decode_s) == (expected["ttft_s"], expected["decode_s"])


def _file(tmp_path, rows) -> str:
    path = tmp_path / "rows.toml"
    path.write_text(tomli_w.dumps({"rows": rows}))
    return str(path)


def _loop(concurrency: int, **changes) -> dict:
    """The closed loop at `concurrency` slots, 2 measured requests a slot (a fast run)."""
    return {**LOOP, "concurrency": concurrency, "requests_per_slot": 2, "id": f"c{concurrency}", **changes}


def test_calibrated_fits_the_lightest_row_and_predicts_the_others_with_its_values(tmp_path, monkeypatch, capsys):
    values = {"serving_gemm_fraction": 0.5}

    def fake_fit(scenario, measured):  # the fit itself is calibrate engine's (test_calibrate_engine.py)
        [phase] = measured
        assert phase.concurrency == 1 and phase.ttft_s == LOOP["ttft_ms"] / 1e3
        return Fit(list(values), {"serving_gemm_fraction": 0.8}, values, {"serving_gemm_fraction": 0.01}, 0.2, 0.1,
                   [(0.1, 0.01)], [(0.07, 0.009)], {"host_step_s": "the probe barely sees it"})

    monkeypatch.setattr("tokenpath.calibrate.fit.fit_engine", fake_fit)
    rows = [_loop(4), _loop(1), _loop(2)]
    code, out, err = run_cli(["validate", "--calibrated", "--latency-rows", _file(tmp_path, rows), "--json", "-"],
                             monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(out)
    assert (document["sources"], document["configurations"], document["rows"]) == (1, 1, 2)
    [source] = document["by_source"]
    [configuration] = source["configurations"]
    assert configuration["fitted"] == values and configuration["fitted_on"]["load"] == "concurrency 1"
    assert configuration["fitted_on"]["predicted_ttft_ms"] == pytest.approx(70.0)
    # the fit starts from the values fitted without the source's rows: no other source here, so every latency
    # constant at the middle of its bounds (held_out_start), not at the registry's, fitted on these rows too
    start = configuration["started_from"]
    assert start == {p.name: p.held_out_start() for p in PROCEDURES}
    errors = [relative_errors(row, predict_row(row, SHIPPED["sharegpt"], {**start, **values}))
              for row in (rows[0], rows[2])]
    assert [r["ttft_error"] for r in configuration["rows"]] == [e["ttft"] for e in errors]
    assert document["ttft_median"] == pytest.approx(float(np.median([abs(e["ttft"]) for e in errors])))
    assert document["tpot_median"] == pytest.approx(float(np.median([abs(e["decode"]) for e in errors])))
    uncalibrated = [relative_errors(row, predict_row(row, SHIPPED["sharegpt"], start)) for row in (rows[0], rows[2])]
    assert document["uncalibrated"]["tpot_median"] == pytest.approx(
        float(np.median([abs(e["decode"]) for e in uncalibrated])))


def test_a_configuration_whose_fit_kept_nothing_says_so(tmp_path, monkeypatch, capsys):
    """A fit that pressed every candidate against its range (calibrate/fit.py) keeps no value: the table says
    what the configuration was predicted with."""
    monkeypatch.setattr("tokenpath.calibrate.fit.fit_engine", lambda scenario, measured: Fit(
        [], {}, {}, {}, 0.2, 0.2, [(0.1, 0.01)], [(0.1, 0.01)], {"serving_gemm_fraction": "pressed"}))
    monkeypatch.setenv("COLUMNS", "200")
    rows = _file(tmp_path, [_loop(4), _loop(1), _loop(2)])
    code, out, err = run_cli(["validate", "--calibrated", "--latency-rows", rows], monkeypatch, capsys)
    assert code == 0, err
    assert "fitted on the first load: nothing (its fold's values)" in " ".join(out.split())


def test_calibrated_without_a_configuration_at_three_loads_is_one_line(tmp_path, monkeypatch, capsys):
    assert_user_error(*run_cli(["validate", "--calibrated", "--latency-rows", _file(tmp_path, [_loop(1), _loop(2)])],
                               monkeypatch, capsys), "--calibrated: no configuration has rows at 3 or more loads")
    assert_user_error(*run_cli(["validate", "--calibrated", "--cross"], monkeypatch, capsys),
                      "--cross and --calibrated")
    assert_user_error(*run_cli(["validate", "--calibrated", "--group", "nccl_allreduce"], monkeypatch, capsys),
                      "--calibrated: validates the latency group only")


def test_kendall_tau_of_one_swapped_pair():
    """Four items, the middle two swapped: 5 pairs concordant, 1 discordant, tau = (5 - 1) / 6."""
    measured, predicted = [10.0, 20.0, 30.0, 40.0], [11.0, 32.0, 19.0, 45.0]
    assert kendall_tau(measured, predicted) == pytest.approx(4 / 6)
    assert wrong_pairs(["a", "b", "c", "d"], measured, predicted) == [["b", "c"]]
    assert kendall_tau(measured, measured[::-1]) == pytest.approx(-1.0)
    assert wrong_pairs(["a", "b"], [1.0, 1.0], [1.0, 2.0]) == []  # a tie is not a wrong order


def test_the_latency_group_ranks_configurations_measured_at_one_load(tmp_path, monkeypatch, capsys):
    """TP8 and TP4 at the same closed loop; TP4 published as faster to a first token than TP8, which the
    model (TP4: half the GPUs per prompt) cannot be: one TTFT pair in the other order."""
    tp8 = _loop(4)
    tp4 = _loop(4, tp=4, ttft_ms=LOOP["ttft_ms"] / 2, decode_ms=LOOP["decode_ms"] * 2, id="tp4")
    elsewhere = _loop(16)  # another load point: ranked with nothing
    code, out, err = run_cli(["validate", "--latency-rows", _file(tmp_path, [tp8, tp4, elsewhere]), "--json", "-"],
                             monkeypatch, capsys)
    assert code == 0, err
    rank = json.loads(out)["groups"]["latency"]["ranking"]
    [group] = rank["groups"]
    names = ["vllm llama-3.1-70b fp8 h100 TP8", "vllm llama-3.1-70b fp8 h100 TP4"]
    assert group["configurations"] == names and group["load"] == "concurrency 4"
    assert group["ttft"] == {"tau": -1.0, "wrong": [names[::-1]]}
    assert group["decode"] == {"tau": 1.0, "wrong": []}
    assert (rank["pairs"], rank["ttft_wrong"], rank["decode_wrong"]) == (1, 1, 0)


def test_ranking_groups_rows_by_source_and_load_point():
    rows = [{**_row(tp=tp, rate=rate), "ttft_ms": t, "predicted_ttft_ms": p, "decode_ms": 1.0,
             "predicted_decode_ms": 1.0} for tp, rate, t, p in ((1, 1.0, 10, 10), (2, 1.0, 8, 9), (4, 1.0, 6, 5),
                                                                 (1, 2.0, 12, 12), (2, 2.0, 9, 13))]
    document = ranking(rows)
    assert [len(g["configurations"]) for g in document["groups"]] == [3, 2]
    assert [g["ttft"]["tau"] for g in document["groups"]] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert (document["pairs"], document["ttft_wrong"]) == (4, 1)
    assert document["groups"][0]["decode"]["wrong"] == []  # every TPOT the same: no order to get wrong


def test_a_python_engines_light_load_prompts_calibrate_its_host_time_per_eager_kernel(monkeypatch):
    """The first 150 requests of DataCrunch's SGLang run at 1 req/s, their figures made by the model
    itself at MADE_EAGER_HOST_S per eager kernel: its prompts wait on their launches, which no rate of the GPU's
    shortens, so the fit takes the host time per eager kernel and finds the value again (one local fit,
    from the better of the starting values and one other point: the screen and the fit are what this
    checks, not the global search). Screened by a 2% step, the median's jumps made host_step_s look as
    strong, and the fit moved it to 11 ms; screened at the registry's HBM efficiency instead of the
    H200's measured one (a model the run does not use), it took host_step_s again."""
    from dataclasses import replace

    from tokenpath.calibrate import fit as calibrate_fit
    from tokenpath.calibrate.fit import fit_engine
    from tokenpath.validate.latency import row_scenario

    monkeypatch.setattr(calibrate_fit, "SEARCH_POINTS", 1)
    monkeypatch.setattr(calibrate_fit, "LOCAL_FITS", 1)

    scenario, phase = row_scenario(POISSON, SHIPPED["sharegpt"]), row_phase(POISSON, SHIPPED["sharegpt"])
    phase = replace(phase, requests=phase.requests.take(np.arange(150)), counted=phase.counted[:150])
    [(ttft_s, decode_s)] = _Model(scenario, [phase], []).predict({"eager_host_per_kernel_s": MADE_EAGER_HOST_S})
    [(registry_ttft_s, _)] = _Model(scenario, [phase], []).predict({})
    assert ttft_s > registry_ttft_s * 1.2  # the registry's value leaves the made TTFT well short
    fit = fit_engine(scenario, [replace(phase, ttft_s=ttft_s, decode_s=decode_s)])
    assert fit.names == ["eager_host_per_kernel_s"]
    assert fit.values["eager_host_per_kernel_s"] == pytest.approx(MADE_EAGER_HOST_S, rel=0.03)
    # SGLang's profile pays host_step_s and no vLLM V0 host time: the screen does not simulate those
    unpaid = "the engine's profile does not pay it (engine/profiles.py)"
    assert fit.not_fitted["vllm_v0_host_window_s"] == fit.not_fitted["vllm_v0_host_step_s"] == unpaid
    assert fit.not_fitted["host_step_s"] != unpaid
    # the H200's measured HBM efficiency (catalog/chips.toml) is fitted only where no other candidate is
    assert fit.not_fitted["hbm_bw_efficiency"] == ("measured for the h200 (catalog/chips.toml): fitted only "
                                                   "where nothing else is")


def test_one_load_fits_an_assumption_for_each_of_its_two_figures(monkeypatch):
    """The first four requests of the MI300X closed loop at concurrency 1, made by the model at 90 us of
    host time per eager kernel and 10 us of fixed time per kernel: one phase, a TTFT and a TPOT, and the
    fit finds both values (one local fit from the starting values, as above). The fixed time per kernel
    starts at the MI300X's measured 4.5 us and is fitted as any candidate (a serving stack's kernels take
    longer than a launch); the HBM efficiency, which moves both figures as a kernel's fixed time does at
    batch 1, is not fitted. With one assumption from two figures, as the fit took before, the TPOT stayed
    2.4 times off."""
    from dataclasses import replace

    from tokenpath.calibrate import fit as calibrate_fit
    from tokenpath.calibrate.fit import fit_engine
    from tokenpath.validate.latency import row_scenario

    monkeypatch.setattr(calibrate_fit, "SEARCH_POINTS", 1)
    monkeypatch.setattr(calibrate_fit, "LOCAL_FITS", 1)
    scenario, phase = row_scenario(MI300X_C1, SHIPPED["sharegpt"]), row_phase(MI300X_C1, SHIPPED["sharegpt"])
    phase = replace(phase, requests=phase.requests.take(np.arange(4)), counted=phase.counted[:4])
    made = {"eager_host_per_kernel_s": 90e-6, "kernel_fixed_s": 10e-6}
    [(ttft_s, decode_s)] = _Model(scenario, [phase], []).predict(made)
    [(_, registry_decode_s)] = _Model(scenario, [phase], []).predict({})
    assert decode_s > registry_decode_s * 1.5  # the MI300X's measured 4.5 us a kernel leaves the made TPOT far short
    fit = fit_engine(scenario, [replace(phase, ttft_s=ttft_s, decode_s=decode_s)])
    assert fit.names == ["eager_host_per_kernel_s", "kernel_fixed_s"]
    assert fit.values == pytest.approx(made, rel=0.01)
    assert fit.rms_after < 1e-3
    assert "hbm_bw_efficiency" in fit.not_fitted


def test_an_assumption_pressed_against_an_end_of_its_range_is_not_fitted(monkeypatch):
    """AIConfigurator's vLLM loop at concurrency 4 (its first eight requests), its TTFT made faster than the
    chip's whole measured GEMM rate gives (the serving fraction's end, 1.0): the fit presses the fraction
    against it, and drops it, fitting what else moves the figures (a kernel's fixed time, inside its range).
    Made faster still on both figures, every candidate is pressed, and nothing is fitted: the fit says so and
    predicts with the starting values."""
    from dataclasses import replace

    from tokenpath.calibrate import fit as calibrate_fit
    from tokenpath.calibrate.fit import AT_BOUND, PRESSED, _bounds, fit_engine
    from tokenpath.validate.latency import row_scenario

    monkeypatch.setattr(calibrate_fit, "SEARCH_POINTS", 1)
    monkeypatch.setattr(calibrate_fit, "LOCAL_FITS", 1)
    scenario, phase = row_scenario(LOOP, SHIPPED["sharegpt"]), row_phase(LOOP, SHIPPED["sharegpt"])
    phase = replace(phase, requests=phase.requests.take(np.arange(8)), counted=phase.counted[:8])
    [(ttft_s, decode_s)] = _Model(scenario, [phase], []).predict({})
    [(fastest_ttft_s, _)] = _Model(scenario, [phase], []).predict({"serving_gemm_fraction": 1.0})
    assert 0.6 * ttft_s < fastest_ttft_s * 0.8  # no fraction of the rate reaches the made TTFT

    fit = fit_engine(scenario, [replace(phase, ttft_s=0.6 * ttft_s, decode_s=decode_s)])
    assert fit.not_fitted["serving_gemm_fraction"] == PRESSED
    assert fit.names and "serving_gemm_fraction" not in fit.values
    for name, value in fit.values.items():  # what is fitted lies inside its range
        low, high = _bounds(name, fit.start[name])
        assert low + AT_BOUND < np.log(value / fit.start[name]) < high - AT_BOUND, (name, value)

    nothing = fit_engine(scenario, [replace(phase, ttft_s=0.3 * ttft_s, decode_s=0.3 * decode_s)])
    assert nothing.names == [] and nothing.values == {} and nothing.not_fitted["serving_gemm_fraction"] == PRESSED
    assert nothing.predicted_after == nothing.predicted_before
    assert nothing.rms_after == nothing.rms_before
    assert nothing.warnings[0].startswith("nothing fitted: serving_gemm_fraction went to an end of its range")
    assert nothing.warnings[-1].endswith("measured (+233%): no candidate assumption reaches it within its range")


def test_a_local_fit_from_the_starting_values_steps_far_enough_to_move_the_medians():
    """The first 40 requests of DataCrunch's 1 req/s run, made by the model at MADE_EAGER_HOST_S per eager
    kernel: one local fit from the registry's value (x = 0) reproduces the made medians near it. scipy's
    own finite differences step by a share of x, which at x = 0 moves no simulated median: from there a
    fit stayed where it began (then the registry's 72.7 us). So did a Jacobian of 2% steps: the median of
    40 TTFTs is not monotonic in the value (93.3 ms at 72.7 us, 92.6 ms at 74 us, 98.0 ms at 80 us), and
    the fit stepped towards a longer TTFT the wrong way."""
    from dataclasses import replace

    from tokenpath.calibrate.fit import _local_fit
    from tokenpath.validate.latency import row_scenario

    scenario, phase = row_scenario(POISSON, SHIPPED["sharegpt"]), row_phase(POISSON, SHIPPED["sharegpt"])
    phase = replace(phase, requests=phase.requests.take(np.arange(40)), counted=phase.counted[:40])
    names = ["eager_host_per_kernel_s"]
    [(ttft_s, decode_s)] = _Model(scenario, [phase], []).predict({"eager_host_per_kernel_s": MADE_EAGER_HOST_S})
    model = _Model(scenario, [replace(phase, ttft_s=ttft_s, decode_s=decode_s)], names)
    result = _local_fit(model, names, np.zeros(1), np.array([-3.0]), np.array([3.0]))
    assert model.values(result.x, names)["eager_host_per_kernel_s"] == pytest.approx(MADE_EAGER_HOST_S, rel=0.03)
    # within 1% of the made medians: near the made value too the median of 40 TTFTs is not monotonic
    # (+2.6% at 1% above it, +2.0% at 2%), so the fit may stop a step beside it
    assert np.abs(result.fun).max() < 1e-2
