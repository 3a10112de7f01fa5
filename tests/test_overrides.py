"""`--set KEY=VALUE`: the value parser (TOML, or a bare word as a string), the key check against the
scenario schema, and the flag on `simulate` (precedence and one-line errors)."""

from __future__ import annotations

import math

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli, simulate_json, toml_value
from tokenpath.config.errors import UserError
from tokenpath.sim.overrides import apply_overrides, check_key, parse_assignment, parse_assignments, parse_value

# vLLM V1 without its async scheduling: its host time per step adds to every step
SMALL = ["--model", "llama-3.1-8b", "--chip", "h100", "--chips", "2", "--tp", "1", "--request-rate", "8",
         "--num-requests", "40", "--set", "engine.host_overlap=false"]

# What a TOML value can hold (no NaN: it never equals itself).
_scalars = st.one_of(st.integers(-2**63, 2**63 - 1), st.booleans(), st.text(max_size=20),
                     st.floats(allow_nan=False))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text("abc_-", min_size=1, max_size=5),
                                                                         inner, max_size=3)),
                       max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_any_toml_value_reads_back_as_itself(value):
    assert parse_value(toml_value(value)) == value


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_a_toml_value_or_itself(text):
    parsed = parse_value(text)
    try:
        expected = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        assert parsed == text
        return
    if set(expected) == {"value"}:
        want = expected["value"]
        assert parsed == want or (isinstance(want, float) and math.isnan(want) and math.isnan(parsed))
    else:
        assert parsed == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["deployment", "tp", "a_b", "x-1", "9"]), min_size=1, max_size=4),
       st.text(max_size=20))
def test_an_assignment_splits_at_the_first_equals(parts, text):
    key = ".".join(parts)
    assert parse_assignment(f"{key}={text}") == (key, parse_value(text.strip()))


@pytest.mark.parametrize("text, expected", [
    ("deployment.tp=4", ("deployment.tp", 4)),
    ("delivery.detokenize=detokenizer", ("delivery.detokenize", "detokenizer")),
    ("delivery.network_rtt=5 ms", ("delivery.network_rtt", "5 ms")),
    ('delivery.network_rtt="5 ms"', ("delivery.network_rtt", "5 ms")),
    ("workload.arrival.rate=inf", ("workload.arrival.rate", math.inf)),
    ("engine.chunked_prefill=false", ("engine.chunked_prefill", False)),
    ("deployment.placement=[3, 2, 1, 0]", ("deployment.placement", [3, 2, 1, 0])),
    ("deployment.fabric=dgx-h100", ("deployment.fabric", "dgx-h100")),
    ("name=a=b", ("name", "a=b")),
])
def test_assignments(text, expected):
    assert parse_assignment(text) == expected


def test_a_later_assignment_of_a_key_wins():
    assert parse_assignments(["deployment.tp=4", "seed=1", "deployment.tp=2"]) == {"seed": 1, "deployment.tp": 2}


@pytest.mark.parametrize("key, fragment", [
    ("deployment.tpp", "unknown key 'tpp' in deployment; did you mean 'tp'?"),
    ("delivery.detokenise", "did you mean 'detokenize'?"),
    ("speed", "unknown key 'speed' in the top level"),
    ("model.name.size", "model.name is a value, not a table"),
    ("deployment..tp", "a key is names joined by dots"),
])
def test_unknown_keys_are_named(key, fragment):
    with pytest.raises(UserError, match=None) as error:
        check_key(key)
    assert fragment in str(error.value) and key in str(error.value)


def test_keys_under_a_fabric_are_left_to_its_kind():
    check_key("deployment.fabric.link_bw")
    check_key("deployment.fabric.node.nvls")  # a hierarchy's; validated with the table


def test_apply_overrides_sets_nested_keys_and_creates_tables():
    table = {"deployment": {"tp": 8}}
    assert apply_overrides(table, {"deployment.tp": 4, "delivery.detokenize": "detokenizer"}) == \
        {"deployment": {"tp": 4}, "delivery": {"detokenize": "detokenizer"}}


def test_set_changes_the_simulation_and_named_flags_win(monkeypatch, capsys):
    base = simulate_json(SMALL, monkeypatch, capsys)
    rtt = simulate_json([*SMALL, "--set", "delivery.network_rtt=200 ms"], monkeypatch, capsys)
    flagged = simulate_json([*SMALL, "--network-rtt", "200 ms", "--set", "delivery.network_rtt=1 ms"],
                            monkeypatch, capsys)
    assert rtt["latency_s"]["ttft"]["mean"] == pytest.approx(base["latency_s"]["ttft"]["mean"] + 0.18, abs=0.01)
    assert flagged["latency_s"] == rtt["latency_s"]  # --network-rtt applies after --set
    # --set reaches keys no named flag has
    interval = simulate_json([*SMALL, "--set", "delivery.stream_interval=8"], monkeypatch, capsys)
    assert interval["latency_s"]["itl"]["mean"] > 4 * base["latency_s"]["itl"]["mean"]


def test_set_reaches_the_assumptions_by_name(monkeypatch, capsys):
    base = simulate_json(SMALL, monkeypatch, capsys)
    slow = simulate_json([*SMALL, "--set", "assumptions.host_step_s=5 ms"], monkeypatch, capsys)
    assert slow["scenario"]["assumptions"]["overridden"] == {"host_step_s": 0.005}
    assert slow["latency_s"]["tpot"]["mean"] > base["latency_s"]["tpot"]["mean"] + 0.004  # each step 4.5 ms longer


@pytest.mark.parametrize("argv, fragments", [
    (["--set", "deployment.tpp=4"], ["--set deployment.tpp", "unknown key 'tpp'", "did you mean 'tp'?"]),
    (["--set", "tp"], ["--set 'tp'", "KEY=VALUE"]),
    (["--set", "engine.block_size=four"], ["engine.block_size", "'four'"]),
    (["--set", "deployment.fabric.speed=1"], ["deployment.fabric.speed", "unknown key"]),
    (["--set", "delivery.network_rtt=fast"], ["delivery.network_rtt", "'fast'"]),
    (["--set", "assumptions.serving_gemm_fractoin=0.5"],
     ["--set assumptions.serving_gemm_fractoin", "serving_gemm_fraction"]),
    (["--set", "assumptions.host_step_s.x=1"], ["assumptions.host_step_s is a value, not a table"]),
    (["--set", "assumptions.serving_gemm_fraction=2"], ["serving_gemm_fraction", "out of range"]),
])
def test_set_errors_are_one_line(argv, fragments, monkeypatch, capsys):
    assert_user_error(*run_cli(["simulate", *SMALL, *argv], monkeypatch, capsys), *fragments)


@pytest.mark.parametrize("value", ["1" + "0" * 5000, "[" * 3000 + "]" * 3000], ids=["digits", "nesting"])
def test_a_value_tomllib_cannot_convert_is_text_and_a_one_line_error(value, monkeypatch, capsys):
    # More digits than Python converts (ValueError) or arrays nested past the recursion limit
    # (RecursionError) escaped parse_value, which caught only TOMLDecodeError: a traceback.
    assert parse_value(value) == value
    assert_user_error(*run_cli(["simulate", *SMALL, "--set", f"seed={value}"], monkeypatch, capsys),
                      "seed: Input should be a valid integer")
