"""A published row checked against physics before the model (validate/consistency.py): the floors under a
closed loop's mean and P99 TTFT by hand, prompts the server holds, the pages' evidence of a warm cache, and
the shipped rows left out exactly where their figures lie under their floors."""

import numpy as np
import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath.validate.consistency import below_floor, ttft_floors_s
from tokenpath.validate.latency import load_latency, row_prepared

DATA = load_latency()
# A closed loop of 2 on one H100 (bf16, 989 TFLOP/s dense), 4 requests of 1,000-token prompts.
ROW = {"source": "lab", "engine": "vllm", "model": "llama-3.1-8b", "precision": "bf16", "chip": "h100", "tp": 1,
       "lengths": "fixed", "input_len": 1000, "output_len": 100, "arrival": "concurrency", "concurrency": 2,
       "num_requests": 4, "window": "whole", "ttft_ms": 50.0, "ttft_stat": "mean", "decode_ms": 10.0,
       "decode_metric": "tpot", "decode_stat": "mean"}
# Llama 3.1 8B: 8,030,261,248 weights a token uses, less its untied embedding and LM head (2 x 128,256 x
# 4,096): 2 x 6,979,588,096 FLOPs a token, at 989 TFLOP/s.
TOKEN_S = 2 * (8_030_261_248 - 2 * 128_256 * 4_096) / 989e12


def shipped(page_id: str) -> dict:
    return next(row for row in DATA["rows"] if row.get("id", "").startswith(page_id))


def test_the_floors_of_a_closed_loop_by_hand():
    # The two prompts sent at once have their first tokens no sooner than 14.1 and 28.2 ms, the other two
    # no sooner than 0: the mean floor is (14.1 + 28.2) / 4; numpy's P99 of [0, 0, 14.1, 28.2] lies 0.97 of
    # the way from 14.1 to 28.2.
    prompt_s = 1000 * TOKEN_S
    floors = ttft_floors_s(ROW, DATA["sharegpt"])
    assert floors["mean"] == pytest.approx((prompt_s + 2 * prompt_s) / 4, rel=1e-12)
    assert floors["p99"] == pytest.approx(prompt_s + 0.97 * prompt_s, rel=1e-12)
    assert below_floor(ROW, DATA["sharegpt"]) is None  # 50 ms is above 10.6 ms
    assert "mean TTFT of 5 ms is below the 11 ms that the first 2 prompts' prefill" in below_floor(
        {**ROW, "ttft_ms": 5.0}, DATA["sharegpt"])
    # a median row is checked on the P99 it also states
    median = {**ROW, "ttft_stat": "median", "also": {"ttft_p99_ms": 20.0}}
    assert "p99 TTFT of 20 ms is below the 28 ms" in below_floor(median, DATA["sharegpt"])
    # no floor where the run is not a closed loop from its start
    for changed in ({"arrival": "poisson", "rate": 1.0}, {"window": "steady"}):
        assert ttft_floors_s({**ROW, **changed}, DATA["sharegpt"]) is None


def test_a_prompt_the_server_holds_needs_only_its_last_token():
    # The A100 page's 8000/1000 run at concurrency 64: its first 64 prompts were the first 64 of the 80
    # its run at concurrency 16 sent, so each computes one token; cold (the warm-up's prompt alone
    # held), their prefill puts the mean over 320 requests at 871 ms, above the 633 ms the page prints.
    row = next(row for row in DATA["rows"] if row["source"] == "sgl_cookbook_a100" and row["concurrency"] == 64)
    assert row["cached_prompts"] == 80
    cold = {key: value for key, value in row.items() if key != "cached_prompts"}
    assert ttft_floors_s(cold, DATA["sharegpt"])["mean"] == pytest.approx(0.871, abs=5e-4)
    assert "mean TTFT of 633 ms is below the 871 ms" in below_floor(cold, DATA["sharegpt"])
    # warm: 64 burst prompts of one token each, k tokens' FLOPs for the k-th, over 320 requests
    llama_70b_token_s = ttft_floors_s(row, DATA["sharegpt"])["mean"] * 320 / (64 * 65 / 2)
    assert llama_70b_token_s == pytest.approx(2 * (70_553_706_496 - 2 * 128_256 * 8_192) / (8 * 312e12), rel=1e-9)
    assert below_floor(row, DATA["sharegpt"]) is None


