"""Reading and writing request traces: Azure CSV, BurstGPT CSV, Mooncake JSONL."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_user_error, run_cli
from tokenpath import load_scenario, simulate
from tokenpath.config.errors import UserError
from tokenpath.sim.document import result_document
from tokenpath.workload import Requests, read_trace, write_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE_ROW = '{"timestamp": 1, "input_length": 2, "output_length": 3}\n'
BURSTGPT_HEADER = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
# Time resolution each format keeps (plus float rounding of the seconds).
RESOLUTION_S = {"azure": 1.0e-7 + 1e-9, "burstgpt": 0.0, "mooncake": 1.0e-3 + 1e-9}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@st.composite
def requests_strategy(draw, max_tokens: int = 2**31 - 1) -> Requests:
    n = draw(st.integers(1, 40))
    start_s = draw(st.floats(0, 1e5))
    gaps_s = draw(st.lists(st.floats(0, 1e4) | st.just(0.0), min_size=n - 1, max_size=n - 1))
    tokens = st.lists(st.integers(1, max_tokens), min_size=n, max_size=n)
    return Requests(
        start_s + np.concatenate(([0.0], np.cumsum(gaps_s))),
        np.array(draw(tokens), dtype=np.int64),
        np.array(draw(tokens), dtype=np.int64),
    )


def _round_trip(requests: Requests, format: str) -> Requests:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"trace.{format}"
        write_trace(requests, path, format)
        return read_trace(path, format)


def _assert_round_trip(requests: Requests, back: Requests, format: str) -> None:
    np.testing.assert_array_equal(back.input_tokens, requests.input_tokens)
    np.testing.assert_array_equal(back.output_tokens, requests.output_tokens)
    relative_s = requests.arrival_s - requests.arrival_s[0]
    np.testing.assert_allclose(back.arrival_s, relative_s, rtol=0, atol=RESOLUTION_S[format])
    assert back.arrival_s[0] == 0.0


@settings(max_examples=60, deadline=None)
@given(requests=requests_strategy())
@pytest.mark.parametrize("format", ["azure", "burstgpt"])
def test_csv_round_trip(format, requests):
    _assert_round_trip(requests, _round_trip(requests, format), format)


@settings(max_examples=60, deadline=None)
@given(requests=requests_strategy(max_tokens=100_000))
def test_mooncake_round_trip(requests):
    _assert_round_trip(requests, _round_trip(requests, "mooncake"), "mooncake")


def test_burstgpt_round_trip_is_exact():
    requests = Requests(np.array([0.0, 0.1, 0.30000000000000004]), np.array([1, 2, 3]), np.array([4, 5, 6]))
    assert _round_trip(requests, "burstgpt") == requests


def test_azure_sample(tmp_path):
    path = _write(
        tmp_path,
        "azure.csv",
        AZURE_HEADER
        + "2023-11-16 18:15:46.6805900,374,44\n"
        + "2023-11-16 18:15:50.9951690,396,109\n"
        + "2023-11-16 18:15:51.2034370,879,0\n"
        + "2023-11-16 18:16:02.5000000,1000,12\n",
    )
    requests = read_trace(path, "azure")
    np.testing.assert_allclose(requests.arrival_s, [0.0, 4.314579, 15.8194100], rtol=0, atol=1e-9)
    assert requests.input_tokens.tolist() == [374, 396, 1000]
    assert requests.output_tokens.tolist() == [44, 109, 12]


def test_azure_date_times_across_midnight_and_zones(tmp_path):
    path = _write(
        tmp_path,
        "azure.csv",
        AZURE_HEADER
        + "2023-11-16T23:59:59.5,1,1\n"
        + "2023-11-17 00:00:00.5000000,2,2\n"
        + "2023-11-17 01:00:01.5+01:00,3,3\n"
        + "2023-11-17 00:00:03Z,4,4\n",
    )
    assert read_trace(path, "azure").arrival_s.tolist() == [0.0, 1.0, 2.0, 3.5]


def test_azure_plain_seconds(tmp_path):
    path = _write(tmp_path, "azure.csv", AZURE_HEADER + "100.5,1,1\n102.0,2,2\n")
    assert read_trace(path, "azure").arrival_s.tolist() == [0.0, 1.5]


def test_rows_sorted_stably_and_time_scaled(tmp_path):
    path = _write(tmp_path, "azure.csv", AZURE_HEADER + "3,30,3\n1,10,1\n3,31,4\n1,11,2\n")
    requests = read_trace(path, "azure", time_scale=2.0)
    assert requests.arrival_s.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert requests.input_tokens.tolist() == [10, 11, 30, 31]
    assert requests.output_tokens.tolist() == [1, 2, 3, 4]


def test_zero_token_rows_skipped_and_counted(tmp_path, caplog):
    path = _write(tmp_path, "azure.csv", AZURE_HEADER + "0,5,0\n1,5,3\n2,0,3\n3,6,0\n")
    with caplog.at_level(logging.WARNING, logger="tokenpath.workload.traces"):
        requests = read_trace(path, "azure")
    assert requests == Requests(np.array([0.0]), np.array([5]), np.array([3]))
    assert "skipped 3 of 4 rows" in caplog.text


def test_burstgpt_sample_skips_failed_requests(tmp_path, caplog):
    path = _write(
        tmp_path,
        "burstgpt.csv",
        BURSTGPT_HEADER
        + "5,1,2.5,ChatGPT,472,18,490,Conversation log\n"
        + "45,,0,GPT-4,1087,0,1087,API log\n"
        + "118,2,1.0,ChatGPT,417,217,634,Conversation log\n",
    )
    with caplog.at_level(logging.WARNING, logger="tokenpath.workload.traces"):
        requests = read_trace(path, "burstgpt")
    assert requests == Requests(np.array([0.0, 113.0]), np.array([472, 417]), np.array([18, 217]))
    assert "skipped 1 of 3 rows" in caplog.text


def test_burstgpt_first_release_header(tmp_path):
    # BurstGPT's first release has no Session ID or Elapsed time columns; only names matter.
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
    )
    requests = read_trace(_write(tmp_path, "b.csv", text), "burstgpt")
    assert requests.input_tokens.tolist() == [472] and requests.output_tokens.tolist() == [18]


def test_mooncake_sample(tmp_path):
    lines = [
        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
        {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47]},
        {"timestamp": 27000.5, "input_length": 100, "output_length": 1},
    ]
    path = _write(tmp_path, "m.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n\n")
    requests = read_trace(path, "mooncake")
    np.testing.assert_allclose(requests.arrival_s, [0.0, 0.4815, 3.5345], rtol=0, atol=1e-12)
    assert requests.input_tokens.tolist() == [100, 6955, 6472]
    assert requests.output_tokens.tolist() == [1, 52, 26]


def test_mooncake_writer_sizes_hash_ids(tmp_path):
    requests = Requests(np.array([0.0, 1.0]), np.array([512, 513]), np.array([1, 1]))
    write_trace(requests, tmp_path / "m.jsonl", "mooncake")
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [record["hash_ids"] for record in records] == [[0], [1, 2]]
    assert [record["timestamp"] for record in records] == [0, 1000]


@pytest.mark.parametrize(
    "format, text, message",
    [
        ("azure", AZURE_HEADER + "1,5,5\n2,abc,5\n", "trace:3: ContextTokens 'abc' is not an integer"),
        ("azure", AZURE_HEADER + "1,5,5\n\n2,5,-3\n", "trace:4: GeneratedTokens -3 is out of range"),
        ("azure", AZURE_HEADER + "1,5,5\n2,5\n", "trace:3: row has 2 fields, the header has 3"),
        ("azure", AZURE_HEADER + "1,5,5\n2,5,1.5\n", "trace:3: GeneratedTokens '1.5' is not an integer"),
        ("azure", "TIMESTAMP,Context,GeneratedTokens\n1,5,5\n",
         "trace:1: header lacks 'ContextTokens'; the azure format's header names the columns TIMESTAMP"),
        ("azure", AZURE_HEADER + "2023-11-16 18:15:46,5,5\nyesterday,5,5\n", "trace:3: TIMESTAMP 'yesterday' is"),
        ("azure", AZURE_HEADER + "2023-11-16 25:15:46.68,5,5\n", "trace:2: TIMESTAMP '2023-11-16 25:15:46.68' has an"),
        ("azure", AZURE_HEADER + "2023-13-16 18:15:46.68,5,5\n", "trace:2: TIMESTAMP '2023-13-16 18:15:46.68' has an"),
        ("azure", AZURE_HEADER + "1,5,5\n-2,5,5\n", "trace:3: TIMESTAMP '-2' must be a finite time"),
        ("azure", AZURE_HEADER + "1,5,5\nnan,5,5\n", "trace:3: TIMESTAMP 'nan' must be a finite time"),
        ("azure", AZURE_HEADER + "1,5,99999999999\n", "trace:2: GeneratedTokens 99999999999 is out of range"),
        ("burstgpt", BURSTGPT_HEADER + "5,,0,ChatGPT,x,18,490,Conversation log\n", "trace:2: Request tokens 'x'"),
        ("burstgpt", BURSTGPT_HEADER + "t,,0,ChatGPT,4,18,490,Conversation log\n", "trace:2: Timestamp 't' is not"),
        ("burstgpt", AZURE_HEADER + "1,1,1\n", "trace:1: header lacks 'Timestamp', 'Request tokens'"),
        ("mooncake", MOONCAKE_ROW + '{"timestamp": 2,\n', "trace:2: not valid JSON"),
        ("mooncake", '\n{"timestamp": 1, "input_length": 2}\n', "trace:2: missing 'output_length'"),
        ("mooncake", "[1, 2, 3]\n", "trace:1: not a JSON object"),
        ("mooncake", MOONCAKE_ROW.replace(": 2", ': "2"'), "trace:1: input_length '2' is not"),
        ("mooncake", MOONCAKE_ROW.replace(": 2", ": true"), "trace:1: input_length True is not"),
        ("mooncake", MOONCAKE_ROW.replace(": 2", ": 2.5"), "trace:1: input_length 2.5 is not"),
        ("mooncake", MOONCAKE_ROW.replace(": 1", ': "1"'), "trace:1: timestamp '1' is not a"),
        ("mooncake", MOONCAKE_ROW.replace(": 1", ": 1e999"), "trace:1: timestamp inf must be"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, format, text, message):
    path = _write(tmp_path, "trace", text)
    with pytest.raises(UserError) as caught:
        read_trace(path, format)
    assert str(caught.value).startswith(str(tmp_path))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "format, text, message",
    [
        ("azure", "", "header lacks"),
        ("azure", AZURE_HEADER, "no requests in the azure trace (it has no rows)"),
        ("burstgpt", BURSTGPT_HEADER + "5,,0,ChatGPT,472,0,472,API log\n", "(all 1 rows have 0 input or 0 output"),
        ("mooncake", "\n\n", "no requests in the mooncake trace"),
    ],
)
def test_empty_traces(tmp_path, format, text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace(_write(tmp_path, "trace", text), format)


def test_missing_file_names_path(tmp_path):
    with pytest.raises(UserError, match="missing.csv: azure trace not found"):
        read_trace(tmp_path / "missing.csv", "azure")


def test_unknown_format():
    with pytest.raises(UserError, match="trace format 'sharegpt' is unknown"):
        read_trace("x", "sharegpt")
    with pytest.raises(UserError, match="trace format 'sharegpt' is unknown"):
        write_trace(Requests(np.zeros(1), np.ones(1, np.int64), np.ones(1, np.int64)), "x", "sharegpt")


def test_not_utf8(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(AZURE_HEADER.encode() + b"1,\xff\xfe,1\n")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        read_trace(path, "azure")


_HEADERS = {"azure": AZURE_HEADER, "burstgpt": BURSTGPT_HEADER, "mooncake": ""}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    format=st.sampled_from(["azure", "burstgpt", "mooncake"]),
    body=st.lists(st.text(alphabet=st.sampled_from('0123456789.,-: {}"\'\n\rTZe+abx'), max_size=40), max_size=6),
)
def test_any_input_reads_or_raises_user_error(tmp_path, format, body):
    path = tmp_path / "fuzz"
    path.write_text(_HEADERS[format] + "\n".join(body), encoding="utf-8", newline="")
    try:
        requests = read_trace(path, format)
    except UserError as error:
        assert "\n" not in str(error)
    else:
        assert len(requests) >= 1 and requests.arrival_s[0] == 0.0


@pytest.mark.parametrize("warmup", [3, 4])
def test_a_warmup_leaving_none_of_a_traces_requests_is_one_line(tmp_path, warmup, monkeypatch, capsys):
    # num_requests (2,000 by default) bounds the warm-up before the trace is read; its 3 rows do after
    path = _write(tmp_path, "azure.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
                  + "2023-11-16 18:15:50.9951690,396,109\n" + "2023-11-16 18:16:02.5000000,1000,12\n")
    assert_user_error(*run_cli(["simulate", "--set", f'workload.trace={{path="{path}", format="azure"}}',
                                "--warmup-requests", str(warmup)], monkeypatch, capsys),
                      f"workload.warmup_requests: {warmup} leaves none of the trace's 3 requests to measure")


def test_a_replayed_trace_is_the_resolved_workload(tmp_path):
    # resolved.workload is the workload as it ran: the trace's requests at their mean rate, no gaps drawn
    path = _write(tmp_path, "azure.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,374,44\n"
                  + "2023-11-16 18:15:48.0,396,109\n" + "2023-11-16 18:15:50.0,1000,12\n")
    scenario = load_scenario("typical", {"workload.trace": {"path": str(path), "format": "azure"}})
    workload = result_document(simulate(scenario))[0]["resolved"]["workload"]
    assert (workload["requests"], workload["rate_per_s"], workload["pattern"], workload["burstiness"]) == (
        3, pytest.approx(0.5), None, None)
    assert workload["trace"] == str(path)
