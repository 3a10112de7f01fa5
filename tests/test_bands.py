"""Error bands and the validated envelope: the band of a regime from its rows' errors, the back-off, the
envelope of the rows, how simulate, levers and sweep show them, and the shipped bands file against the
rows it was written from (sim/bands.py, sim/envelope.py, sim/regime.py)."""

import io
import json
import math
import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.config.units import format_duration, format_number
from tokenpath.delivery.spec import ENGINE_SIDE_DELIVERY
from tokenpath.sim.bands import (
    Record,
    attach_bands,
    group_row_ids,
    latency_row_ids,
    ranked_range,
    shipped_records,
)
from tokenpath.sim.envelope import covers_version, envelope
from tokenpath.sim.regime import load_regime, model_family, regime_block
from tokenpath.validate.bands_build import THROUGHPUT_GROUP
from tokenpath.validate.groups import published_rows
from tokenpath.validate.latency import load_latency, row_engine

HOPPER = {"engine": "vllm-v1", "load": "moderate", "model_family": "dense", "chip_generation": "Hopper",
          "chip": "h100", "engine_version": None}


def _record(n, ttft, decode=None, throughput=None, source=None, **regime):
    """Row n, a source of its own unless `source` is given."""
    keys = {**HOPPER, **regime}
    errors = {"ttft": ttft, "decode": ttft if decode is None else decode}
    if throughput is not None:
        errors = {"throughput": throughput}
    return Record(f"lab#{n}", source or f"lab{n}", keys["engine"], keys.get("version", ""), keys["chip"],
                  keys["chip_generation"], "llama-3.1-70b", keys["model_family"], keys["load"], errors)


def _document(regime=HOPPER, ttft_s=0.1, tpot_s=0.02, e2e_s=2.0, tokens_per_s=1000.0):
    def stats(value):
        return {"mean": value, "p50": value, "p90": 2 * value, "p99": 3 * value, "p999": 4 * value}

    return {"regime": dict(regime), "throughput": {"output_tokens_per_s": tokens_per_s, "requests_per_s": 5.0},
            "latency_s": {"ttft": stats(ttft_s), "ttfv": stats(ttft_s), "tpot": stats(tpot_s), "itl": stats(tpot_s),
                          "e2e": stats(e2e_s)}}


def test_a_band_is_what_would_be_measured_given_the_regimes_errors():
    # Four rows of the regime (too few to leave any out: their smallest and largest error) and one elsewhere.
    records = [_record(0, -0.2, 0.1), _record(1, 0.0, -0.1), _record(2, 0.1, 0.0), _record(3, 0.25, 0.05),
               _record(4, 3.0, 3.0, chip_generation="Ampere")]
    document = _document()
    attach_bands(document, records)
    ttft = document["latency_s"]["ttft"]["band"]
    # measured = predicted / (1 + e): the largest error (+25%) gives the lowest, the smallest (-20%) the highest
    assert ttft["p50"] == {"low": pytest.approx(0.1 / 1.25, rel=1e-12), "high": pytest.approx(0.1 / 0.8, rel=1e-12)}
    assert ttft["p99"] == {"low": pytest.approx(0.3 / 1.25, rel=1e-12), "high": pytest.approx(0.3 / 0.8, rel=1e-12)}
    assert ttft["rows"] == 4 and ttft["calibrated"] is False
    assert ttft["basis"] == "vllm-v1, moderate load, dense, Hopper: 4 rows, cross-validated, min-max of their errors"
    assert document["latency_s"]["ttfv"]["band"] == ttft
    tpot = document["latency_s"]["tpot"]["band"]
    assert tpot["p50"] == {"low": pytest.approx(0.02 / 1.1, rel=1e-12), "high": pytest.approx(0.02 / 0.9, rel=1e-12)}
    assert document["latency_s"]["itl"]["band"] == tpot
    # E2E: TTFT's band on its 5% of the mean, the decode band on the other 95%, both ends together
    e2e = document["latency_s"]["e2e"]["band"]
    assert e2e["p50"]["low"] == pytest.approx(2.0 * (0.05 / 1.25 + 0.95 / 1.1), rel=1e-12)
    assert e2e["p50"]["high"] == pytest.approx(2.0 * (0.05 / 0.8 + 0.95 / 0.9), rel=1e-12)
    assert "band" not in document["throughput"]  # no row states one


