"""Fuzzing the command line with mutated scenario files and flags: every case ends in exit 0 or one
`error:` line with exit 2, never a traceback.

Each case starts from a real scenario (the embedded catalog one, or one of the examples below: a
small deployment on a torus, a trace replay with an empirical length file, a disaggregated hierarchy),
applies a few mutations (a value replaced by a random TOML value of another type, a huge, tiny or
negative number, a long or non-ASCII string; a key deleted; an unknown key added; a table nested
where a value was; raw corruption of the file's text), adds random flags, and runs `simulate` (or
`scenario show`) in-process through the entry point. The cases are derandomized (the same every run);
TOKENPATH_FUZZ_SEED=N draws another sequence.

To keep a case fast whatever the mutation asks for, the harness caps the requests actually generated
at a few (validation still sees the value as written) and simulates only runs with few tokens; larger
ones stop after everything has been checked and drawn. Run more cases by hand with
`TOKENPATH_FUZZ_EXAMPLES=10000 pytest tests/test_fuzz_config.py`.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import os
import sys
from importlib import resources

import pytest
import tomli_w
import tomllib
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tokenpath.cli import main
from tokenpath.sim import simulate as pipeline

EXAMPLES = int(os.environ.get("TOKENPATH_FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("TOKENPATH_FUZZ_SEED")
# The most requests a case generates, and the most tokens it simulates.
CASE_REQUESTS = 6
CASE_TOKENS = 40_000

TRACE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.1000000,120,20\n2023-11-16 18:15:49.0,800,3\n")
LENGTHS = "12\n40\n300\n7\n"
LLAMA_8B_CONFIG = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}


def _catalog_scenario() -> dict:
    return tomllib.loads((resources.files("tokenpath.catalog") / "scenarios" / "typical.toml").read_text("utf-8"))


BASES = [
    _catalog_scenario(),
    {   # a small deployment on a torus, async detokenize, several tokens per event
        "name": "small", "seed": 3,
        "model": {"name": "llama-3.1-8b", "precision": "bf16"},
        "deployment": {"chip": "h100", "chips": 4, "tp": 2, "placement": "spread",
                       "fabric": {"kind": "torus", "dims": [2, 2], "link_bw": "100 GB/s"}},
        "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "block_size": 16, "cuda_graphs": "decode"},
        "workload": {"num_requests": 50, "input": {"kind": "uniform", "mean": 200, "range_ratio": 0.5},
                     "output": {"kind": "fixed", "value": 20}, "arrival": {"rate": 4.0, "pattern": "constant"}},
        "delivery": {"detokenize": "detokenizer", "stream_interval": 4, "network_rtt": "60 ms", "network_bw": "1 Gb/s"},
        "slo": {"ttft": "500 ms", "tpot": "none"},
    },
    {   # a trace replay, and an empirical length file
        "name": "replay",
        "model": {"name": "config.json"},
        "deployment": {"chip": "h100", "chips": 1, "tp": 1},
        "workload": {"num_requests": 3, "trace": {"path": "trace.csv", "format": "azure", "time_scale": 2.0},
                     "input": {"kind": "empirical", "path": "lengths.txt"}},
    },
    {   # disaggregated serving on a hierarchy of two nodes
        "name": "disaggregated",
        "model": {"name": "llama-3.1-8b"},
        "deployment": {"chip": "h100", "chips": 4, "tp": 1, "prefill_replicas": 1,
                       "fabric": {"kind": "hierarchy", "nodes": 2, "node": {"kind": "switch", "hosts": 2},
                                  "network": {"kind": "fattree", "k": 4, "levels": 2, "link_bw": "50 GB/s"}}},
        "workload": {"num_requests": 20, "output": {"kind": "lognormal", "mean": 30, "sd": 10, "max": 60},
                     "arrival": {"rate": "inf"}},
        "delivery": {"calibration": "missing-calibration.toml", "invisible_token_fraction": 0.2},
    },
]

# Values a mutation puts in place of another, of every TOML type; huge, tiny, negative and odd ones.
_INTS = st.integers(-5, 70) | st.sampled_from(
    [0, -1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 10**18, 10**30, 10**300, 10**4000,
     4096, 16384, 131072, 2**20, 2**24, 10_000_000]) | st.integers()
_FLOATS = st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e308, -1e308, math.inf, -math.inf, math.nan, 0.5, 1e9, 1e-9]) | \
    st.floats()
_WORDS = st.sampled_from([
    "", "inf", "-inf", "nan", "none", "true", "1e308 GB/s", "0 GB/s", "1e-300 GB/s", "-5 ms", "1e-300 s", "2 h",
    "1e308 ms", "20 parsecs", "1 h", "1 s", "1 kB/s", "100 PB/s", "9" * 400, "/dev/zero", "/dev/null", "/", ".",
    "a\x00b", "x" * 300, "../" * 40, "é", "日本語", "\ud7ff\n\t\x1b[31m", "[red]x[/red]", "fp8", "packed", "spread",
    "switch", "torus", "hierarchy",
    "azure", "mooncake", "burstgpt", "empirical", "normal", "fixed", "inline", "async", "all", "decode",
    "llama-3.1-8b", "deepseek-v3", "h100", "b200", "dgx-h100", "trace.csv", "lengths.txt", "config.json",
])
_STRINGS = _WORDS | st.text(max_size=12) | st.just("y" * 100_000)
_SCALARS = _INTS | _FLOATS | _STRINGS | st.booleans() | st.datetimes(min_value=dt.datetime(1, 1, 2)) | \
    st.dates() | st.times()
_VALUES = _SCALARS | st.lists(_INTS | _FLOATS | _WORDS, max_size=6) | \
    st.dictionaries(st.text(max_size=6), _SCALARS, max_size=3) | \
    st.sampled_from([list(range(200_000)), [[[[[1]]]]], {"kind": "switch"}, {"preset": "dgx-h100"}]).map(
        copy.deepcopy)  # fresh objects: a later mutation may change them in place

# Flags of `simulate` with values: good ones, bad ones, odd ones.
_FLAGS = {
    "--num-requests": ["1", "3", "0", "-1", "abc", "1e3", "10000000000", "99999999999999999999999"],
    "--request-rate": ["inf", "nan", "-1", "0", "1e-300", "1e308", "5", "abc", "-inf"],
    "--input-len": ["100", "1", "0", "nan", "inf", "-5", "1e10", "2.5", "1e400"],
    "--input-sd": ["0", "-1", "nan", "10", "inf"],
    "--output-len": ["10", "1", "0", "nan", "inf", "-5", "1e10", "7.5"],
    "--output-sd": ["0", "-1", "nan", "5"],
    "--chips": ["8", "1", "2", "0", "-1", "1000000000000", "true"],
    "--tp": ["1", "2", "8", "0", "3", "99999999999999999999"],
    "--pp": ["1", "2", "0", "true"],
    "--seed": ["0", "-1", "7", "1" * 30],
    "--burstiness": ["0", "1", "nan", "1e-9", "1e9", "0.5"],
    "--max-concurrency": ["0", "1", "5", "-3"],
    "--placement": ["packed", "spread", "diagonal", "[0,1]"],
    "--precision": ["fp8", "bf16", "fp2"],
    "--cuda-graphs": ["all", "none", "sometimes"],
    "--fabric": ["dgx-h100", "nope", "missing.toml", "/dev/null.toml", "x" * 300 + ".toml"],
    "--model": ["llama-3.1-8b", "gpt-9", "/dev/zero", "config.json", "missing.json", "~nobody-at-all/config.json"],
    "--chip": ["h100", "h200", "z80"],
    "--json": ["out.json", "-", "/nonexistent/dir/x.json", "."],
    "--workers": ["2", "1", "0", "-1"],
}


def _same_type(value: object) -> st.SearchStrategy:
    """Another value of `value`'s type: a wild one, or a plausible one now and then."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(0, 3 * max(1, value)) | _INTS
    if isinstance(value, float):
        return st.floats(0, 3 * max(1.0, value)) | _FLOATS
    if isinstance(value, str):
        return _WORDS
    if isinstance(value, list):
        return st.lists(st.integers(1, 8), min_size=1, max_size=4) | st.lists(_INTS, max_size=5)
    return _VALUES


