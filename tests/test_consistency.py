"""A published row checked against physics before the model (validate/consistency.py): the floor under
a closed loop's mean TTFT by hand, and the shipped rows left out exactly where their figures lie under it."""

import pytest

from cli_helpers import assert_user_error, run_cli
from tokenpath.validate.consistency import below_floor, ttft_floor_s
from tokenpath.validate.latency import load_latency

DATA = load_latency()
# A closed loop of 2 on one H100 (bf16, 989 TFLOP/s dense), 4 requests of 1,000-token prompts.
ROW = {"source": "lab", "engine": "vllm", "model": "llama-3.1-8b", "precision": "bf16", "chip": "h100", "tp": 1,
       "lengths": "fixed", "input_len": 1000, "output_len": 100, "arrival": "concurrency", "concurrency": 2,
       "num_requests": 4, "window": "whole", "ttft_ms": 50.0, "ttft_stat": "mean", "decode_ms": 10.0,
       "decode_metric": "tpot", "decode_stat": "mean"}


def test_the_floor_of_a_closed_loop_by_hand():
    # Llama 3.1 8B: 8,030,261,248 weights a token uses, less its untied embedding and LM head (2 x 128,256 x
    # 4,096): 2 x 6,979,588,096 FLOPs a token; 1,000 tokens at 989 TFLOP/s take 14.115 ms. The two prompts
    # sent at once have their first tokens no sooner than 14.1 and 28.2 ms: (14.1 + 28.2) / 4 requests.
    prompt_s = 1000 * 2 * (8_030_261_248 - 2 * 128_256 * 4_096) / 989e12
    assert ttft_floor_s(ROW, DATA["sharegpt"]) == pytest.approx((prompt_s + 2 * prompt_s) / 4, rel=1e-12)
    assert below_floor(ROW, DATA["sharegpt"]) is None  # 50 ms is above 10.6 ms
    assert "below the 11 ms that the first 2 prompts' prefill" in below_floor({**ROW, "ttft_ms": 5.0}, DATA["sharegpt"])
    # no floor where the run is not a closed loop from its start, or the figure is a median
    for changed in ({"ttft_stat": "median"}, {"arrival": "poisson", "rate": 1.0}, {"window": "steady"}):
        assert ttft_floor_s({**ROW, **changed}, DATA["sharegpt"]) is None


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