def test_an_applications_stages_are_kept_out_of_the_band():
    records = [_record(0, -0.2, 0.1), _record(1, 0.0, -0.1), _record(2, 0.1, 0.0), _record(3, 0.25, 0.05)]
    document = _document(ttft_s=0.3, e2e_s=2.2)
    attach_bands(document, records, given_s={"ttft": 0.2, "ttfv": 0.2, "e2e": 0.2})
    ttft = document["latency_s"]["ttft"]["band"]
    # 200 ms of the 300 ms mean are stages: the band is on the model's 100 ms, the stages added as they are
    assert ttft["mean"] == {"low": pytest.approx(0.2 + 0.1 / 1.25), "high": pytest.approx(0.2 + 0.1 / 0.8)}
    assert ttft["p99"] == {"low": pytest.approx(0.2 + 0.7 / 1.25), "high": pytest.approx(0.2 + 0.7 / 0.8)}
    assert ttft["basis"].endswith("the application's stages in it (200 ms mean) kept out of the band: the rows "
                                  "validate the model call, not them")
    # E2E: the model's 2 s, of which its first token 100 ms (5%), as without the stages
    e2e = document["latency_s"]["e2e"]["band"]
    assert e2e["mean"]["low"] == pytest.approx(0.2 + 2.0 * (0.05 / 1.25 + 0.95 / 1.1), rel=1e-12)
    assert document["latency_s"]["tpot"]["band"]["mean"]["low"] == pytest.approx(0.02 / 1.1)


@pytest.mark.parametrize(("count", "rank", "rule"), [
    (8, 1, "min-max of their errors"),  # (too few for eight in ten: their whole range)
    (18, 1, "min-max of their errors"),
    (19, 2, "2nd lowest to 2nd highest of their errors"),
    (29, 3, "3rd lowest to 3rd highest of their errors"),
    (40, 4, "4th lowest to 4th highest of their errors"),
])
def test_a_band_leaves_out_the_split_conformal_rank_of_errors_at_each_end(count, rank, rule):
    # errors 0.01 x count, ..., 0.01, 0; k = floor((count + 1) / 10) of them at or beyond each end
    errors = [k / 100 for k in range(count)]
    records = [_record(k, error) for k, error in enumerate(reversed(errors))]
    # and forty rows elsewhere that agree with their regimes' others: the pooled spread is narrower
    records += [_record(count + k, 0.3, chip_generation="Ampere") for k in range(40)]
    document = _document()
    attach_bands(document, records)
    band = document["latency_s"]["ttft"]["band"]
    low, high = errors[rank - 1], errors[count - rank]
    assert band["p50"] == {"low": pytest.approx(0.1 / (1 + high), rel=1e-12),
                           "high": pytest.approx(0.1 / (1 + low), rel=1e-12)}
    assert band["basis"].endswith(rule)


def test_a_new_row_falls_inside_the_band_at_least_eight_times_in_ten():
    # The rank argument the band rests on: of count + 1 exchangeable errors, each equally likely to be the
    # new one, the share that lands inside the band of the other count; from fewer than nine, less
    for count in range(2, 80):
        values = range(count + 1)
        inside = 0
        for new in values:
            low, high, _ = ranked_range([v for v in values if v != new])
            inside += low <= new <= high
        assert (inside / (count + 1) >= 0.8) == (count >= 9), count


def test_a_band_is_at_least_the_spread_rows_show_about_their_own_regimes():
    # Four rows of the scenario's regime agree (+10%): their own range is a point. In two other regimes,
    # log(1 + e) of 0, 0, 0.2, 0.4 and of 0, 0, -0.2, -0.4. Each row against the median of its regime's
    # three others: 0 (x4, the scenario's); 0.4, 0.2, -0.2, -0.2; -0.4, -0.2, 0.2, 0.2. Of 12, one at
    # each end is left out (floor(13 / 10)): -0.4 and 0.4, about the regime's median, log(1.1).
    records = [_record(k, 0.1) for k in range(4)]
    records += [_record(4 + k, math.expm1(x), model_family="MoE") for k, x in enumerate((0.0, 0.0, 0.2, 0.4))]
    records += [_record(8 + k, math.expm1(x), chip_generation="Ampere") for k, x in enumerate((0.0, 0.0, -0.2, -0.4))]
    document = _document()
    attach_bands(document, records)
    band = document["latency_s"]["ttft"]["band"]
    assert band["p50"] == {"low": pytest.approx(0.1 / (1.1 * math.exp(0.4)), rel=1e-12),
                           "high": pytest.approx(0.1 / (1.1 * math.exp(-0.4)), rel=1e-12)}
    assert band["rows"] == 4
    assert band["basis"] == ("vllm-v1, moderate load, dense, Hopper: 4 rows, cross-validated, min-max of their errors, "
                             "widened to the pooled spread of 12 rows")