def _paths(table: object, prefix: tuple = ()) -> list[tuple]:
    """Every key (and list index) of a nested table, as a path."""
    found: list[tuple] = []
    if isinstance(table, dict):
        for key, value in table.items():
            found.append(prefix + (key,))
            found += _paths(value, prefix + (key,))
    elif isinstance(table, list):
        for index, value in enumerate(table[:4]):
            found.append(prefix + (index,))
            found += _paths(value, prefix + (index,))
    return found


def _parent(table: dict, path: tuple) -> object:
    for key in path[:-1]:
        table = table[key]
    return table


@st.composite
def scenario_texts(draw) -> bytes:
    """A base scenario with 1 to 4 mutations, as the bytes of a TOML file."""
    table = json.loads(json.dumps(draw(st.sampled_from(BASES))))  # a deep copy
    pick = draw(st.randoms(use_true_random=False))  # where to mutate: spread evenly over the keys
    # A third of the cases only change numbers within a plausible range, so that they run through.
    plausible = draw(st.integers(0, 2)) == 0
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 2, 2, 3, 4]))):
        if plausible:
            numbers = [p for p in _paths(table) if type(_parent(table, p)[p[-1]]) in (int, float)]
            if numbers:
                path = pick.choice(numbers)
                value = _parent(table, path)[path[-1]]
                _parent(table, path)[path[-1]] = draw(st.integers(0, 3 * max(1, value)) if isinstance(value, int)
                                                      else st.floats(0, 3 * max(1.0, value)))
            continue
        paths = _paths(table)
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "nest"]))
        if not paths or op == "add":
            where = pick.choice([()] + [p for p in paths if isinstance(_parent(table, p + ("",)), dict)])
            target = _parent(table, where + ("",))
            target[draw(st.sampled_from(["bogus", "rate", "kind", "x" * 300, "ü", "", "path"]))] = draw(_VALUES)
            continue
        path = pick.choice(paths)
        parent, key = _parent(table, path), path[-1]
        if op == "delete":
            del parent[key]
        elif op == "nest":
            parent[key] = {"a": {"b": parent[key]}}
        elif draw(st.booleans()):  # another value of the same type: more cases get past the type check
            parent[key] = draw(_same_type(parent[key]))
        else:
            parent[key] = draw(_VALUES)
    try:
        text = tomli_w.dumps(table)
    except (ValueError, TypeError):  # a value TOML cannot hold (a lone surrogate): write the base instead
        text = tomli_w.dumps(BASES[0])
    data = text.encode("utf-8", "surrogatepass")
    corruption = draw(st.sampled_from([None] * 40 + ["digits", "deep", "byte", "truncate", "nul"]))
    if corruption == "digits":
        data = b"seed = " + b"9" * 5000 + b"\n" + data
    elif corruption == "deep":
        data = b"zz = " + b"[" * 5000 + b"]" * 5000 + b"\n" + data
    elif corruption == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + b"\xff" + data[at + 1:]
    elif corruption == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif corruption == "nul":
        data = data.replace(b"\n", b"\n\x00", 1)
    return data