def test_the_qwen3_page_ran_warm_where_a_cold_burst_needs_the_chips_whole_peak():
    # Its 8000/1000 run at concurrency 64 printed a P99 TTFT of 510 ms; cold, its first 64 prompts'
    # prefill alone, at 8 x B200's peak dense bf16 FLOP/s and with no attention, puts the P99 at 508 ms:
    # 99.4% of the peak, for 255,000 prompt tokens. The page's rows say the server held its runs' prompts.
    row = shipped("Qwen3.md 8000/1000 c64")
    cold = {key: value for key, value in row.items() if key != "cached_prompts"}
    ratio = ttft_floors_s(cold, DATA["sharegpt"])["p99"] / (row["also"]["ttft_p99_ms"] / 1e3)
    assert 0.99 < ratio < 1.0
    assert [shipped(f"Qwen3.md {scenario} c{c}").get("cached_prompts") for scenario, c in (
        ("1000/1000", 16), ("1000/1000", 100), ("1000/8000", 16), ("1000/8000", 64), ("8000/1000", 16),
        ("8000/1000", 64))] == [10, 80, 10, 80, 10, 80]
    # DeepSeek-R1's page ran each run on a fresh server: its rows state none
    assert not [row for row in DATA["rows"] if row.get("id", "").startswith("DeepSeek-R1") and "cached_prompts" in row]


def test_the_shipped_rows_left_out_are_exactly_those_under_the_floor():
    assert [row["reason"] for row in DATA["left_out"]] == [below_floor(row, DATA["sharegpt"])
                                                          for row in DATA["left_out"]]
    assert all(row["reason"] for row in DATA["left_out"])
    assert not [row["source"] for row in DATA["rows"] if below_floor(row, DATA["sharegpt"])]


def test_a_left_out_row_needs_its_reason(tmp_path, monkeypatch, capsys):
    import tomli_w

    path = tmp_path / "rows.toml"
    path.write_text(tomli_w.dumps({"rows": [ROW], "left_out": [ROW]}))
    assert_user_error(*run_cli(["validate", "--latency-rows", str(path)], monkeypatch, capsys),
                      "left_out[0]", "reason", "Field required")


def test_a_burst_of_prompts_all_held_computes_their_last_tokens_only():
    # Four 1,000-token prompts sent at once: cold, the k-th waits for k prompts' FLOPs; every prompt held
    # (a drawn-length row states it for all of them), each computes one token.
    burst = {**ROW, "arrival": "all_at_once"}
    del burst["concurrency"]
    prompt_s = 1000 * TOKEN_S
    assert ttft_floors_s(burst, DATA["sharegpt"])["mean"] == pytest.approx(prompt_s * (1 + 2 + 3 + 4) / 4, rel=1e-12)
    assert "mean TTFT of 5 ms is below the 35 ms that the first all prompts" in below_floor(
        {**burst, "ttft_ms": 5.0}, DATA["sharegpt"])
    held = {**burst, "cached_prompts": 4}
    assert ttft_floors_s(held, DATA["sharegpt"])["mean"] == pytest.approx(TOKEN_S * (1 + 2 + 3 + 4) / 4, rel=1e-12)
    requests = row_prepared(held, DATA["sharegpt"]).requests
    assert np.array_equal(requests.prefixes.warm_tokens(), requests.input_tokens - 1)


def test_cached_prompts_count_every_prompt_unless_the_draw_is_replayed(tmp_path, monkeypatch, capsys):
    import tomli_w

    for changed, words in (({"cached_prompts": 2}, "all of them unless lengths = 'sglang_random'"),
                           ({"cached_prompts": 5}, "counts at most num_requests"),
                           ({"cached_prompts": 0}, "greater than or equal to 1")):
        path = tmp_path / "rows.toml"
        path.write_text(tomli_w.dumps({"rows": [{**ROW, **changed}]}))
        assert_user_error(*run_cli(["validate", "--latency-rows", str(path)], monkeypatch, capsys),
                          "rows[0]", words)