def test_an_engine_no_row_runs_on_the_chips_generation_takes_the_spread_about_other_pairs():
    # vLLM V1's four Hopper rows read +22% (log 0.2), SGLang's ("prefill-first") four on Hopper and four on
    # Blackwell 0%. About its own regime every row is at 0: no pooled widening. With each row's engine and
    # generation left out, vLLM's rows stand 0.2 above the SGLang rows their band then comes from, the
    # SGLang rows 0 from each other's: of 12, one at each end left out (floor(13 / 10)): 0 and 0.2.
    records = [_record(k, math.expm1(0.2)) for k in range(4)]
    records += [_record(4 + k, 0.0, engine="prefill-first", chip="b200", chip_generation="Blackwell")
                for k in range(4)]
    records += [_record(8 + k, 0.0, engine="prefill-first") for k in range(4)]
    blackwell = {**HOPPER, "chip": "b200", "chip_generation": "Blackwell"}
    document = _document(blackwell)
    attach_bands(document, records)
    band = document["latency_s"]["ttft"]["band"]
    # vLLM's Hopper rows, about their median log(1 + e) of 0.2, widened from 0.2 + 0 to 0.2 + 0.2
    assert band["p50"] == {"low": pytest.approx(0.1 * math.exp(-0.4), rel=1e-12),
                           "high": pytest.approx(0.1 * math.exp(-0.2), rel=1e-12)}
    assert band["basis"].endswith("4 rows, cross-validated, min-max of their errors, widened to the spread of 12 "
                                  "rows about other engine-and-generation pairs' rows (no row runs vllm-v1 on "
                                  "Blackwell)")
    # on Hopper vLLM has rows of its own: their range alone
    document = _document()
    attach_bands(document, records)
    assert document["latency_s"]["ttft"]["band"]["p50"] == {"low": pytest.approx(0.1 * math.exp(-0.2), rel=1e-12),
                                                            "high": pytest.approx(0.1 * math.exp(-0.2), rel=1e-12)}
    assert "pairs" not in document["latency_s"]["ttft"]["band"]["basis"]


def test_too_few_rows_back_off_in_order_and_say_what_was_dropped():
    # Two rows match all four keys, three match once the chip generation is dropped.
    records = [_record(0, 0.1), _record(1, 0.2), _record(2, -0.1, chip_generation="Ampere"),
               _record(3, 0.5, model_family="MoE"), _record(4, 0.6, load="light")]
    document = _document({**HOPPER, "chip_generation": "Blackwell"})
    attach_bands(document, records)
    band = document["latency_s"]["ttft"]["band"]
    assert band["rows"] == 3 and band["p50"]["low"] == pytest.approx(0.1 / 1.2, rel=1e-12)
    assert band["basis"] == ("vllm-v1, moderate load, dense (chip generation dropped: fewer than 3 rows also have "
                             "its chip generation, Blackwell): 3 rows, cross-validated, min-max of their errors")
    # Throughput: two rows in all, none of them of this engine: every row, and the basis says it is thin.
    records += [_record(5, 0.0, throughput=0.1, engine="trtllm"), _record(6, 0.0, throughput=-0.1, engine="trtllm")]
    document = _document()
    attach_bands(document, records)
    band = document["throughput"]["band"]
    assert band["output_tokens_per_s"] == {"low": pytest.approx(1000 / 1.1), "high": pytest.approx(1000 / 0.9)}
    assert band["rows"] == 2
    assert band["basis"] == ("rows of every regime (every key dropped: fewer than 3 rows also have its engine "
                             "profile, vllm-v1): 2 rows, cross-validated, min-max of their errors; fewer than 3 rows "
                             "in all: a band this thin is not an error range")


