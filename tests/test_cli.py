"""The `tokenpath` command: one-line user errors with exit status 2, the JSON result, flags, catalogs.

Commands that must behave as a separate process (exit status, stderr, no traceback) run as
`python -m tokenpath`, started together in a small pool; the rest call the entry point in-process.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from rich.console import Console

from cli_helpers import assert_user_error, run_cli, simulate_json
from tokenpath import cli, load_scenario
from tokenpath.cli import catalog as cli_catalog
from tokenpath.compute.chip import list_chips
from tokenpath.compute.model import list_models

LAYERS = {"distribution", "compute", "traffic", "delivery"}
LATENCIES = ("ttft", "ttfv", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99", "p999")
LLAMA_8B_CONFIG = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
SMALL_8B = ["--model", "llama-3.1-8b", "--chip", "h100", "--chips", "1", "--tp", "1", "--request-rate", "8",
            "--num-requests", "30"]


def _files(root: Path) -> None:
    """A scenario folder with a typo'd key, broken TOML, and a trace with a bad row (relative path)."""
    folder = root / "scenarios"
    folder.mkdir()
    (folder / "typo.toml").write_text('name = "typo"\n[engine]\nmax_seqs = 64\n', encoding="utf-8")
    (folder / "broken.toml").write_text('name = "broken\n[engine\n', encoding="utf-8")
    (folder / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.1000000,many,20\n",
        encoding="utf-8",
    )
    (folder / "replay.toml").write_text(
        'name = "replay"\n[workload]\nnum_requests = 10\n[workload.trace]\npath = "trace.csv"\nformat = "azure"\n',
        encoding="utf-8",
    )


