"""`tokenpath validate --latency-rows FILE`: a user's own latency rows, checked and predicted as the shipped ones."""

import json

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath.config.errors import UserError
from tokenpath.validate.latency_rows import read_latency_rows

SHIPPED = read_latency_rows()
ROW = next(r for r in SHIPPED["rows"] if r.get("id", "").endswith("1024x1024_c4_tp8_ep1_725"))  # 80 requests


# A closed loop drawing lengths from 819 to 1,024 tokens (SGLang's --random-range-ratio 0.8).
UNIFORM = {**{k: v for k, v in ROW.items() if k not in ("input_len", "output_len")}, "lengths": "uniform",
           "input_mean": 921.5, "output_mean": 921.5, "input_min": 819, "input_max": 1024, "output_min": 819,
           "output_max": 1024}


def _file(tmp_path, rows, **top):
    path = tmp_path / "rows.toml"
    path.write_text(tomli_w.dumps({**top, "rows": rows}))
    return str(path)


def test_a_users_row_is_predicted_as_the_shipped_group_predicts_it(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["validate", "--latency-rows", _file(tmp_path, [ROW]), "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    mine = json.loads(out)
    # the shipped group predicts each of its rows with predict_row (validate/latency.py's run_latency_group)
    from tokenpath.validate.latency import predict_row

    shipped = predict_row(next(r for r in SHIPPED["rows"] if r.get("id") == ROW["id"]), SHIPPED["sharegpt"])
    [row] = mine["rows"]
    assert (row["predicted_ttft_ms"] == shipped["ttft_s"] * 1e3
            and row["predicted_decode_ms"] == shipped["decode_s"] * 1e3)
    group = mine["groups"]["latency"]
    assert group["rows"] == 1 and group["median_abs_error_ttft"] == pytest.approx(abs(row["ttft_error"]))
    assert set(mine["groups"]) == {"latency"}  # alone, only the latency group
    assert row["front_end"] is False  # a closed loop of fixed lengths: at the engine (validate/latency.locked_loop)


def test_the_table_says_which_rows_run_without_the_front_end(tmp_path, monkeypatch, capsys):
    poisson = {**ROW, "arrival": "poisson", "rate": 2.0, "window": "whole", "num_requests": 40}
    rows = [ROW, poisson, {**poisson, "endpoint": "engine"}]
    code, out, err = run_cli(["validate", "--latency-rows", _file(tmp_path, rows)], monkeypatch, capsys)
    assert code == 0, err
    assert "2 of the 3 rows run without the server's front end or a network" in " ".join(out.split())


def test_a_rows_kv_cache_precision_reaches_its_scenario():
    """A source that ran an fp8 KV cache says so (AIConfigurator's rows do); unset, the engine's default
    (bf16 in vLLM)."""
    from tokenpath.validate.latency import row_scenario

    assert ROW["kv_cache_precision"] == "fp8"
    assert row_scenario(ROW, SHIPPED["sharegpt"]).model.kv_precision("vllm-v1") == "fp8"
    unset = {key: value for key, value in ROW.items() if key != "kv_cache_precision"}
    assert row_scenario(unset, SHIPPED["sharegpt"]).model.kv_precision("vllm-v1") == "bf16"


def test_a_uniform_row_with_a_range_draws_its_lengths_from_it():
    """From input_min to input_max around the mean; without them, from 1 to twice the mean."""
    import numpy as np

    from tokenpath import simulate
    from tokenpath.validate.latency import row_scenario

    run = simulate(row_scenario(UNIFORM, SHIPPED["sharegpt"])).run
    prompts = np.asarray(run.input_tokens)
    assert prompts.min() >= 819 and prompts.max() <= 1024 and abs(prompts.mean() - 921.5) < 25
    wide = {k: v for k, v in UNIFORM.items() if k not in ("input_min", "output_min")}
    assert row_scenario(wide, SHIPPED["sharegpt"]).workload.input.range_ratio == pytest.approx(0.998)


def test_a_uniform_row_without_its_range_prints_the_range_simulated(tmp_path, monkeypatch, capsys):
    from tokenpath.validate.row_keys import lengths_label

    bare = {k: v for k, v in UNIFORM.items() if k not in ("input_min", "input_max", "output_min", "output_max")}
    code, out, err = run_cli(["validate", "--latency-rows", _file(tmp_path, [bare])], monkeypatch, capsys)
    assert code == 0, err
    assert lengths_label(bare) == "U(1..1843)/U(1..1843)"  # from 1 to twice the mean, 921.5
    assert lengths_label(UNIFORM) == "U(819..1024)/U(819..1024)"


def test_the_table_names_the_users_rows(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["validate", "--latency-rows", _file(tmp_path, [{**ROW, "source": "my_lab"}])],
                             monkeypatch, capsys)
    assert code == 0, err
    assert "my_lab" in out and "(0 calibration rows left out)" in out


def _without(key):
    return {k: v for k, v in ROW.items() if k != key}


@pytest.mark.parametrize(("rows", "fragments"), [
    ([{**ROW, "enigne": "vllm"}], ["rows[0] (aiconfigurator_silicon)", "enigne", "Extra inputs"]),
    ([{**ROW, "engine": "tgi"}], ["rows[0]", "engine", "'vllm', 'sglang' or 'trtllm'"]),
    ([{**ROW, "tp": "8"}], ["rows[0]", "tp"]),
    ([{**ROW, "ttft_ms": -3.0}], ["rows[0]", "ttft_ms", "greater than 0"]),
    ([_without("input_len")], ["rows[0]", "needs input_len", "lengths = 'fixed'"]),
    ([{**ROW, "window": "whole"}], ["rows[0]", "needs num_requests"]),
    ([{**ROW, "arrival": "poisson"}], ["rows[0]", "needs rate"]),
    ([ROW, {**ROW, "model": "llama-9b"}], ["latency rows[1] (aiconfigurator_silicon)", "unknown model 'llama-9b'"]),
    ([{**ROW, "engine_settings": {"cuda_graph": "decode"}}],
     ["rows[0]", "unknown key 'engine.cuda_graph'", "cuda_graphs"]),
    ([{**ROW, "kv_cache_precision": "int8"}], ["rows[0]", "kv_cache_precision", "'auto', 'bf16' or 'fp8'"]),
    ([{**ROW, "input_min": 100}], ["rows[0]", "input_min goes with lengths = 'uniform'"]),
    ([{**UNIFORM, "output_mean": 2000.0}], ["rows[0]", "output_mean (2000) must lie between output_min (819)"]),
    ([{**ROW, "endpoint": "grpc"}], ["rows[0]", "endpoint", "'completions', 'chat' or 'engine'"]),
    ([{**ROW, "chat_template_tokens": 30}], ["rows[0]", "chat_template_tokens goes with endpoint = 'chat'"]),
    ([{**ROW, "endpoint": "engine", "network_rtt_ms": 5.0}], ["rows[0]", "network_rtt_ms is the client's round trip"]),
    ([], ["no [[rows]]"]),
])
def test_a_row_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, capsys, rows, fragments):
    assert_user_error(*run_cli(["validate", "--latency-rows", _file(tmp_path, rows)], monkeypatch, capsys), *fragments)


def test_the_sharegpt_table_is_checked_too(tmp_path, monkeypatch, capsys):
    stats = {"clip_input_max": 1024, "clip_total_max": 2048}
    assert_user_error(*run_cli(["validate", "--latency-rows", _file(tmp_path, [ROW], sharegpt=stats)],
                               monkeypatch, capsys),
                      "sharegpt: min_tokens: Field required")
    assert read_latency_rows(_file(tmp_path, [ROW], sharegpt={**stats, "min_tokens": 4}))["sharegpt"]["min_tokens"] == 4


def test_a_file_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, capsys):
    assert_user_error(*run_cli(["validate", "--latency-rows", str(tmp_path / "none.toml")], monkeypatch, capsys),
                      "none.toml", "latency rows file not found")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rows]\nsource = 1")
    assert_user_error(*run_cli(["validate", "--latency-rows", str(bad)], monkeypatch, capsys),
                      "bad.toml", "not valid TOML")
    assert_user_error(*run_cli(["validate", "--latency-rows", str(bad), "--group", "nccl_allreduce"],
                               monkeypatch, capsys),
                      "--latency-rows", "--group latency")


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(ROW) + ["input_mean", "rate", "extra"]), value=VALUES, drop=st.booleans())
def test_a_mutated_row_is_read_or_refused_in_one_line(tmp_path_factory, key, value, drop):
    row = _without(key) if drop else {**ROW, key: value}
    path = _file(tmp_path_factory.mktemp("rows"), [{k: v for k, v in row.items() if v is not None}])
    try:
        data = read_latency_rows(path)
    except UserError as error:
        assert "\n" not in str(error) and "rows[0]" in str(error)
    else:
        assert data["rows"][0]["source"] == ROW["source"] or key == "source"