def test_an_engine_calibrated_scenario_takes_the_calibrated_rows_band():
    from dataclasses import replace

    plain = [_record(k, 0.5 + k / 10) for k in range(4)]  # the uncalibrated model: 50-80% high
    after_fit = [replace(_record(k, e, -e), calibrated=True, source=f"lab{k % 2}")
                 for k, e in enumerate((-0.1, 0.0, 0.05, 0.2))]
    document = _document()
    attach_bands(document, plain + after_fit, ["engine.toml"], engine_calibrated=True)
    ttft, tpot = document["latency_s"]["ttft"]["band"], document["latency_s"]["tpot"]["band"]
    assert ttft["p50"] == {"low": pytest.approx(0.1 / 1.2, rel=1e-12), "high": pytest.approx(0.1 / 0.9, rel=1e-12)}
    assert tpot["p50"] == {"low": pytest.approx(0.02 / 1.1, rel=1e-12), "high": pytest.approx(0.02 / 0.8, rel=1e-12)}
    assert ttft["rows"] == 4 and ttft["calibrated"] is True
    assert ttft["basis"] == ("vllm-v1, moderate load, dense, Hopper: 4 rows, 2 sources, each predicted after a fit "
                             "on a lighter load of its configuration (validate --calibrated), min-max of their "
                             "errors; the scenario is calibrated (engine.toml): the band of calibrated predictions")
    # a delivery calibration alone changes no engine constant: the uncalibrated band, said so
    document = _document()
    attach_bands(document, plain + after_fit, ["delivery.toml"])
    assert document["latency_s"]["ttft"]["band"]["p50"]["low"] == pytest.approx(0.1 / 1.8, rel=1e-12)
    assert document["latency_s"]["ttft"]["band"]["basis"].endswith("this is the uncalibrated model's band, no "
                                                                    "calibrated prediction of this figure is validated")


def test_a_calibrated_scenario_is_labelled_and_its_own_accuracy_not_invented(tmp_path):
    engine = tmp_path / "engine.toml"
    engine.write_text('schema = "tokenpath.engine-calibration/1"\n[fitted.host_step_s]\nvalue = 0.0005\n')
    (tmp_path / "s.toml").write_text('[assumptions]\ncalibration = "engine.toml"\n')
    document = simulate(load_scenario(str(tmp_path / "s.toml"), {"workload.num_requests": 50})).summary
    band = document["latency_s"]["ttft"]["band"]
    assert band["calibrated"] is True and document["throughput"]["band"]["calibrated"] is True
    # the latencies: the shipped calibrated predictions' band; throughput: no calibrated row states one
    calibrated = [r for r in shipped_records() if r.calibrated]
    assert band["rows"] <= len(calibrated) and "each predicted after a fit on a lighter load" in band["basis"]
    assert band["basis"].endswith("; the scenario is calibrated (engine.toml): the band of calibrated predictions")
    assert document["throughput"]["band"]["basis"].endswith(
        "this is the uncalibrated model's band, no calibrated prediction of this figure is validated")


