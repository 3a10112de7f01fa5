"""Inputs that used to give a traceback, a hang or a silently wrong result (issue 13, items 8 to 10):
each is now one `error:` line with exit status 2, or a right result."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario
from tokenpath.compute.model import load_model
from tokenpath.config.errors import UserError, quoted
from tokenpath.config.files import path_problem
from tokenpath.serve.openai import ApiError, parse
from tokenpath.sim import simulate as pipeline
from tokenpath.workload.lengths import parse_count, read_length_file
from tokenpath.workload.traces import _RowError, _seconds, read_trace

LLAMA_8B_CONFIG = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SMALL = ["--model", "llama-3.1-8b", "--chip", "h100", "--chips", "1", "--tp", "1", "--num-requests", "3"]


def _scenario(tmp_path: Path, text: str | bytes, name: str = "s.toml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def _simulate_error(tmp_path, monkeypatch, capsys, text: str | bytes, *fragments: str) -> str:
    path = _scenario(tmp_path, text)
    return assert_user_error(*run_cli(["simulate", path], monkeypatch, capsys), *fragments)


# -- item 8: a scenario file that cannot be read -------------------------------------------------

def test_a_scenario_file_that_is_not_utf8(tmp_path, monkeypatch, capsys):
    _simulate_error(tmp_path, monkeypatch, capsys, b'name = "caf\xe9"\n', "s.toml", "not UTF-8 text", "byte 11")


def test_toml_nested_too_deep(tmp_path, monkeypatch, capsys):
    _simulate_error(tmp_path, monkeypatch, capsys, "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
                    "s.toml: not valid TOML", "nested too deep")


def test_an_integer_of_5000_digits(tmp_path, monkeypatch, capsys):
    line = _simulate_error(tmp_path, monkeypatch, capsys, "seed = " + "7" * 5000 + "\n",
                           "s.toml: not valid TOML", "5000 digits")
    assert len(line) < 300


@pytest.mark.parametrize("table, fragments", [
    ("[delivery]\nnetwork_rtt = 1e308", ("delivery.network_rtt", "1e+308 is out of range", "0 to 1 h")),
    ("[delivery]\nhost_link_latency = 9223372036854775807", ("delivery.host_link_latency", "out of range")),
    ('[delivery]\nnetwork_bw = "1e308 GB/s"', ("delivery.network_bw", "'1e308 GB/s' is out of range",
                                                "1 kB/s to 100 PB/s")),
    ("[delivery]\nhost_link_bw = 0", ("delivery.host_link_bw", "0 is out of range")),
    ("[delivery]\nhost_link_bw = 1e-300", ("delivery.host_link_bw", "1e-300 is out of range")),
    ("[delivery]\nstream_interval = 1000000000000000000", ("delivery.stream_interval", "4096")),
    ("[deployment]\nchips = 1000000000000", ("deployment.chips", "131072")),
    ("[deployment.fabric]\nkind = 'torus'\ndims = [64, 64, 64]", ("deployment.fabric", "262,144 hosts", "131,072")),
    ("[deployment.fabric]\nkind = 'fullmesh'\nhosts = 16384", ("deployment.fabric.hosts", "1024")),
    ("[deployment.fabric]\nkind = 'dragonfly'\np = 24\nlink_bw = '50 GB/s'", ("deployment.fabric", "1,328,256 hosts")),
    ("[deployment.fabric]\nkind = 'dragonfly'\np = 1\na = 128\nh = 1\nlink_bw = '50 GB/s'",
     ("deployment.fabric", "16,512 routers", "16,384")),
    ("[workload]\nnum_requests = 1000000000", ("workload.num_requests", "10000000")),
    ("[workload.arrival]\nburstiness = 1e-300", ("workload.arrival.burstiness", "0.001")),
    ("[engine]\nblock_size = 1000000", ("engine.block_size", "4096")),
    ("seed = 100000000000000000000", ("seed", "9223372036854775807")),
])
def test_every_quantity_has_a_physical_range(table, fragments, tmp_path, monkeypatch, capsys):
    _simulate_error(tmp_path, monkeypatch, capsys, table + "\n", *fragments)


@pytest.mark.parametrize("field", ["workload.trace.path", "model.name", "delivery.calibration"])
@pytest.mark.parametrize("path, fragment", [("a\x00b.csv", "NUL byte"), ("x" * 300 + ".csv", "limited to 255")])
def test_a_path_that_cannot_name_a_file(field, path, fragment, tmp_path, monkeypatch, capsys):
    table = {"workload.trace.path": f'[workload.trace]\npath = "{path}"\nformat = "azure"',
             "model.name": f'[model]\nname = "{path}"', "delivery.calibration": f'[delivery]\ncalibration = "{path}"'}
    line = _simulate_error(tmp_path, monkeypatch, capsys, table[field].replace("\x00", "\\u0000") + "\n",
                           field, fragment)
    assert len(line) < 400


def test_a_scenario_path_that_cannot_name_a_file(monkeypatch, capsys):
    assert_user_error(*run_cli(["simulate", "a\x00b.toml"], monkeypatch, capsys), "NUL byte")
    assert_user_error(*run_cli(["scenario", "show", "y" * 300 + ".toml"], monkeypatch, capsys), "limited to 255")


def _subprocess(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m tokenpath ARGV`, killed after 60 s: a hang fails instead of blocking the suite."""
    return subprocess.run([sys.executable, "-m", "tokenpath", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_device_or_fifo_as_trace_or_lengths_file_is_refused_at_once(kind, tmp_path):
    if kind == "device":
        source = "/dev/zero"
    else:
        source = str(tmp_path / "pipe")
        os.mkfifo(source)  # opening it for reading would block until a writer comes
    _scenario(tmp_path, f'[workload.trace]\npath = "{source}"\nformat = "azure"\n', "trace.toml")
    _scenario(tmp_path, f'[workload.input]\nkind = "empirical"\npath = "{source}"\n', "lengths.toml")
    for name in ("trace.toml", "lengths.toml"):
        done = _subprocess(["simulate", name, "--num-requests", "3"], tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: {source}: ") and "not a regular file" in lines[0]


def test_a_trace_larger_than_the_bound_is_refused_before_reading(tmp_path, monkeypatch):
    from tokenpath.workload import _files

    monkeypatch.setattr(_files, "MAX_DATA_BYTES", 1024)
    path = tmp_path / "big.csv"
    path.write_text(AZURE_HEADER + "1,5,5\n" * 300, encoding="utf-8")
    with pytest.raises(UserError, match=r"big\.csv: azure trace is 1,840 bytes, more than the 1,024 read"):
        read_trace(path, "azure")


def test_json_into_a_missing_folder_fails_before_the_run(monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("simulated although the result could not be saved")

    monkeypatch.setattr(pipeline, "simulate", no_run)
    assert_user_error(*run_cli(["simulate", *SMALL, "--json", "/nonexistent/dir/x"], monkeypatch, capsys),
                      "--json /nonexistent/dir/x", "folder /nonexistent/dir does not exist")
    assert_user_error(*run_cli(["validate", "--json", "/nonexistent/dir/x"], monkeypatch, capsys), "--json")


@pytest.fixture
def no_server(monkeypatch):
    """Fail if `serve` gets as far as building its app: these errors come before anything is loaded."""
    import tokenpath.serve

    def refuse(*args, **kwargs):
        raise AssertionError("serve started although its address or send log is unusable")

    monkeypatch.setattr(tokenpath.serve, "make_app", refuse)


@pytest.mark.parametrize("argv, fragments", [
    (["--port", "70000"], ("--port", "70000", "1 to 65535")),
    (["--port", "-1"], ("--port", "-1")),
    (["--host", "999.1.1.1"], ("--host", "'999.1.1.1'", "e.g. 127.0.0.1")),
    (["--send-log", "/nonexistent/dir/send.jsonl"], ("--send-log", "folder /nonexistent/dir does not exist")),
    (["--tokenizer", "/dev/zero"], ("--tokenizer", "not a regular file")),
    (["--api-key", ""], ("--api-key: '' is empty", "leave out --api-key")),
    (["--api-key", "  "], ("--api-key: '  ' is empty",)),
    (["--api-key", "key "], ("--api-key: 'key ' starts or ends with white space",)),
    (["--served-model-name", ""], ("--served-model-name: empty",)),
    (["--served-model-name", " "], ("--served-model-name: empty",)),
])
def test_serve_refuses_an_unusable_address_or_file_before_starting(argv, fragments, no_server, monkeypatch, capsys):
    assert_user_error(*run_cli(["serve", "--port", "0", *argv], monkeypatch, capsys), *fragments)


def test_serve_on_a_port_in_use_is_one_line(no_server, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_user_error(*run_cli(["serve", "--host", "127.0.0.1", "--port", str(port)], monkeypatch, capsys),
                          f"127.0.0.1:{port}", "Address already in use")


@pytest.mark.parametrize("argv, fragments", [
    (["simulate", "--num-requests", "abc"], ("--num-requests", "see `tokenpath simulate --help`")),
    (["simulate", "--bogus"], ("No such option: --bogus",)),
    # (click's message ends in a full stop, the hint follows it)
    (["sweep", "spec.toml"], ("Missing option '--out'; see `tokenpath sweep --help`",)),
    (["simulate", "a.toml", "b.toml"], ("unexpected extra argument",)),
    (["simulate", ""], ("scenario: an empty name", "leave it out for 'typical'")),
    (["simulate", "--input-len", "nan", "--input-sd", "0"], ("--input-len", "nan")),
    (["simulate", "--input-len", "inf", "--input-sd", "0"], ("--input-len", "inf")),
    (["simulate", "--fabric", "a\x00b.toml"], ("--fabric", "NUL byte")),
    (["scenario", "show", "[/bold]x.toml"], ("[/bold]x.toml", "no such scenario file")),
    (["scenario", "show", "a\nb\x1b[31m.toml"], ("a\\nb\\x1b[31m.toml",)),
])
def test_command_line_mistakes_are_one_line(argv, fragments, monkeypatch, capsys):
    assert_user_error(*run_cli(argv, monkeypatch, capsys), *fragments)


# -- item 9: silent wrong results ----------------------------------------------------------------

def test_a_trace_spanning_centuries_is_an_error_naming_the_unit_mistake(tmp_path):
    # Epoch milliseconds read as (BurstGPT's) seconds: ten days become 27 years.
    start_ms = 1_700_000_000_000
    rows = "".join(f"{start_ms + k * 86_400_000},,0,ChatGPT,10,20,30,Conversation log\n" for k in range(11))
    path = tmp_path / "ms.csv"
    path.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
                    "Log Type\n" + rows, encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_trace(path, "burstgpt")
    message = str(caught.value)
    for fragment in ("ms.csv", "27 years", "read as seconds", "milliseconds", "time_scale = 1000"):
        assert fragment in message, message
    # Read as milliseconds, the same rows replay over ten days, every time non-negative.
    requests = read_trace(path, "burstgpt", time_scale=1000)
    assert requests.arrival_s[0] == 0 and requests.arrival_s[-1] == pytest.approx(10 * 86400)
    assert (np.diff(requests.arrival_s) >= 0).all()


def test_a_trace_spanning_more_than_292_years_never_gives_negative_times(tmp_path, monkeypatch, capsys):
    (tmp_path / "t.csv").write_text(AZURE_HEADER + "0,10,5\n1700000000000,10,5\n", encoding="utf-8")
    path = _scenario(tmp_path, '[workload.trace]\npath = "t.csv"\nformat = "azure"\n')
    assert_user_error(*run_cli(["simulate", path, *SMALL], monkeypatch, capsys), "t.csv", "53,907 years")


def test_a_run_past_the_range_of_int64_nanoseconds_is_an_error_not_negative_times(tmp_path, monkeypatch, capsys):
    # 1 kB/s NVSwitch links with an hour of latency: every step's all-reduces take hours; 4,000
    # requests run past 292 years of simulated time.
    path = _scenario(tmp_path, '[deployment.fabric]\nkind = "switch"\nlink_bw = "1 kB/s"\nlink_latency = "1 h"\n')
    assert_user_error(*run_cli(["simulate", path, "--num-requests", "4000", "--workers", "1"], monkeypatch, capsys),
                      "more than 292 years")


def test_host_costs_per_token_or_step_are_held_to_a_second(tmp_path, monkeypatch, capsys):
    for field in ("detokenize_per_token", "frame_per_event", "host_link_latency"):
        _simulate_error(tmp_path, monkeypatch, capsys, f'[delivery]\n{field} = "2 s"\n', f"delivery.{field}",
                        "less than or equal to 1")


def test_generated_arrivals_over_more_than_a_year_are_an_error(monkeypatch, capsys):
    assert_user_error(*run_cli(["simulate", *SMALL[:-2], "--num-requests", "2000", "--request-rate", "0.00001"],
                               monkeypatch, capsys), "workload.arrival", "2,000 requests", "at most 365 days")


@pytest.mark.parametrize("prompt", [[-1], [10**20], [1, 2**31], [1e20], [1, True]])
def test_token_ids_outside_int32_are_a_400(prompt):
    with pytest.raises(ApiError) as caught:
        parse({"model": "m", "prompt": prompt}, "completions", len, 0)
    assert caught.value.status == 400 and caught.value.param == "prompt"


def test_token_ids_inside_int32_are_taken():
    assert parse({"model": "m", "prompt": [0, 5, 2**31 - 1]}, "completions", len, 0).prompt_tokens == 3


@pytest.mark.parametrize("change, fragment", [
    ({"num_key_value_heads": 64}, "64 KV heads (num_key_value_heads) must divide the 32 attention heads"),
    ({"num_key_value_heads": 6}, "6 KV heads"),
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false, got 'false'"),
    ({"hidden_size": True}, "'hidden_size' must be a whole number of 0 or more, got True"),
    ({"hidden_size": -4096}, "'hidden_size' must be a whole number of 0 or more, got -4096"),
    ({"vocab_size": 2**40}, "vocab_size must be a whole number from 0 to 2147483647"),
    ({"text_config": 5, "hidden_size": None}, "missing required field 'hidden_size'"),
])
def test_hugging_face_configs_that_cannot_be_a_model(change, fragment, tmp_path):
    config = {key: value for key, value in {**LLAMA_8B_CONFIG, **change}.items() if value is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_model(str(path))


@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, '{"hidden_size": ' + "9" * 5000 + "}"])
def test_hugging_face_configs_that_cannot_be_parsed(text, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match="cannot read it as JSON"):
        load_model(str(path))


@pytest.mark.parametrize("table, field", [
    ("[deployment]\npp = true", "deployment.pp"),
    ("[deployment]\nchips = true", "deployment.chips"),
    ("seed = false", "seed"),
    ("[delivery]\nnetwork_rtt = true", "delivery.network_rtt"),
    ("[delivery]\nstream_interval = true", "delivery.stream_interval"),
    ("[delivery]\nbytes_per_token = true", "delivery.bytes_per_token"),
    ("[engine]\nmax_num_seqs = true", "engine.max_num_seqs"),
    ("[engine]\ngpu_memory_utilization = true", "engine.gpu_memory_utilization"),
    ("[workload.arrival]\nrate = true", "workload.arrival.rate"),
    ("[deployment.fabric]\nkind = 'switch'\nhosts = true", "deployment.fabric.hosts"),
    ("[deployment.fabric]\nkind = 'torus'\ndims = [true, 2]", "deployment.fabric.dims"),
    ("[deployment.fabric]\nkind = 'fattree'\nk = 4\noversubscription = [true, 1]",
     "deployment.fabric.oversubscription"),
])
def test_booleans_are_not_numbers(table, field, tmp_path, monkeypatch, capsys):
    line = _simulate_error(tmp_path, monkeypatch, capsys, table + "\n", field)
    assert "got true" in line or "got false" in line or "boolean" in line or "bool" in line, line


@pytest.mark.parametrize("row, fragment", [
    ("1,1_000,5", "ContextTokens '1_000' is not an integer"),
    ("1,5,\u0661\u0662", "GeneratedTokens '\u0661\u0662' is not an integer"),
    ("1_000,5,5", "TIMESTAMP '1_000' is not a number"),
    ("\u0661,5,5", "is not a number"),
    ("2023-11-16 18:15:46.5-99:99,5,5", "invalid time-zone offset -99:99"),
    ("2023-11-16 18:15:46.5+15:00,5,5", "invalid time-zone offset +15:00"),
    ("2023-11-16 18:15:46.5+05:75,5,5", "invalid time-zone offset"),
    ("\u0662023-11-16 18:15:46.5,5,5", "is not a date-time"),
    ("1,5," + "9" * 5000, "GeneratedTokens '99999"),
])
def test_lenient_numbers_in_traces_are_errors(row, fragment, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + row + "\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_trace(path, "azure")
    assert fragment in str(caught.value) and "trace.csv:2: " in str(caught.value)
    assert len(str(caught.value)) < len(str(path)) + 300


@pytest.mark.parametrize("zone, shift_s", [("+14:00", -14 * 3600), ("-12:00", 12 * 3600), ("Z", 0), ("+0530", -19800)])
def test_real_time_zone_offsets_are_read(zone, shift_s, tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 00:00:00Z,5,5\n" + f"2023-11-16 12:00:00{zone},5,5\n", encoding="utf-8")
    times = sorted([0.0, 12 * 3600.0 + shift_s])  # seconds after midnight UTC
    assert read_trace(path, "azure").arrival_s.tolist() == [t - times[0] for t in times]


@pytest.mark.parametrize("line", ["1_000", "\u0661\u0662", "+\u0665", "1e3"])
def test_lenient_numbers_in_lengths_files_are_errors(line, tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text(f"5\n{line}\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"lengths\.txt:2: length .* is not an integer in digits 0-9"):
        read_length_file(path, None, "workload.input")


def test_a_mooncake_line_with_a_huge_or_deep_value_is_one_error(tmp_path):
    for line in ['{"timestamp": ' + "9" * 5000 + ', "input_length": 1, "output_length": 1}', "[" * 100_000]:
        path = tmp_path / "trace.jsonl"
        path.write_text(line + "\n", encoding="utf-8")
        with pytest.raises(UserError, match=r"trace\.jsonl:1: not valid JSON"):
            read_trace(path, "mooncake")


@pytest.mark.parametrize("value", ["x" * 10_000, 10**4000, ["y" * 10_000] * 1000])
@pytest.mark.parametrize("field", ["name", "model.name", "deployment.chip", "workload.arrival.rate",
                                   "delivery.network_rtt", "deployment.fabric", "deployment.placement", "bogus"])
def test_an_error_line_quotes_at_most_about_100_characters_of_a_value(field, value, monkeypatch):
    with pytest.raises(UserError) as caught:
        load_scenario(None, {field: value})
    message = str(caught.value)
    assert len(message) < 500, message
    assert "x" * 101 not in message and "y" * 101 not in message and "7" * 101 not in message


def test_quoted_cuts_long_values_and_describes_huge_numbers():
    assert quoted("abc") == "'abc'"
    assert quoted("z" * 150) == f"'{'z' * 100}'... (150 characters)"
    assert quoted(10**5000) == "a number of about 5,000 digits"
    assert quoted(12345) == "12345"
    assert len(quoted([list(range(1000))] * 1000)) <= 210


# -- item 10: a trace run shows what it ran ------------------------------------------------------

@pytest.fixture
def replay(tmp_path):
    (tmp_path / "t.csv").write_text(AZURE_HEADER + "0.0,100,5\n0.5,100,5\n1.0,100,5\n2.0,100,5\n", encoding="utf-8")
    return _scenario(tmp_path, '[model]\nname = "llama-3.1-8b"\n[deployment]\nchip = "h100"\nchips = 1\ntp = 1\n'
                               '[workload.trace]\npath = "t.csv"\nformat = "azure"\n', "replay.toml")


@pytest.mark.parametrize("flag, value, what", [
    ("--request-rate", "50", "arrival times"), ("--burstiness", "0.5", "arrival times"),
    ("--input-len", "100", "input token counts"), ("--input-sd", "3", "input token counts"),
    ("--output-len", "10", "output token counts"), ("--output-sd", "0", "output token counts"),
    ("--set", "workload.arrival.rate=5", "arrival times"),
    ("--set", "workload.arrival={burstiness=2}", "arrival times"),
    ("--set", "workload.input.mean=100", "input token counts"),
    ("--set", "workload.output.sd=0", "output token counts"),
])
def test_flags_a_trace_overrides_are_refused(flag, value, what, replay, monkeypatch, capsys):
    name = f"--set {value.split('=')[0]}" if flag == "--set" else flag
    assert_user_error(*run_cli(["simulate", replay, flag, value], monkeypatch, capsys),
                      f"{name}: the scenario replays the trace 't.csv' (workload.trace), whose {what} replace it")


def test_a_trace_run_shows_the_trace_s_arrivals_not_the_arrival_table(replay, monkeypatch, capsys):
    from tokenpath.report.simulation import describe

    lines = dict(describe(pipeline.simulate(load_scenario(replay, {"workload.max_concurrency": 2}))))
    assert lines["arrivals"] == "as recorded in the trace (time_scale 1), 1.5 req/s on average, at most 2 outstanding"
    # the rows replayed, not the scenario's num_requests (2,000 by default), which only caps a longer trace
    assert lines["workload"] == ("4 requests (every row of the trace; workload.num_requests takes at most 2,000), "
                                 "azure trace t.csv (means 100/5)")
    three = dict(describe(pipeline.simulate(load_scenario(replay, {"workload.num_requests": 3}))))
    assert three["workload"] == "3 requests, azure trace t.csv (means 100/5)"
    code, out, err = run_cli(["simulate", replay], monkeypatch, capsys)
    assert code == 0, err
    assert "as recorded in the trace" in out and "req/s, burstiness" not in out


def test_a_fabric_of_one_host_names_the_fabric_not_a_flag_never_given(tmp_path, monkeypatch, capsys):
    (tmp_path / "one.toml").write_text('kind = "switch"\nhosts = 1\n', encoding="utf-8")
    assert_user_error(*run_cli(["fabric", str(tmp_path / "one.toml"), "--chip", "h100"], monkeypatch, capsys),
                      "one.toml: 1 host, and a collective needs 2 or more; give the fabric more hosts")


def test_fabric_json_into_a_missing_folder_fails_before_the_sweep(monkeypatch, capsys):
    assert_user_error(*run_cli(["fabric", "--preset", "dgx-h100", "--json", "/nonexistent/dir/f.json"],
                               monkeypatch, capsys), "--json /nonexistent/dir/f.json", "does not exist")


@given(st.text(max_size=30) | st.from_regex(r"\s*[+-]?[0-9]{1,25}\s*", fullmatch=True))
def test_a_count_is_read_exactly_when_it_is_ascii_digits(text):
    count = parse_count(text)
    if re.fullmatch(r"[+-]?[0-9]+", text.strip(), re.ASCII) is None:
        assert count is None
    elif len(text.strip()) <= 20:
        assert count == int(text.strip())
    else:  # beyond int64 however it is written: out of range either way
        assert abs(count) == 2**63


@given(st.text(max_size=40) | st.from_regex(r"[+-]?[0-9]{0,6}(\.[0-9]{0,6})?([eE][+-]?[0-9]{1,3})?", fullmatch=True))
@example("0\x85")  # a Unicode space (NEL), which str.strip and float() take: not an ASCII decimal
def test_a_trace_time_is_read_only_when_it_is_a_finite_ascii_decimal(text):
    try:
        seconds = _seconds(text, "t")
    except _RowError:
        return
    assert re.fullmatch(r"\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", text, re.ASCII)
    assert 0 <= seconds < math.inf and seconds == float(text)


@given(st.text() | st.integers() | st.floats() | st.lists(st.text(), max_size=50))
def test_quoted_is_short_for_any_value(value):
    assert len(quoted(value)) <= 2 * 100 + 40


@given(st.text(max_size=300))
def test_a_path_problem_is_exactly_an_empty_path_a_nul_or_an_over_long_name(text):
    encoded = text.encode("utf-8", "surrogatepass")
    expected = (not text or "\0" in text or len(encoded) >= 4096
                or any(len(part) > 255 for part in encoded.split(b"/")))
    assert (path_problem(text) is not None) == expected


@pytest.mark.parametrize("fabric", [
    "{kind = 'fattree', k = 4, levels = " + "1" * 4000 + ", link_bw = '50 GB/s'}",
    "{kind = 'fattree', k = -" + "2" * 4000 + ", link_bw = '50 GB/s'}",
    "{kind = 'torus', dims = [" + "3" * 4000 + "]}",
    "{kind = 'torus', dims = [" + "1, " * 20000 + "1]}",
    "{kind = 'dragonfly', p = -" + "1" * 4000 + ", link_bw = '50 GB/s'}",
    "{kind = 'fattree', k = 4, oversubscription = [" + "0.5, " * 5000 + "1], link_bw = '50 GB/s'}",
])
def test_fabric_errors_quote_huge_values_short(fabric, tmp_path, monkeypatch, capsys):
    line = _simulate_error(tmp_path, monkeypatch, capsys, f"[deployment]\nfabric = {fabric}\n", "fabric")
    assert len(line) < 500, line


def test_a_reader_that_stops_reading_ends_the_printing_not_the_command(tmp_path):
    """`tokenpath simulate --json r.json | head -1`: stdout closes under the summary; the JSON is still written."""
    import subprocess
    import sys

    out = tmp_path / "r.json"
    child = subprocess.Popen([sys.executable, "-m", "tokenpath", "simulate", "--num-requests", "20", "--json",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # the reader leaves before the first line
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err.decode()
    assert json.loads(out.read_text())["requests"]["completed"] == 20


@pytest.mark.parametrize("terminal", [False, True])
def test_a_table_never_cuts_a_value_short(terminal):
    """Into a pipe (rich assumes 80 columns) a table prints as wide as its values, each row on one line; in a
    narrow terminal its cells fold. Either way every character of every value is printed (rich's default
    ends a cell too wide for its column with '…')."""
    import io

    from rich.table import Table

    from tokenpath.cli.app import _Stdout

    out = io.StringIO()
    console = _Stdout(file=out, force_terminal=terminal, width=40, color_system=None)
    table = Table()
    for name in ("metric", "value"):
        table.add_column(name, no_wrap=True)
    values = ["latency_s.ttft.p99_under_load", "123,456,789.012 ms (measured)"]
    table.add_row(*values)
    console.print(table)
    rows = [line.split("│")[1:3] for line in out.getvalue().splitlines() if line.startswith("│")]
    assert ["".join(row[k] for row in rows).replace(" ", "") for k in range(2)] == [v.replace(" ", "") for v in values]
    assert len(rows) == (2 if terminal else 1)


def test_a_table_into_a_pipe_breaks_no_word():
    """Narrowing a table to rich's 80 columns, rich shares the width out in proportion to the columns'
    widths and splits words that would fit ('concurrenc' / 'y 1'); into a pipe each word of each cell is
    printed whole (the table as wide as its values, under PIPE_MAX_WIDTH)."""
    import io

    from rich.table import Table

    from tokenpath.cli.app import PIPE_MAX_WIDTH, _Stdout

    out = io.StringIO()
    console = _Stdout(file=out, force_terminal=False, width=80, color_system=None)
    table = Table()
    for name in ("load", "TTFT", "predicted", "TPOT / ITL", "predicted", "uncalibrated"):
        table.add_column(name)
    cells = ["concurrency 16", "1347.2 ms", "728.8 ms -45.9%", "52.09 ms", "48.00 ms -7.8%", "-80% / -49%"]
    table.add_row(*cells)
    console.print(table)
    printed = out.getvalue()
    assert all(word in printed for cell in cells for word in cell.split())
    assert 80 < max(len(line) for line in printed.splitlines()) <= PIPE_MAX_WIDTH