@st.composite
def flag_lists(draw) -> list[str]:
    """Up to four flags, each with a good value (listed first) half the time."""
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(_FLAGS)), max_size=4, unique=True)):
        values = _FLAGS[flag]
        argv += [flag, values[0] if draw(st.booleans()) else draw(st.sampled_from(values))]
    if draw(st.integers(0, 9)) == 0:
        argv.append("--explain")
    return argv


@st.composite
def model_configs(draw) -> dict:
    """The Llama-3.1-8B config.json, now and then with a field replaced or dropped."""
    config = dict(LLAMA_8B_CONFIG)
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(config) + ["text_config", "moe_layer_freq", "num_local_experts"]))
        value = draw(_INTS | _FLOATS | _WORDS | st.booleans() | st.none() | st.just({"hidden_size": 1}))
        if draw(st.integers(0, 4)) == 0:
            config.pop(key, None)
        else:
            config[key] = value
    return config


class _Stop(Exception):
    """Raised by the harness where a large run would begin: everything has been checked by then."""


@pytest.fixture
def fuzz_folder(tmp_path):
    (tmp_path / "trace.csv").write_text(TRACE, encoding="utf-8")
    (tmp_path / "lengths.txt").write_text(LENGTHS, encoding="utf-8")
    return tmp_path


def _capped_generate(real):
    def generate(spec, rng, **kwargs):
        return real(spec.model_copy(update={"num_requests": min(spec.num_requests, CASE_REQUESTS)}), rng, **kwargs)
    return generate


def _small_simulate(real):
    def simulate(prepared, *args, **kwargs):
        requests = prepared.requests
        if int(requests.input_tokens.sum() + requests.output_tokens.sum()) > CASE_TOKENS:
            raise _Stop
        return real(prepared, *args, **kwargs)
    return simulate


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["tokenpath", *argv])
        patch.setattr(pipeline, "generate", _capped_generate(pipeline.generate))
        patch.setattr(pipeline, "simulate", _small_simulate(pipeline.simulate))
        code = 0
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except _Stop:
            code = 0
    out, err = capsys.readouterr()
    return code, out, err


@seed(int(SEED or 0))  # only used when derandomize is off
@settings(max_examples=EXAMPLES, derandomize=SEED is None, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(text=scenario_texts(), flags=flag_lists(), config=model_configs(), show=st.integers(0, 5))
def test_mutated_scenarios_and_flags_give_a_result_or_one_error_line(text, flags, config, show, fuzz_folder,
                                                                      capsys, monkeypatch):
    monkeypatch.chdir(fuzz_folder)
    (fuzz_folder / "s.toml").write_bytes(text)
    (fuzz_folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    argv = ["scenario", "show", "s.toml"] if show == 0 else ["simulate", "s.toml", *flags]
    code, out, err = _run(argv, capsys)
    assert "Traceback" not in out + err, (argv, err)
    if code == 0:
        return
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    assert "out of memory" not in lines[0], (argv, lines[0])  # a bound is missing
    assert len(lines[0]) < 1500, (argv, lines[0])  # a bad value is quoted short