def test_a_calibration_fitted_on_another_deployment_is_outside_the_envelope(tmp_path):
    engine = tmp_path / "engine.toml"
    engine.write_text('schema = "tokenpath.engine-calibration/1"\n[scenario]\nmodel = "llama-3.1-8b"\n'
                      'precision = "fp8"\nchip = "h100"\nengine = "vllm-v1"\nengine_version = "v0.8.3"\n'
                      '[fitted.host_step_s]\nvalue = 0.0005\n')
    (tmp_path / "s.toml").write_text('[assumptions]\ncalibration = "engine.toml"\n')
    flags = {"workload.num_requests": 50, "model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1}
    same = simulate(load_scenario(str(tmp_path / "s.toml"), {**flags, "deployment.chip": "H100_SXM",
                                                                 "engine.version": "0.8.3"})).summary
    assert same["envelope"]["validated"] is True and same["latency_s"]["ttft"]["band"]["calibrated"] is True
    assert same["latency_s"]["ttft"]["band"]["basis"].endswith("the band of calibrated predictions")
    other = simulate(load_scenario(str(tmp_path / "s.toml"), {**flags, "deployment.chip": "h200",
                                                                  "model.precision": "bf16"})).summary
    assert other["envelope"]["outside"] == ["calibration engine.toml fitted on precision fp8, chip h100"]
    assert other["envelope"]["line"].endswith("a calibration: only the deployment it was fitted on)")
    # the fitted value still runs (the scenario asked for it), under the uncalibrated model's band
    assert other["scenario"]["assumptions"]["calibrated"]["host_step_s"]["value"] == 0.0005
    assert other["latency_s"]["ttft"]["band"]["basis"].endswith("this is the uncalibrated model's band, no "
                                                                 "calibrated prediction of this figure is validated")


def test_an_mi300x_scenario_with_an_unvalidated_engine_version_is_outside_the_envelope(tmp_path, monkeypatch, capsys):
    target = tmp_path / "out.json"
    code, out, err = run_cli(["simulate", "--chip", "mi300x", "--set", 'engine.version="0.7"', "--set",
                              "workload.num_requests=50", "--json", str(target)], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads(target.read_text())
    assert document["regime"]["chip_generation"] == "CDNA3" and document["regime"]["engine"] == "vllm-v1"
    assert document["envelope"]["validated"] is False
    # MI300X itself is covered (SGLang's DeepSeek-V3.1 rows), not vLLM V1 on it; no vLLM V1 row states 0.7.
    assert document["envelope"]["outside"] == ["engine profile vllm-v1 on CDNA3", "engine version 0.7"]
    text = " ".join(out.split())
    assert ("outside the validated envelope: engine profile vllm-v1 on CDNA3, engine version 0.7 (rows cover "
            "vllm-v1 on Ampere, Hopper; vllm-v1 versions: 0.8.3 (vllm/vllm-openai:v0.8.3, V1), not stated)") in text
    assert "(version 0.7)" in text  # the scenario's engine line


def test_the_default_scenarios_table_shows_ranges_and_is_inside_the_envelope(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["simulate", "--json", str(tmp_path / "d.json")], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads((tmp_path / "d.json").read_text())
    assert document["envelope"] == {"validated": True, "outside": [], "line": None}
    assert document["regime"]["engine"] == "vllm-v1" and document["regime"]["load"] == "moderate"
    assert "p50 (range)" in out and "outside the validated envelope" not in out
    ttft = next(line for line in out.splitlines() if line.startswith("│ TTFT"))
    band = document["latency_s"]["ttft"]["band"]["p50"]
    shown = f"{format_duration(document['latency_s']['ttft']['p50'])} ({format_number(band['low'] * 1e3, 2)}-" \
            f"{format_number(band['high'] * 1e3, 2)})"
    assert shown in ttft and shown.split()[1] == "ms", ttft
    assert "Ranges (x-y): what would be measured" in out
    assert "vllm-v1, moderate load, dense, Hopper:" in " ".join(out.split())
    e2e = document["latency_s"]["e2e"]["band"]["basis"]  # E2E's own: TTFT's band and the decode band
    assert e2e.startswith("TTFT's band on its first token") and f"E2E: {e2e}" in " ".join(out.split())
    tokens = next(line for line in out.splitlines() if "output tokens/s" in line)
    assert re.search(r"[\d,]+ \([\d,]+-[\d,]+\)", tokens), tokens


def test_the_envelope_names_each_dimension_no_row_covers():
    records = [_record(0, 0.1, version="0.6.0 (V0)"), _record(1, 0.1, chip="a100", chip_generation="Ampere"),
               _record(2, 0.0, throughput=0.1, chip="b200", chip_generation="Blackwell")]
    assert envelope({**HOPPER, "engine_version": "0.6"}, records) == {"validated": True, "outside": [], "line": None}
    # the throughput-only row covers nothing: b200's latency is not validated
    block = envelope({**HOPPER, "chip": "b200", "chip_generation": "Blackwell", "load": "overloaded",
                      "model_family": "MoE", "engine": "trtllm", "engine_version": "1.0"}, records)
    assert block["outside"] == ["chip b200", "chip generation Blackwell", "engine profile trtllm", "model family MoE",
                                "load overloaded", "engine version 1.0"]
    assert block["line"].endswith("(rows cover chip: a100, h100; chip generation: Ampere, Hopper; engine profile: "
                                  "vllm-v1; model family: dense; load: moderate; trtllm versions: none)")


def test_an_engine_profile_no_row_runs_on_the_chips_generation_is_outside_though_each_alone_is_covered():
    records = [_record(0, 0.1), _record(1, 0.1, engine="prefill-first", chip="b200", chip_generation="Blackwell")]
    assert envelope(HOPPER, records)["validated"]
    blackwell = {**HOPPER, "chip": "b200", "chip_generation": "Blackwell"}
    assert envelope(blackwell, records) == {
        "validated": False, "outside": ["engine profile vllm-v1 on Blackwell"],
        "line": "outside the validated envelope: engine profile vllm-v1 on Blackwell (rows cover vllm-v1 on Hopper)"}
    assert envelope({**HOPPER, "engine": "prefill-first"}, records)["outside"] == [
        "engine profile prefill-first on Hopper"]
    # a generation no row has is named once, as the generation, not again as the pair
    ampere = envelope({**HOPPER, "chip": "a100", "chip_generation": "Ampere"}, records)["outside"]
    assert ampere == ["chip a100", "chip generation Ampere"]


def test_attention_data_parallel_is_inside_only_where_a_row_of_the_engine_profile_runs_it():
    # Each engine's ranks schedule their own way (engine/replica.py): SGLang's rows with attention
    # data-parallel say nothing of TensorRT-LLM's.
    records = [_record(0, 0.1), _record(1, 0.1, engine="trtllm"),
               replace(_record(2, 0.1, engine="prefill-first"), attention_dp=True)]
    assert envelope({**HOPPER, "engine": "prefill-first", "attention_dp": True}, records)["validated"]
    assert envelope({**HOPPER, "engine": "trtllm", "attention_dp": False}, records)["validated"]
    block = envelope({**HOPPER, "engine": "trtllm", "attention_dp": True}, records)
    assert block["outside"] == ["attention data-parallel under trtllm"]
    assert block["line"].endswith("(rows cover attention data-parallel: prefill-first)")


def test_tensorrt_llm_with_attention_data_parallel_is_outside_the_shipped_envelope():
    # The shipped rows run attention data-parallel under SGLang only (MI300X): TensorRT-LLM's is unvalidated.
    from tokenpath.sim.document import result_document

    overrides = {"model.name": "deepseek-v3", "deployment.chip": "h200", "deployment.attention_dp": True,
                 "deployment.expert_parallel": True, "workload.num_requests": 20}
    trtllm = result_document(simulate(load_scenario(None, {**overrides, "engine.scheduler": "trtllm"})))[0]
    assert "attention data-parallel under trtllm" in trtllm["envelope"]["outside"]
    assert trtllm["regime"]["attention_dp"] is True
    sglang = result_document(simulate(load_scenario(None, {**overrides, "engine.scheduler": "prefill-first"})))[0]
    assert not any("attention data-parallel" in what for what in sglang["envelope"]["outside"])


def test_a_closed_loop_of_fixed_lengths_through_the_front_end_is_outside_the_envelope(tmp_path, monkeypatch, capsys):
    """The rows score such loops at the engine (validate/latency.locked_loop): through the front end or a
    network, the simulated rounds lock in step, which no row validates. At the engine, or with lengths
    that vary, the same closed loop is inside."""
    loop = ["simulate", "--set", "workload.num_requests=40", "--set", "workload.max_concurrency=8",
            "--set", 'workload.arrival.rate="inf"', "--set", 'workload.input={kind = "fixed", value = 512}',
            "--set", 'workload.output={kind = "fixed", value = 32}']
    code, out, err = run_cli([*loop, "--json", str(tmp_path / "loop.json")], monkeypatch, capsys)
    assert code == 0, err
    document = json.loads((tmp_path / "loop.json").read_text())
    assert document["regime"]["locked_loop"] is True
    assert document["envelope"]["outside"] == ["a closed loop of fixed lengths through a front end or network"]
    assert ("outside the validated envelope: a closed loop of fixed lengths through a front end or network (rows "
            "cover such loops at the engine only)") in " ".join(out.split())
    engine_side = [part for key, value in ENGINE_SIDE_DELIVERY.items() for part in ("--set", f"delivery.{key}={value}")]
    varied = ["--set", 'workload.output={kind = "normal", mean = 32, sd = 8}']
    for extra in (engine_side, varied):
        code, out, err = run_cli([*loop, *extra, "--json", str(tmp_path / "other.json")], monkeypatch, capsys)
        assert code == 0, err
        other = json.loads((tmp_path / "other.json").read_text())
        assert other["regime"]["locked_loop"] is False
        assert "a closed loop of fixed lengths through a front end or network" not in other["envelope"]["outside"]


@pytest.mark.parametrize("stated, wanted, covered", [
    ("0.6.0", "0.6.0", True), ("0.6.0", "0.6", True), ("0.6.0 (V0)", "0.6", True), ("0.6.0", "0.6.1", False),
    ("0.60.0", "0.6", False), ("NIM 1.8.0", "NIM 1.8.0", True), ("NIM 1.8.0", "1.8", False),
    ("not stated", "0.7", False),
])
def test_a_stated_release_covers_its_own_and_its_patch_releases(stated, wanted, covered):
    assert covers_version(stated, wanted) is covered


@pytest.mark.parametrize("stated, wanted, covered", [
    ("0.8.3 (vllm/vllm-openai:v0.8.3, V1)", "v0.8.3", True), ("0.8.3 (vllm/vllm-openai:v0.8.3, V1)", "V0.8", True),
    ("0.8.3 (vllm/vllm-openai:v0.8.3, V1)", "0.8.3.0", True), ("v0.6.0", "0.6", True),
    ("0.5.3", "0.5.3rc0", False), ("0.8.3", "v0.8.4", False),
])
def test_a_release_written_as_its_tag_or_with_trailing_zeros_is_the_release_the_model_simulates(stated, wanted,
                                                                                                 covered):
    # The model reads "v0.8.3" and "0.8.3.0" as 0.8.3 (engine/release.py) and simulates them alike; the
    # envelope must not call the same simulation validated under one spelling and outside under another.
    assert covers_version(stated, wanted) is covered


@given(st.lists(st.integers(0, 999), min_size=1, max_size=4), st.integers(1, 4), st.text(max_size=20))
def test_a_release_covers_every_leading_part_of_itself_and_no_other_number(parts, keep, note):
    release = ".".join(map(str, parts))
    stated = f"{release} {note}" if note else release
    assert covers_version(stated, ".".join(map(str, parts[:keep])))
    assert not covers_version(stated, ".".join(map(str, parts[:keep])) + "0" * 3 + "1")


def test_the_load_regime_and_the_model_family():
    assert load_regime(True, 0.0, 1.0) == "overloaded"
    assert load_regime(False, 0.5, 100.0) == "saturated"
    assert load_regime(False, 0.49, 1.99) == "light"
    assert load_regime(False, 0.2, 2.0) == "moderate"
    # the queue's share is of the model call's TTFT: an application's stages before it do not dilute it
    block = regime_block("vllm-v1", None, "h100", "Hopper", load_model("llama-3.1-8b"), False,
                         {"queue": 0.05, "compute": 0.04, "delivery": 0.01, "application": 0.9}, 20.0)
    assert block["queue_share_of_ttft"] == pytest.approx(0.5) and block["load"] == "saturated"
    assert [model_family(load_model(name)) for name in ("llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3")] == \
        ["dense", "MoE", "MLA"]


def test_the_shipped_bands_file_holds_the_rows_it_was_written_from():
    """Stale when the rows change: regenerate it with `tokenpath validate --cross --write-bands`."""
    from tokenpath.validate.calibrated import configurations

    records = [record for record in shipped_records() if not record.calibrated]
    rows = load_latency()["rows"]
    groups, published = published_rows()
    offline = [row for row in published if row["group"] == THROUGHPUT_GROUP and not row.get("calibration")]
    by_id = {record.id: record for record in records}
    assert len(by_id) == len(records)
    # the calibrated predictions: every row of a configuration measured at 3+ loads but its lightest
    calibrated = {record.id: record for record in shipped_records() if record.calibrated}
    ids = latency_row_ids(rows)
    assert set(calibrated) == {ids[k] for c in configurations(rows) for k in c.rows if k != c.lightest}
    for row_id, record in calibrated.items():
        assert set(record.errors) == {"ttft", "decode"} and record.chip == by_id[row_id].chip, row_id
    assert set(by_id) == set(latency_row_ids(rows)) | set(group_row_ids(THROUGHPUT_GROUP, len(offline)))
    # what the catalog says of each row today, without simulating it
    for row_id, row in zip(latency_row_ids(rows), rows):
        record = by_id[row_id]
        assert (record.engine, record.chip, record.chip_generation, record.model_family, record.engine_version) == \
            (row_engine(row)["scheduler"], load_chip(row["chip"]).name, load_chip(row["chip"]).generation,
             model_family(load_model(row["model"])), row.get("engine_version", "")), row_id
        assert {"ttft", "decode"} <= set(record.errors) and record.cross_validated
        assert ("throughput" in record.errors) == ("throughput_tokens_per_s" in row.get("also", {}))
    for row_id, row in zip(group_row_ids(THROUGHPUT_GROUP, len(offline)), offline):
        record = by_id[row_id]
        assert (record.model, record.chip_generation, set(record.errors)) == \
            (row["model"], load_chip(row["chip"]).generation, {"throughput"}), row_id


def test_a_group_that_fits_a_constant_gives_the_bands_its_held_out_errors():
    """Each row of a group that fits a constant enters the bands with `validate`'s error for it, the constant
    fitted on the group's other rows, not with the registry's value, the fit on every row, its own too. The
    batch-1 TTFT group stands in for the offline throughput group (four rows, a second to simulate): Llama 2
    7B's 128-token prompt reads +14.1% with the launch gap fitted on the other three (5.63 us), -0.1% with
    the registry's 3.71 us."""
    from tokenpath.validate.bands_build import group_errors
    from tokenpath.validate.groups import predict

    rows, results = group_errors("trtllm_batch1_ttft", 1, lambda _: None)
    groups, published = published_rows()
    assert rows == [row for row in published if row["group"] == "trtllm_batch1_ttft"]
    assert [r["error"] for r in results] == pytest.approx([0.1409, -0.0232, -0.1089, 0.0917], abs=5e-4)
    registry = [predict(row, groups["trtllm_batch1_ttft"]) / row["published"] - 1 for row in rows]
    assert registry == pytest.approx([-0.0008, -0.0232, -0.1087, 0.0759], abs=5e-4)
    assert all((r["regime"]["engine"], r["regime"]["chip"]) == ("trtllm", "h100") for r in results)


def test_write_bands_needs_the_cross_validation_and_the_shipped_rows(monkeypatch, capsys):
    assert_user_error(*run_cli(["validate", "--write-bands"], monkeypatch, capsys), "--write-bands", "--cross")
    assert_user_error(*run_cli(["validate", "--cross", "--write-bands", "--latency-rows", "x.toml"], monkeypatch,
                               capsys), "--write-bands", "--latency-rows")


def _summary(outside):
    return {"envelope": {"validated": not outside, "outside": outside, "line": None}, "attribution_s": None}


def test_levers_and_sweep_frontiers_mark_what_lies_outside_the_envelope(monkeypatch, tmp_path):
    from tokenpath.cli import levers, sweep

    console = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(levers, "console", console)
    change = {"value": 1.0, "relative": 0.0, "better": 0.0, "draws": {"within_noise": None}}
    document = {"objective": {"metric": "latency_s.ttft.p99", "name": "TTFT p99", "better": "lower",
                              "tie_break": None, "value": 1.0, "draws": {"seeds": [0], "values": [1.0]}},
                "baseline": _summary([]), "skipped": [],
                "levers": [{"name": "next chip", "group": "compute", "change": change,
                            "summary": _summary(["chip b200", "chip generation Blackwell"])},
                           {"name": "TP4", "group": "wider", "change": change, "summary": _summary([])}]}
    levers._print(document, 100)
    out = console.file.getvalue()
    assert "next chip *" in out and "TP4 *" not in out and "baseline *" not in out
    assert "* outside the validated envelope (docs/validation.md): next chip (chip b200, chip generation Blackwell)" \
        in out
    console = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(sweep, "console", console)
    rows = [{"point": "a", "x": 1.0, "envelope.validated": False}, {"point": "b", "x": 2.0, "envelope.validated": True}]
    sweep._write_pareto(tmp_path / "out.csv", [], [("x", "max")], rows)
    out = console.file.getvalue()
    assert "a *" in out and "b *" not in out and "* outside the validated envelope" in out


def test_the_html_report_prints_each_range_and_the_envelope_line():
    from types import SimpleNamespace

    from tokenpath.report.html import _bands

    records = [_record(k, 0.25 * (k - 1)) for k in range(3)]  # errors -0.25, 0, +0.25
    summary = _document()
    attach_bands(summary, records)
    summary["envelope"] = {"validated": False, "outside": ["chip mi300x"], "line": "outside the validated envelope: x"}
    page = _bands(SimpleNamespace(runs=[SimpleNamespace(label="run", summary=summary)]))
    # TTFT p50 100 ms: 100 / 1.25 to 100 / 0.75
    assert "<td>TTFT p50</td><td>100 ms</td><td class='band'>80 ms - 133 ms</td>" in page
    assert "<b>outside the validated envelope: x</b>" in page and "How far to trust them" in page


def test_the_pooled_spread_holds_out_a_rows_whole_source():
    """A new deployment is another source's: one lab's four loads of one configuration, all +49% (log 0.4),
    are measured against the other labs' rows (five MoE rows at 0), not against each other (which read 0 and
    left the band a point). Of nine deviations, 0.4 (x4) and 0 (x5), one at each end is left out: 0 to 0.4
    about the lab's own log(1.49)."""
    records = [_record(k, math.expm1(0.4), source="one lab") for k in range(4)]
    records += [_record(4 + k, 0.0, model_family="MoE") for k in range(5)]
    document = _document()
    attach_bands(document, records)
    band = document["latency_s"]["ttft"]["band"]
    assert band["p50"] == {"low": pytest.approx(0.1 / math.exp(0.8), rel=1e-12),
                           "high": pytest.approx(0.1 / math.exp(0.4), rel=1e-12)}
    assert band["basis"].endswith("widened to the pooled spread of 9 rows")
