"""Workload specs, length samplers, arrival processes and request generation."""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tokenpath.config import memory
from tokenpath.config.errors import UserError
from tokenpath.workload import (
    ArrivalSpec,
    LengthSpec,
    Requests,
    TraceSpec,
    WorkloadSpec,
    fingerprint_inputs,
    generate,
    write_trace,
)
from tokenpath.workload.arrivals import arrival_times_s, vllm_send_times_s
from tokenpath.workload.lengths import sample_lengths, uniform_bounds
from tokenpath.workload.spec import MAX_TOKENS


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _requests(arrival_s, input_tokens, output_tokens) -> Requests:
    return Requests(
        np.asarray(arrival_s, dtype=np.float64),
        np.asarray(input_tokens, dtype=np.int64),
        np.asarray(output_tokens, dtype=np.int64),
    )


# --- Requests -----------------------------------------------------------------------------------


def test_requests_take_and_len():
    requests = _requests([0.0, 1.0, 2.0, 3.0], [10, 20, 30, 40], [1, 2, 3, 4])
    assert len(requests) == 4
    odd = requests.take(np.array([1, 3]))
    assert odd.arrival_s.tolist() == [1.0, 3.0]
    assert odd.input_tokens.tolist() == [20, 40]
    assert odd.output_tokens.tolist() == [2, 4]
    assert requests.take(requests.input_tokens > 25) == _requests([2.0, 3.0], [30, 40], [3, 4])
    assert len(requests.take(np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize(
    "columns, error",
    [
        ((np.zeros(1), np.ones(1, dtype=np.int32), np.ones(1, dtype=np.int64)), TypeError),
        ((np.zeros((1, 1)), np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64)), TypeError),
        ((np.zeros(2), np.ones(1, dtype=np.int64), np.ones(2, dtype=np.int64)), ValueError),
    ],
)
def test_requests_rejects_bad_shapes(columns, error):
    with pytest.raises(error):
        Requests(*columns)


@pytest.mark.parametrize(
    "arrival_s, input_tokens, output_tokens",
    [([1.0, 0.5], [1, 1], [1, 1]), ([-1.0], [1], [1]), ([math.nan], [1], [1]), ([0.0], [0], [1]), ([0.0], [1], [0])],
)
def test_requests_rejects_bad_values(arrival_s, input_tokens, output_tokens):
    with pytest.raises(ValueError):
        _requests(arrival_s, input_tokens, output_tokens)


# --- specs ----------------------------------------------------------------------------------------


def test_default_is_llmperf_workload():
    spec = WorkloadSpec()
    assert spec.num_requests == 2000
    assert spec.max_concurrency is None
    assert (spec.input.kind, spec.input.mean, spec.input.sd, spec.input.min) == ("normal", 550, 150, 1)
    assert (spec.output.kind, spec.output.mean, spec.output.sd, spec.output.min) == ("normal", 150, 80, 1)
    assert (spec.arrival.rate, spec.arrival.burstiness, spec.arrival.pattern) == (10.0, 1.0, "gamma")
    assert spec.trace is None


def test_spec_from_toml_tables():
    spec = WorkloadSpec.model_validate(
        {
            "num_requests": 100,
            "max_concurrency": 10,
            "input": {"kind": "uniform", "mean": 1024, "range_ratio": 0.1},
            "output": {"kind": "fixed", "value": 128},
            "arrival": {"rate": "inf"},
            "trace": {"path": "t.csv", "format": "azure", "time_scale": 2.0},
        }
    )
    assert spec.max_concurrency == 10
    assert spec.arrival.rate == math.inf
    assert spec.trace == TraceSpec(path="t.csv", format="azure", time_scale=2.0)


@pytest.mark.parametrize(
    "data, location",
    [
        ({"num_request": 10}, ("num_request",)),
        ({"input": {"kind": "normal", "mean": 1, "sd": 1, "stdev": 2}}, ("input", "stdev")),
        ({"arrival": {"rate": 1.0, "burst": 2.0}}, ("arrival", "burst")),
        ({"trace": {"path": "t.csv", "format": "azure", "scale": 2.0}}, ("trace", "scale")),
    ],
)
def test_unknown_keys_are_errors(data, location):
    with pytest.raises(ValidationError) as caught:
        WorkloadSpec.model_validate(data)
    assert caught.value.errors()[0]["loc"] == location
    assert caught.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize(
    "table, message",
    [
        ({"kind": "fixed"}, "kind 'fixed' needs value; missing value"),
        ({"kind": "normal", "mean": 550}, "kind 'normal' needs mean and sd; missing sd"),
        ({"kind": "lognormal", "sd": 3}, "kind 'lognormal' needs mean and sd; missing mean"),
        ({"kind": "uniform", "mean": 100}, "kind 'uniform' needs mean and range_ratio; missing range_ratio"),
        ({"kind": "empirical"}, "kind 'empirical' needs path; missing path"),
        ({"kind": "fixed", "value": 5, "mean": 5}, "kind 'fixed' does not use mean"),
        ({"kind": "normal", "mean": 5, "sd": 1, "column": "x"}, "kind 'normal' does not use column"),
        ({"kind": "normal", "mean": 5, "sd": 1, "min": 10, "max": 5}, "max 5 is below min 10"),
        ({"kind": "fixed", "value": 50, "max": 10}, "value 50 lies outside [min, max]"),
        ({"kind": "lognormal", "mean": 0.5, "sd": 1}, "kind 'lognormal' needs mean >= 1 token"),
        ({"kind": "normal", "mean": 0, "sd": 0.2}, "put almost no draws at or above min 1"),
        ({"kind": "normal", "mean": 100, "sd": 0, "min": 101}, "put almost no draws at or above min 101"),
        # a spec whose clipping could not give its stated mean
        ({"kind": "normal", "mean": 550, "sd": 150, "max": 10}, "mean 550 lies above max 10"),
        ({"kind": "uniform", "mean": 550, "range_ratio": 0.5, "max": 500}, "mean 550 lies above max 500"),
        ({"kind": "lognormal", "mean": 500, "sd": 1e9}, "put the median draw at 0.00025 tokens, below min 1"),
        ({"kind": "lognormal", "mean": 100, "sd": 300, "min": 50}, "put the median draw at 31.6 tokens, below min 50"),
    ],
)
def test_length_spec_per_kind_errors(table, message):
    with pytest.raises(ValidationError) as caught:
        WorkloadSpec.model_validate({"input": table})
    error = caught.value.errors()[0]
    assert error["loc"] == ("input",)
    assert message in error["msg"]


@pytest.mark.parametrize(
    "data",
    [
        {"input": {"kind": "normal", "mean": -5, "sd": 1}},
        {"input": {"kind": "normal", "mean": 5, "sd": -1}},
        {"input": {"kind": "fixed", "value": 0}},
        {"input": {"kind": "fixed", "value": 5, "min": 0}},
        {"input": {"kind": "uniform", "mean": 5, "range_ratio": 1.0}},
        {"input": {"kind": "uniform", "mean": 5, "range_ratio": -0.1}},
        {"input": {"kind": "fixed", "value": 5.5}},
        {"input": {"kind": "normal", "mean": math.inf, "sd": 1}},
        {"input": {"kind": "gauss", "mean": 5, "sd": 1}},
        {"arrival": {"rate": 0}},
        {"arrival": {"rate": -1.0}},
        {"arrival": {"rate": math.nan}},
        {"arrival": {"rate": "fast"}},
        {"arrival": {"burstiness": 0}},
        {"arrival": {"pattern": "poisson"}},
        {"num_requests": 0},
        {"num_requests": "10"},
        {"max_concurrency": 0},
        {"trace": {"path": "t.csv", "format": "sharegpt"}},
        {"trace": {"path": "t.csv", "format": "azure", "time_scale": 0}},
        {"trace": {"format": "azure"}},
    ],
)
def test_bad_values_are_errors(data):
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(data)


@pytest.mark.parametrize("rate", ["inf", "Infinity", math.inf])
def test_infinite_rate_spellings(rate):
    assert ArrivalSpec(rate=rate).rate == math.inf


def test_spec_json_round_trip_keeps_infinite_rate():
    spec = WorkloadSpec(arrival=ArrivalSpec(rate="inf"), max_concurrency=4)
    assert WorkloadSpec.model_validate_json(spec.model_dump_json()) == spec


def test_specs_are_frozen():
    with pytest.raises(ValidationError):
        WorkloadSpec().num_requests = 5


def test_resolve_paths(tmp_path):
    spec = WorkloadSpec(
        input=LengthSpec(kind="empirical", path="lengths.txt"),
        output=LengthSpec(kind="empirical", path="/abs/out.txt"),
        trace=TraceSpec(path="trace.csv", format="azure"),
    )
    resolved = spec.resolve_paths(tmp_path)
    assert resolved.input.path == os.path.join(tmp_path, "lengths.txt")
    assert resolved.output.path == "/abs/out.txt"
    assert resolved.trace.path == os.path.join(tmp_path, "trace.csv")
    assert WorkloadSpec().resolve_paths(tmp_path) == WorkloadSpec()


# --- lengths --------------------------------------------------------------------------------------


def _truncated_normal_mean(mean: float, sd: float, low: float) -> float:
    """Mean of normal(mean, sd) conditioned on >= low."""
    z = (low - mean) / sd
    pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return mean + sd * pdf / (0.5 * math.erfc(z / math.sqrt(2)))


def test_default_lengths_match_llmperf_moments():
    # 20k draws: the standard error of the mean is sd / sqrt(20000), about 1.1 (input) and 0.6
    # (output) tokens; the tolerance is 4 standard errors around the exact expectation: the normal
    # conditioned on >= 1 (redraws), less 0.5 for truncating to an integer.
    n = 20_000
    spec = WorkloadSpec()
    input_tokens = sample_lengths(spec.input, n, _rng(1), "workload.input")
    output_tokens = sample_lengths(spec.output, n, _rng(2), "workload.output")
    assert input_tokens.dtype == np.int64 and input_tokens.shape == (n,)
    for tokens, mean, sd in ((input_tokens, 550, 150), (output_tokens, 150, 80)):
        expected = _truncated_normal_mean(mean, sd, 1) - 0.5
        assert abs(tokens.mean() - expected) < 4 * sd / math.sqrt(n)
        assert abs(tokens.mean() - mean) < 0.05 * mean
        assert tokens.min() >= 1
    assert abs(input_tokens.std() - 150) < 0.03 * 150


def test_normal_redraws_below_min_and_clips_max():
    spec = LengthSpec(kind="normal", mean=5, sd=10, min=3, max=12)
    tokens = sample_lengths(spec, 10_000, _rng(), "workload.input")
    assert tokens.min() == 3 and tokens.max() == 12
    # Redrawing (not clipping) below min: the share of 3s is one integer's worth, not a pile-up.
    assert np.mean(tokens == 3) < 0.15


def test_normal_truncates_toward_zero():
    # sd 0: every draw is exactly the mean, truncated.
    assert sample_lengths(LengthSpec(kind="normal", mean=7.9, sd=0), 5, _rng(), "f").tolist() == [7] * 5


def test_fixed_lengths():
    assert sample_lengths(LengthSpec(kind="fixed", value=128), 4, _rng(), "f").tolist() == [128] * 4


def test_lognormal_matches_mean_and_sd():
    # 20k draws; the sample sd of a lognormal with CV 0.5 has a relative error of about 1.5%.
    tokens = sample_lengths(LengthSpec(kind="lognormal", mean=1000, sd=500), 20_000, _rng(3), "f")
    assert abs(tokens.mean() - 1000) < 0.02 * 1000
    assert abs(tokens.std() - 500) < 0.06 * 500
    assert tokens.min() >= 1


def test_lognormal_far_tail_stays_in_range():
    # (a spec the scenario refuses, its median far below 1 token: built unchecked, the sampler's own range)
    spec = LengthSpec.model_construct(kind="lognormal", mean=1, sd=MAX_TOKENS)
    tokens = sample_lengths(spec, 10_000, _rng(), "f")
    assert tokens.min() >= 1 and tokens.max() <= MAX_TOKENS


# vLLM's random dataset draws from floor(len * (1 - r)) to ceil(len * (1 + r)) (vllm 0.27.1,
# vllm/benchmarks/datasets/utils.py, get_sampling_params): 10 +- 15% is [8, 12], not int()'s [8, 11];
# 100 +- 10% is [90, 111], as 100 * 1.1 is 110.00000000000001 in floats there too.
@pytest.mark.parametrize("mean, ratio, low, high", [(100, 0.5, 50, 150), (10, 0.15, 8, 12), (100, 0.1, 90, 111),
                                                    (1000, 0.0, 1000, 1000)])
def test_uniform_exact_bounds(mean, ratio, low, high):
    tokens = sample_lengths(LengthSpec(kind="uniform", mean=mean, range_ratio=ratio), 20_000, _rng(), "f")
    assert tokens.min() == low and tokens.max() == high


@settings(max_examples=300, deadline=None)
@given(mean=st.floats(0, 1e6), ratio=st.floats(0, 0.999))
def test_uniform_bounds_are_floor_and_ceil(mean, ratio):
    low, high = uniform_bounds(mean, ratio)
    assert low <= mean * (1 - ratio) < low + 1
    assert high - 1 < mean * (1 + ratio) <= high


def test_uniform_low_end_clipped_to_min():
    tokens = sample_lengths(LengthSpec(kind="uniform", mean=2, range_ratio=0.9), 1000, _rng(), "f")
    assert set(tokens.tolist()) == {1, 2, 3, 4}  # [floor(0.2), ceil(3.8)], 0 lifted to min 1


def test_empirical_one_per_line(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("10\n20\n\n30\n0\n")
    tokens = sample_lengths(LengthSpec(kind="empirical", path=str(path), max=25), 3000, _rng(), "f")
    assert set(tokens.tolist()) == {1, 10, 20, 25}  # 0 lifted to min 1, 30 clipped to max 25
    assert abs(np.mean(tokens == 10) - 0.25) < 0.04


def test_empirical_csv_column(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("id,tokens\na,7\nb,9\n")
    spec = LengthSpec(kind="empirical", path=str(path), column="tokens")
    assert set(sample_lengths(spec, 200, _rng(), "f").tolist()) == {7, 9}


@pytest.mark.parametrize(
    "text, column, message",
    [
        ("10\nabc\n", None, "lengths.txt:2: length 'abc' is not an integer"),
        ("10\n\n-4\n", None, "lengths.txt:3: length -4 is out of range"),
        ("", None, "no lengths in the file"),
        ("id,tokens\na,1\n", "count", "lengths.txt:1: no column 'count'"),
        ("id,tokens\na,1\nb\n", "tokens", "lengths.txt:3: row has no 'tokens' value"),
        ("id,tokens\na,1.5\n", "tokens", "lengths.txt:2: tokens '1.5' is not an integer"),
    ],
)
def test_empirical_file_errors(tmp_path, text, column, message):
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        sample_lengths(LengthSpec(kind="empirical", path=str(path), column=column), 5, _rng(), "workload.input")


def test_empirical_missing_file(tmp_path):
    path = str(tmp_path / "nope.txt")
    with pytest.raises(UserError, match="nope.txt: workload.input lengths file not found"):
        sample_lengths(LengthSpec(kind="empirical", path=path), 5, _rng(), "workload.input")


@st.composite
def length_specs(draw) -> LengthSpec:
    kind = draw(st.sampled_from(["fixed", "normal", "lognormal", "uniform"]))
    low = draw(st.integers(1, 2000))
    high = draw(st.none() | st.integers(low, 100_000) | st.integers(low, MAX_TOKENS))
    table: dict = {"kind": kind, "min": low, "max": high}
    if kind == "fixed":
        table["value"] = draw(st.integers(low, high or 100_000))
    else:
        lowest_mean = 1 if kind == "lognormal" else 0
        table["mean"] = draw(st.floats(lowest_mean, 50_000) | st.floats(lowest_mean, MAX_TOKENS))
        if kind == "uniform":
            table["range_ratio"] = draw(st.floats(0, 0.999))
        else:
            table["sd"] = draw(st.floats(0, 20_000) | st.floats(0, MAX_TOKENS))
    try:
        return LengthSpec.model_validate(table)
    except ValidationError:
        assume(False)


@settings(max_examples=200, deadline=None)
@given(spec=length_specs(), n=st.integers(0, 300), seed=st.integers(0, 2**32))
def test_lengths_property(spec, n, seed):
    tokens = sample_lengths(spec, n, _rng(seed), "workload.input")
    assert tokens.dtype == np.int64 and tokens.shape == (n,)
    assert (tokens >= spec.min).all() and (tokens <= (spec.max or MAX_TOKENS)).all()
    if spec.kind == "uniform":
        bounds = [math.floor(spec.mean * (1 - spec.range_ratio)), math.ceil(spec.mean * (1 + spec.range_ratio))]
        low, high = np.clip(bounds, spec.min, spec.max)
        assert ((tokens >= low) & (tokens <= high)).all()
    if spec.kind == "fixed":
        assert (tokens == spec.value).all()
    np.testing.assert_array_equal(tokens, sample_lengths(spec, n, _rng(seed), "workload.input"))


# --- arrivals -------------------------------------------------------------------------------------


def test_poisson_rate_recovered():
    # 20k exponential gaps: the mean gap has a relative standard error of 0.7%; tolerance 3%.
    n = 20_000
    arrival_s = arrival_times_s(ArrivalSpec(rate=20.0), n, _rng(4))
    assert arrival_s[0] == 0.0
    assert abs((n - 1) / arrival_s[-1] - 20.0) < 0.03 * 20.0
    gaps_s = np.diff(arrival_s)
    assert abs(gaps_s.var() / gaps_s.mean() ** 2 - 1.0) < 0.1


@pytest.mark.parametrize("burstiness, tolerance", [(0.25, 0.15), (4.0, 0.1)])
def test_burstiness_sets_gap_cv(burstiness, tolerance):
    # Gamma gaps with shape k have CV^2 = 1/k whatever the rate.
    arrival_s = arrival_times_s(ArrivalSpec(rate=5.0, burstiness=burstiness), 20_000, _rng(5))
    gaps_s = np.diff(arrival_s)
    cv2 = gaps_s.var() / gaps_s.mean() ** 2
    assert abs(cv2 * burstiness - 1.0) < tolerance
    assert abs(1 / gaps_s.mean() - 5.0) < 0.05 * 5.0


def test_gamma_arrivals_follow_vllm_formula():
    spec = ArrivalSpec(rate=3.0, burstiness=0.5)
    gaps_s = _rng(6).gamma(shape=0.5, scale=1 / (3.0 * 0.5), size=5)
    expected = np.concatenate(([0.0], np.cumsum(gaps_s[:-1])))
    np.testing.assert_array_equal(arrival_times_s(spec, 5, _rng(6)), expected)


def test_vllm_bench_sends_after_one_gap_and_ends_at_n_over_rate():
    """vllm/benchmarks/serve.py, get_request: request i at the sum of the first i + 1 gaps, rescaled so the last
    is at exactly n / rate."""
    spec = ArrivalSpec(rate=4.0, burstiness=0.5)
    sums_s = np.cumsum(_rng(6).gamma(shape=0.5, scale=1 / (4.0 * 0.5), size=200))
    sent = vllm_send_times_s(spec, 200, _rng(6))
    np.testing.assert_allclose(sent, sums_s * 50.0 / sums_s[-1], rtol=1e-12)
    assert sent[-1] == pytest.approx(50.0, rel=1e-12) and sent[0] > 0
    assert vllm_send_times_s(ArrivalSpec(rate="inf"), 3, _rng()).tolist() == [0.0] * 3


def test_constant_pattern_exact():
    arrival_s = arrival_times_s(ArrivalSpec(rate=4.0, pattern="constant"), 5, _rng())
    assert arrival_s.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_burstiness_with_a_constant_pattern_is_refused():
    with pytest.raises(ValueError, match='burstiness 0.2 shapes gamma gaps, and pattern "constant" draws none'):
        ArrivalSpec(rate=4.0, pattern="constant", burstiness=0.2)
    assert ArrivalSpec(rate=4.0, pattern="constant", burstiness=1.0).burstiness == 1.0  # the default, said


@pytest.mark.parametrize("pattern", ["gamma", "constant"])
def test_infinite_rate_sends_everything_at_zero(pattern):
    arrival_s = arrival_times_s(ArrivalSpec(rate="inf", pattern=pattern), 7, _rng())
    assert arrival_s.dtype == np.float64 and arrival_s.tolist() == [0.0] * 7


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(1e-3, 1e6),
    burstiness=st.floats(1e-2, 100),
    pattern=st.sampled_from(["gamma", "constant"]),
    n=st.integers(0, 200),
    seed=st.integers(0, 2**32),
)
def test_arrivals_property(rate, burstiness, pattern, n, seed):
    shape = {"burstiness": burstiness} if pattern == "gamma" else {}  # (a constant pattern draws no gaps)
    arrival_s = arrival_times_s(ArrivalSpec(rate=rate, pattern=pattern, **shape), n, _rng(seed))
    assert arrival_s.dtype == np.float64 and arrival_s.shape == (n,)
    if n:
        assert arrival_s[0] == 0.0 and (np.diff(arrival_s) >= 0).all() and np.isfinite(arrival_s).all()


# --- generate -------------------------------------------------------------------------------------


def test_generate_is_deterministic():
    spec = WorkloadSpec(num_requests=500)
    first = generate(spec, _rng(42))
    assert first == generate(spec, _rng(42))
    assert first != generate(spec, _rng(43))
    assert len(first) == 500


def test_generate_draw_order():
    spec = WorkloadSpec(num_requests=50, arrival=ArrivalSpec(rate=2.0, burstiness=0.5))
    rng = _rng(7)
    input_tokens = sample_lengths(spec.input, 50, rng, "workload.input")
    output_tokens = sample_lengths(spec.output, 50, rng, "workload.output")
    arrival_s = arrival_times_s(spec.arrival, 50, rng)
    assert generate(spec, _rng(7)) == Requests(arrival_s, input_tokens, output_tokens)


def test_generate_from_trace_caps_rows_and_scales_time(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n4.0,40,4\n0.0,10,1\n1.0,20,2\n2.0,30,3\n")
    trace = TraceSpec(path=str(path), format="azure", time_scale=2.0)
    rng = _rng(8)
    requests = generate(WorkloadSpec(num_requests=3, trace=trace), rng)
    assert requests == _requests([0.0, 0.5, 1.0], [10, 20, 30], [1, 2, 3])
    assert rng.random() == _rng(8).random()  # a trace draws nothing
    assert len(generate(WorkloadSpec(num_requests=100, trace=trace), rng)) == 4


def test_generate_hands_the_drawn_requests_to_check_before_their_prefix_keys():
    spec = WorkloadSpec(num_requests=40, shared_prefix={"count": 2, "tokens": 1000})
    seen = []
    requests = generate(spec, _rng(3), check=seen.append)
    assert requests == generate(spec, _rng(3)) and requests.prefixes is not None
    assert seen[0].prefixes is None and seen[0] == replace(requests, prefixes=None)


def test_a_shared_prefix_too_long_for_the_context_is_refused_before_its_keys_are_built(monkeypatch):
    # 100M-token prefixes: 195,313 segments each, 8 bytes a key for 100,000 requests (about 156 GB).
    from tokenpath import load_scenario
    from tokenpath.sim.simulate import prepare

    def refuse(*args):
        raise AssertionError("shared prefix keys built")

    monkeypatch.setattr(importlib.import_module("tokenpath.workload.generate"), "shared_prefixes", refuse)
    scenario = load_scenario("typical", {"workload.num_requests": 100_000,
                                         "workload.shared_prefix.tokens": 100_000_000})
    with pytest.raises(UserError, match=r"^workload: request \d+ needs 1000\d{5} tokens of context but llama-3.1-70b "
                                        "holds 131072; lower the input/output lengths"):
        prepare(scenario)


def test_a_workload_larger_than_memory_is_refused_naming_num_requests(monkeypatch):
    # 2M requests keep about 1.9 GiB of results (workload/size.py) on a machine with 1 GiB available.
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.GIB)
    with pytest.raises(UserError) as caught:
        generate(WorkloadSpec(num_requests=2_000_000), _rng())
    assert str(caught.value) == ("workload.num_requests: 2,000,000 requests need about 1.9 GiB of memory and this "
                                 "machine has 1.0 GiB available; lower workload.num_requests")
    monkeypatch.setattr(memory, "available_bytes", lambda: None)  # where the platform does not tell: no limit
    memory.require(2**62, "workload.num_requests: many requests", "lower workload.num_requests")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_available_memory_is_some_of_the_machines():
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < memory.available_bytes() <= total


def test_fingerprint_inputs(tmp_path):
    trace_path = tmp_path / "trace.csv"
    write_trace(_requests([0.0, 1.0], [5, 6], [7, 8]), trace_path, "azure")
    spec = WorkloadSpec(trace=TraceSpec(path=str(trace_path), format="azure"))
    digest = fingerprint_inputs(spec)
    assert digest == {str(trace_path): hashlib.sha256(trace_path.read_bytes()).hexdigest()}
    write_trace(_requests([0.0, 1.0], [5, 6], [7, 9]), trace_path, "azure")
    assert fingerprint_inputs(spec) != digest

    lengths_path = tmp_path / "lengths.txt"
    lengths_path.write_text("5\n")
    lengths = LengthSpec(kind="empirical", path=str(lengths_path))
    assert list(fingerprint_inputs(WorkloadSpec(input=lengths, output=lengths))) == [str(lengths_path)]
    assert fingerprint_inputs(WorkloadSpec()) == {}


def test_fingerprint_missing_file(tmp_path):
    spec = WorkloadSpec(trace=TraceSpec(path=str(tmp_path / "gone.csv"), format="azure"))
    with pytest.raises(UserError, match="gone.csv: workload.trace file not found"):
        fingerprint_inputs(spec)


def test_sharegpt_pairs_keep_the_clients_filter_and_the_published_means():
    from tokenpath.workload.sharegpt import SHAREGPT_MEAN_TOKENS

    n = 200_000
    spec = WorkloadSpec(num_requests=n, input=LengthSpec(kind="sharegpt"), output=LengthSpec(kind="sharegpt"))
    requests = generate(spec, _rng(0))
    prompt, answer = requests.input_tokens, requests.output_tokens
    # vLLM's is_valid_sequence: each at least 4, the prompt at most 1024, both at most 2048; drawn again, not clipped
    assert prompt.min() >= 4 and answer.min() >= 4 and prompt.max() <= 1024 and (prompt + answer).max() <= 2048
    assert (prompt == 1024).mean() < 0.001
    for tokens, side in ((prompt, "input"), (answer, "output")):
        standard_error = tokens.std() / n**0.5  # about 0.4 tokens
        assert abs(tokens.mean() - SHAREGPT_MEAN_TOKENS[side]) < 4 * standard_error
        assert np.median(tokens) < 0.8 * tokens.mean()  # heavy-tailed, as conversation lengths are


def test_sharegpt_log_means_solve_the_filtered_means():
    from tokenpath.workload.sharegpt import SHAREGPT_MEAN_TOKENS, filtered_means, sharegpt_log_means

    assert filtered_means(sharegpt_log_means()) == pytest.approx(SHAREGPT_MEAN_TOKENS, rel=1e-9)
    assert sharegpt_log_means() == pytest.approx({"input": 5.1014, "output": 4.9558}, abs=1e-4)  # (sharegpt.py)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 2000), seed=st.integers(0, 2**32))
def test_sharegpt_one_side_stays_within_its_bounds(n, seed):
    for side, high in (("input", 1024), ("output", 2044)):
        tokens = sample_lengths(LengthSpec(kind="sharegpt"), n, _rng(seed), f"workload.{side}")
        assert tokens.shape == (n,) and ((tokens >= 4) & (tokens <= high)).all()