# name -> arguments
PROCESS_CASES = {
    "unknown_key": ["simulate", "scenarios/typo.toml"],
    "unknown_model": ["simulate", "--model", "llama-3-70b", "--num-requests", "10"],
    "broken_toml": ["simulate", "scenarios/broken.toml"],
    "bad_trace_row": ["simulate", "scenarios/replay.toml"],
    "json_1": ["simulate", "--num-requests", "50", "--json", "-"],
    "json_2": ["simulate", "--num-requests", "50", "--json", "-"],
}


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    """Start every PROCESS_CASES command at once; each test waits for the one it reads."""
    root = tmp_path_factory.mktemp("cli")
    _files(root)

    def run(args: list[str]) -> subprocess.CompletedProcess:
        env = {key: value for key, value in os.environ.items() if key not in ("FORCE_COLOR", "COLUMNS", "LINES")}
        return subprocess.run([sys.executable, "-m", "tokenpath", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)

    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[str, Future] = {name: pool.submit(run, args) for name, args in PROCESS_CASES.items()}
    yield lambda name: futures[name].result()
    pool.shutdown(wait=True)






def check_process_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    return assert_user_error(result.returncode, result.stdout, result.stderr, *fragments)


# User errors, as a separate process

def test_unknown_key_in_a_scenario_file(process):
    line = check_process_error(process("unknown_key"), "unknown key 'engine.max_seqs'; did you mean 'max_num_seqs'")
    assert "typo.toml" in line


def test_unknown_model_suggests_the_nearest(process):
    check_process_error(process("unknown_model"), "unknown model 'llama-3-70b'; did you mean 'llama-3.1-70b'")


def test_malformed_toml(process):
    check_process_error(process("broken_toml"), "broken.toml", "not valid TOML")


def test_malformed_trace_row_names_the_file_and_line(process):
    # The trace path is relative to the scenario's folder, not to the working directory.
    line = check_process_error(process("bad_trace_row"), "trace.csv:3", "ContextTokens", "'many'")
    assert "not found" not in line


@pytest.mark.parametrize("argv, fragments", [
    (["simulate", "--tp", "16", "--num-requests", "10"], ["deployment.tp", "16", "deployment.chips (8)"]),
    (["simulate", "--request-rate", "-3", "--num-requests", "10"], ["--request-rate", "'-3'", "> 0"]),
    (["simulate", "--model", "llama-3.1-405b", "--chip", "h100", "--chips", "1", "--tp", "1", "--num-requests", "10"],
     ["llama-3.1-405b", "does not fit", "h100", "--tp"]),
    (["simulate", "scenarios/absent.toml"], ["absent.toml", "no such scenario file"]),
    (["simulate", "--request-rate", "abc"], ["--request-rate", "'abc' is not a number"]),
    (["simulate", "--request-rate", "0"], ["--request-rate", "> 0"]),
    (["simulate", "--input-len", "0.5", "--input-sd", "0"], ["--input-len", "whole number"]),
    (["simulate", "--chip", "h1000", "--num-requests", "5"], ["unknown chip 'h1000'"]),
    (["simulate", "--tp", "3", "--chips", "3", "--num-requests", "5"], ["deployment.tp", "not divisible by tp=3"]),
    (["simulate", "--num-requests", "0"], ["workload.num_requests"]),
    (["simulate", "--model", "llama-2-7b", "--input-len", "5000", "--input-sd", "0", "--num-requests", "5",
      "--chips", "1", "--tp", "1"], ["workload", "context", "4096"]),
    (["scenario", "show", "typcal"], ["unknown scenario 'typcal'; did you mean 'typical'"]),
    (["simulate", "--cuda-graphs", "eager", "--num-requests", "5"],
     ["engine.cuda_graphs", "'all', 'decode' or 'none'"]),
    (["simulate", "--workers", "0", "--num-requests", "5"], ["--workers", "at least 1"]),
])
def test_more_user_errors_are_one_line(argv, fragments, monkeypatch, capsys):
    assert_user_error(*run_cli(argv, monkeypatch, capsys), *fragments)


def test_a_model_config_that_is_not_json(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.json"
    config.write_text("{not json", encoding="utf-8")
    assert_user_error(*run_cli(["simulate", "--model", str(config), "--num-requests", "5"], monkeypatch, capsys),
                      "model config", "JSON")


# The JSON result

def test_json_to_stdout_has_the_schema_of_the_design(process):
    result = process("json_1")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "tokenpath.summary/1"
    assert doc["source"] == "simulate"
    assert doc["scenario"]["name"] == "typical"
    assert re.fullmatch(r"[0-9a-f]{64}", doc["scenario"]["fingerprint"])
    assert doc["requests"]["completed"] == 50 and doc["requests"]["failed"] == 0
    assert set(doc["requests"]) >= {"completed", "failed", "input_tokens_mean", "output_tokens_mean"}
    assert doc["window_s"] > 0
    assert set(doc["throughput"]) >= {"output_tokens_per_s", "requests_per_s", "goodput_requests_per_s"}
    assert doc["throughput"]["requests_per_s"] == pytest.approx(50 / doc["window_s"])
    for metric in LATENCIES:
        stats = dict(doc["latency_s"][metric])
        band = stats.pop("band")  # how far to trust it (docs/validation.md, error bands)
        assert list(stats) == list(STATS), metric
        assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in stats.values())
        assert band["p50"]["low"] <= band["p50"]["high"] and band["rows"] >= 3, metric
        assert stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["p999"], metric
    parts = dict(doc["attribution_s"])
    detail = parts.pop("delivery_detail")
    assert set(parts) == {"queue", "compute", "traffic", "delivery"}
    assert set(detail) == {"frontend_queue", "frontend_work", "network", "engine_host"}
    assert sum(detail.values()) == pytest.approx(parts["delivery"], rel=1e-9)
    # Per request the parts sum to E2E exactly, so their means sum to the mean E2E.
    assert sum(parts.values()) == pytest.approx(doc["latency_s"]["e2e"]["mean"], rel=1e-9)
    assert doc["bottleneck"] in LAYERS


def test_the_same_command_gives_byte_identical_output(process):
    first, second = process("json_1"), process("json_2")
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout and first.stdout


def test_json_to_a_file_also_prints_the_tables(tmp_path, monkeypatch, capsys):
    target = tmp_path / "result.json"
    code, out, err = run_cli(["simulate", "--num-requests", "30", "--json", str(target)], monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(target.read_text(encoding="utf-8"))
    assert doc["schema"] == "tokenpath.summary/1" and doc["requests"]["completed"] == 30
    assert "Bottleneck:" in out and f"Bottleneck: {doc['bottleneck']}" in out
    for title in ("Scenario: typical", "Throughput", "Latency", "TTFT", "E2E"):
        assert title in out
    assert not out.lstrip().startswith("{")


def test_json_to_stdout_prints_nothing_else(monkeypatch, capsys):
    code, out, err = run_cli(["simulate", "--num-requests", "20", "--json", "-"], monkeypatch, capsys)
    assert code == 0
    assert json.loads(out)["requests"]["completed"] == 20  # the whole stdout is one JSON document
    assert err == ""


def test_workers_change_nothing_in_the_result(monkeypatch, capsys):
    argv = ["--chips", "8", "--tp", "2", "--num-requests", "40"]
    documents = [simulate_json([*argv, "--workers", workers], monkeypatch, capsys) for workers in ("1", "3")]
    assert documents[0]["engine"]["replicas"] == 4 and documents[0]["requests"]["completed"] == 40
    assert documents[0] == documents[1]


# scenario show

def test_scenario_show_prints_toml_that_simulates_like_the_default(tmp_path, monkeypatch, capsys):
    code, shown, _ = run_cli(["scenario", "show"], monkeypatch, capsys)
    assert code == 0
    table = tomllib.loads(shown)
    assert table["name"] == "typical" and table["model"]["name"] == "llama-3.1-70b"
    path = tmp_path / "shown.toml"
    path.write_text(shown, encoding="utf-8")
    code, from_file, _ = run_cli(["simulate", str(path), "--num-requests", "30", "--json", "-"], monkeypatch, capsys)
    assert code == 0
    code, default, _ = run_cli(["simulate", "--num-requests", "30", "--json", "-"], monkeypatch, capsys)
    assert code == 0
    assert json.loads(from_file)["scenario"]["fingerprint"] == json.loads(default)["scenario"]["fingerprint"]
    assert json.loads(from_file)["requests"] == json.loads(default)["requests"]


def test_scenario_show_output_simulates_byte_identically(tmp_path, monkeypatch, capsys):
    _, shown, _ = run_cli(["scenario", "show"], monkeypatch, capsys)
    path = tmp_path / "shown.toml"
    path.write_text(shown, encoding="utf-8")
    _, from_file, _ = run_cli(["simulate", str(path), "--num-requests", "30", "--json", "-"], monkeypatch, capsys)
    _, default, _ = run_cli(["simulate", "--num-requests", "30", "--json", "-"], monkeypatch, capsys)
    assert from_file == default


def test_scenario_list_names_the_embedded_scenarios(monkeypatch, capsys):
    code, out, _ = run_cli(["scenario", "list"], monkeypatch, capsys)
    assert code == 0 and "typical" in out


# Flags map onto the scenario

def test_fixed_input_length(monkeypatch, capsys):
    doc = simulate_json(["--input-len", "128", "--input-sd", "0", "--num-requests", "30"], monkeypatch, capsys)
    assert doc["requests"]["input_tokens_mean"] == 128.0
    expected = load_scenario(None, {"workload.input": {"kind": "fixed", "value": 128}, "workload.num_requests": 30})
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()


def test_fixed_single_token_outputs_have_no_decode(monkeypatch, capsys):
    doc = simulate_json(["--output-len", "1", "--output-sd", "0", "--num-requests", "20"], monkeypatch, capsys)
    assert doc["requests"]["output_tokens_mean"] == 1.0
    assert set(doc["latency_s"]["tpot"].values()) == {None}  # no gap between tokens to measure: unknown
    assert set(doc["latency_s"]["itl"].values()) == {None}


def test_normal_lengths_from_flags(monkeypatch, capsys):
    doc = simulate_json(["--output-len", "40", "--output-sd", "5", "--num-requests", "30"], monkeypatch, capsys)
    expected = load_scenario(None, {"workload.output": {"kind": "normal", "mean": 40.0, "sd": 5.0},
                                    "workload.num_requests": 30})
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()
    assert 30 <= doc["requests"]["output_tokens_mean"] <= 50


def test_infinite_request_rate(monkeypatch, capsys):
    doc = simulate_json(["--request-rate", "inf", "--num-requests", "30"], monkeypatch, capsys)
    expected = load_scenario(None, {"workload.arrival.rate": "inf", "workload.num_requests": 30})
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()
    assert doc["requests"]["completed"] == 30


def test_max_concurrency(monkeypatch, capsys):
    capped = simulate_json(["--max-concurrency", "4", "--request-rate", "inf", "--num-requests", "30"],
                           monkeypatch, capsys)
    expected = load_scenario(None, {"workload.max_concurrency": 4, "workload.arrival.rate": "inf",
                                    "workload.num_requests": 30})
    assert capped["scenario"]["fingerprint"] == expected.fingerprint()
    open_loop = simulate_json(["--request-rate", "inf", "--num-requests", "30"], monkeypatch, capsys)
    # Four at a time: no queue builds up in the engine, so requests start sooner but the run lasts longer.
    assert capped["latency_s"]["ttft"]["mean"] < open_loop["latency_s"]["ttft"]["mean"]
    assert capped["window_s"] > open_loop["window_s"]


def test_deployment_and_seed_flags(monkeypatch, capsys):
    doc = simulate_json([*SMALL_8B, "--precision", "bf16", "--burstiness", "0.5", "--seed", "3"], monkeypatch, capsys)
    expected = load_scenario(None, {
        "model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
        "workload.arrival.rate": 8.0, "workload.num_requests": 30, "model.precision": "bf16",
        "workload.arrival.burstiness": 0.5, "seed": 3,
    })
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()


def test_engine_delivery_and_distribution_flags_set_their_scenario_keys(monkeypatch, capsys):
    doc = simulate_json([*SMALL_8B, "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
                         "--no-enable-chunked-prefill", "--gpu-memory-utilization", "0.8", "--kv-cache-dtype", "fp8",
                         "--network-rtt", "5 ms", "--detokenize", "detokenizer", "--input-dist", "sharegpt",
                         "--scheduler", "prefill-first", "--num-scheduler-steps", "4",
                         "--output-len", "100", "--output-sd", "30", "--output-dist", "lognormal"], monkeypatch, capsys)
    expected = load_scenario(None, {
        "model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
        "workload.arrival.rate": 8.0, "workload.num_requests": 30, "engine.max_num_seqs": 64,
        "engine.max_num_batched_tokens": 4096, "engine.chunked_prefill": False,
        "engine.gpu_memory_utilization": 0.8, "model.kv_cache_precision": "fp8", "delivery.network_rtt": "5 ms",
        "delivery.detokenize": "detokenizer", "workload.input": {"kind": "sharegpt"},
        "engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 4,
        "workload.output": {"kind": "lognormal", "mean": 100.0, "sd": 30.0},
    })
    assert doc["scenario"]["fingerprint"] == expected.fingerprint()
    # A uniform draw keeps the mean and sd asked for: its range is mean +- sqrt(3) sd.
    uniform = simulate_json([*SMALL_8B, "--output-len", "100", "--output-sd", "20", "--output-dist", "uniform"],
                            monkeypatch, capsys)
    expected = load_scenario(None, {
        "model.name": "llama-3.1-8b", "deployment.chip": "h100", "deployment.chips": 1, "deployment.tp": 1,
        "workload.arrival.rate": 8.0, "workload.num_requests": 30,
        "workload.output": {"kind": "uniform", "mean": 100.0, "range_ratio": 3 ** 0.5 * 20 / 100},
    })
    assert uniform["scenario"]["fingerprint"] == expected.fingerprint()


@pytest.mark.parametrize("argv, fragments", [
    (["--input-dist", "zipf"], ["--input-dist", "'zipf'", "sharegpt"]),
    (["--input-dist", "sharegpt", "--input-len", "100"], ["--input-dist sharegpt", "drop --input-len"]),
    (["--output-len", "10", "--output-sd", "8", "--output-dist", "uniform"], ["--output-sd", "uniform"]),
    (["--detokenize", "later"], ["delivery.detokenize"]),
    (["--kv-cache-dtype", "int3"], ["model.kv_cache_precision"]),
    (["--network-rtt", "fast"], ["delivery.network_rtt"]),
    (["--gpu-memory-utilization", "1.5"], ["engine.gpu_memory_utilization"]),
    (["--max-num-seqs", "0"], ["engine.max_num_seqs"]),
    (["--scheduler", "fifo"], ["engine.scheduler"]),
    (["--num-scheduler-steps", "8"], ["num_scheduler_steps"]),  # vllm-v1 has no multi-step
])
def test_engine_and_distribution_flags_refuse_bad_values_in_one_line(argv, fragments, monkeypatch, capsys):
    assert_user_error(*run_cli(["simulate", "--num-requests", "5", *argv], monkeypatch, capsys), *fragments)


def test_model_from_a_hugging_face_config_matches_the_catalog_entry(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text(json.dumps(LLAMA_8B_CONFIG), encoding="utf-8")
    by_name = simulate_json(SMALL_8B, monkeypatch, capsys)
    argv = list(SMALL_8B)
    argv[argv.index("llama-3.1-8b")] = str(config)
    by_config = simulate_json(argv, monkeypatch, capsys)
    assert by_config["scenario"]["fingerprint"] != by_name["scenario"]["fingerprint"]
    by_name.pop("scenario")
    by_config.pop("scenario")
    # The resolved deployment names the model as given: the catalog's name, or the config's folder.
    assert (by_name["resolved"]["deployment"].pop("model"), by_config["resolved"]["deployment"].pop("model")) \
        == ("llama-3.1-8b", "Llama-3.1-8B")
    assert by_config == by_name
    assert by_name["requests"]["completed"] == 30


# Help, catalogs, the entry point

def test_simulate_help_shows_examples(monkeypatch, capsys):
    code, out, _ = run_cli(["simulate", "--help"], monkeypatch, capsys)
    assert code == 0
    assert "Examples" in out
    assert "tokenpath simulate" in out and "--request-rate" in out


def catalog_listing(command: str, width: int, monkeypatch, capsys) -> str:
    """The command's output on a console `width` columns wide (80 is what a pipe gets)."""
    monkeypatch.setattr(cli_catalog, "console", Console(width=width))
    code, out, _ = run_cli([command], monkeypatch, capsys)
    assert code == 0
    return out


def test_models_lists_the_catalog(monkeypatch, capsys):
    out = catalog_listing("models", 200, monkeypatch, capsys)
    names = list_models()
    assert len(names) == 15
    for name in names:
        assert re.search(rf"(^|\s){re.escape(name)}\s", out, re.MULTILINE), name
    # the bandwidth the model streams at: the A100's measured 1.48 of its 2.039 TB/s peak
    wide = catalog_listing("chips", 200, monkeypatch, capsys)
    assert re.search(r"^.*a100 .* 2\.04 TB/s .* 1\.51 TB/s .*$", wide, re.MULTILINE), wide


def test_models_lists_full_names_at_80_columns(monkeypatch, capsys):
    out = catalog_listing("models", 80, monkeypatch, capsys)
    for name in list_models():
        assert name in out, name


def test_chips_lists_the_catalog(monkeypatch, capsys):
    out = catalog_listing("chips", 80, monkeypatch, capsys)
    names = list_chips()
    assert len(names) == 11
    for name in names:
        assert re.search(rf"(^|\s){re.escape(name)}\s", out, re.MULTILINE), name
    # the bandwidth the model streams at: the A100's measured 1.48 of its 2.039 TB/s peak
    wide = catalog_listing("chips", 200, monkeypatch, capsys)
    assert re.search(r"^.*a100 .* 2\.04 TB/s .* 1\.51 TB/s .*$", wide, re.MULTILINE), wide


def test_console_script_points_at_main():
    scripts = metadata.entry_points(group="console_scripts")
    (entry,) = [e for e in scripts if e.name == "tokenpath"]
    assert entry.value == "tokenpath.cli:main"
    assert entry.load() is cli.main