def test_a_row_states_the_deployments_split_and_its_speculative_decoding():
    from tokenpath.validate.latency import row_scenario
    from tokenpath.validate.row_keys import configuration_key, label

    row = {**ROW, "model": "deepseek-v3", "precision": "fp8", "tp": 4, "pp": 2, "expert_parallel": True,
           "moe_all_to_all": True, "attention_dp": True, "engine_settings": {**ROW.get("engine_settings", {}),
                                                     "speculative": {"method": "mtp", "num_speculative_tokens": 2}},
           "draft_acceptance": 0.8}
    scenario = row_scenario(row, SHIPPED["sharegpt"])
    dep = scenario.deployment
    assert (dep.chips, dep.tp, dep.pp, dep.expert_parallel, dep.moe_all_to_all, dep.attention_dp) == (
        8, 4, 2, True, True, True)
    assert scenario.engine.speculative.num_speculative_tokens == 2 and scenario.workload.draft_acceptance == 0.8
    assert label(row).endswith("TP4 PP2 EP all-to-all DP-attention")
    assert configuration_key(row) != configuration_key({**row, "attention_dp": False})
    assert configuration_key(row) != configuration_key({**row, "moe_all_to_all": False})


def test_a_rows_draft_acceptance_is_checked(tmp_path):
    with pytest.raises(UserError, match=r"rows\[0\].*draft_acceptance"):
        read_latency_rows(_file(tmp_path, [{**ROW, "draft_acceptance": 1.5}]))
