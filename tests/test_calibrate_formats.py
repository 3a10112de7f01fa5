"""`calibrate engine --from` reads what vLLM's, SGLang's and guidellm's benchmark clients save: each file's
phases (calibrate/formats.py), checked against dicts written as those clients write them."""

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpath.calibrate.formats import read_measured
from tokenpath.config.errors import UserError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One request as the clients record it: prompt and output tokens, TTFT and the gap between its later
# tokens, and when it was sent (seconds).
request = st.tuples(st.integers(1, 4096), st.integers(1, 64), st.floats(0.001, 5.0), st.floats(0.0005, 0.2),
                    st.floats(0.0, 100.0))
runs = st.lists(request, min_size=1, max_size=12)


def _write(text: str, suffix: str = ".json") -> str:
    folder = Path(tempfile.mkdtemp())
    path = folder / f"run{suffix}"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _client_dict(run, *, kind: str, sent: bool, latencies: bool, failed: int = -1) -> dict:
    """A vLLM (vllm/benchmarks/serve.py) or SGLang (bench_serving.py) result with its per-request lists."""
    n = len(run)
    document = {
        "input_lens": [r[0] for r in run], "output_lens": [0 if k == failed else r[1] for k, r in enumerate(run)],
        "ttfts": [0.0 if k == failed else r[2] for k, r in enumerate(run)],
        "itls": [[] if k == failed else [r[3]] * (r[1] - 1) for k, r in enumerate(run)],
        "errors": ["timeout" if k == failed else "" for k in range(n)], "generated_texts": ["x"] * n,
        "request_rate": "inf", "max_concurrency": 4, "completed": n, "duration": 10.0,
    }
    if kind == "vllm":
        document.update({"date": "20260101-000000", "backend": "vllm", "model_id": "m", "tokenizer_id": "m",
                         "num_prompts": n, "burstiness": 1.0, "median_ttft_ms": 1.0, "median_e2el_ms": 2.0})
        if sent:
            document["start_times"] = [1000.0 + r[4] for r in run]
        if latencies:
            document["latencies"] = [r[2] + r[3] * (r[1] - 1) for r in run]
    else:
        document.update({"backend": "sglang", "dataset_name": "random", "random_input_len": 1024,
                         "median_e2e_latency_ms": 2.0, "total_output_tokens_retokenized": 10, "accept_length": None})
    return document


def _expected(run, failed: int = -1):
    """(prompts in send order, TTFT median, TPOT median) of the requests that completed."""
    kept = [r for k, r in enumerate(run) if k != failed]
    tpots = [r[3] for r in kept if r[1] > 1]
    return sorted(r[0] for r in kept), float(np.median([r[2] for r in kept])), \
        float(np.median(tpots)) if tpots else math.nan


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize("kind, span_s", [("vllm", (49.0, 50.0)), ("sglang", (40.0, 60.0))])
def test_a_run_without_send_times_is_replayed_on_its_clients_schedule(kind, span_s):
    """Without `start_times`, 200 requests at 4 a second are replayed as the client sent them: vLLM's rescaled to
    end at n / rate (the span less its first gap), SGLang's gaps as drawn (seed 0: 56.2 s, 11% under the rate,
    was what vLLM's replay read too)."""
    run = [(100, 10, 0.05, 0.01, 0.0)] * 200
    document = {**_client_dict(run, kind=kind, sent=False, latencies=False), "request_rate": 4.0}
    (measured,) = read_measured(_write(json.dumps(document)))
    sent = measured.requests.arrival_s
    assert sent[0] == 0.0 and span_s[0] < sent[-1] < span_s[1]


@FAST
@given(runs, st.booleans(), st.booleans(), st.integers(-1, 11))
def test_a_vllm_result_reads_back_its_requests_and_medians(run, sent, latencies, failed):
    failed = failed if failed < len(run) and len(run) > 1 else -1
    [phase] = read_measured(_write(json.dumps(_client_dict(run, kind="vllm", sent=sent, latencies=latencies,
                                                           failed=failed))))
    prompts, ttft_s, tpot_s = _expected(run, failed)
    assert sorted(phase.requests.input_tokens.tolist()) == prompts and phase.counted.all()
    assert _same(phase.ttft_s, ttft_s) and _same(phase.decode_s, tpot_s)
    assert phase.sent == sent and phase.concurrency == 4 and phase.rate == math.inf
    if sent:  # the measured sends, from the first completed one
        kept = [r[4] for k, r in enumerate(run) if k != failed]
        assert phase.requests.arrival_s.tolist() == pytest.approx(sorted(t - min(kept) for t in kept))
    else:  # every one scheduled at once, the replay capped at --max-concurrency
        assert phase.requests.arrival_s.tolist() == [0.0] * len(prompts) and phase.replay_concurrency() == 4


@FAST
@given(runs, st.sampled_from(["vllm", "sglang"]), st.booleans(), st.integers(-1, 11))
def test_the_clients_first_prompt_is_held_from_its_warm_up(run, kind, sent, failed):
    # Both clients send the run's first prompt before the run: the server holds all of it but its last
    # token, wherever its request lands in send order; a first request that did not complete holds none.
    failed = failed if failed < len(run) and len(run) > 1 else -1
    [phase] = read_measured(_write(json.dumps(_client_dict(run, kind=kind, sent=sent and kind == "vllm",
                                                           latencies=False, failed=failed))))
    held = phase.requests.prefixes.warm_tokens()
    if failed == 0:
        assert not held.any()
    else:
        [first] = np.flatnonzero(held) if run[0][0] > 1 else [None]
        assert held.sum() == run[0][0] - 1
        assert first is None or phase.requests.input_tokens[first] == run[0][0]


@FAST
@given(st.lists(runs, min_size=1, max_size=3), st.sampled_from([2.0, float("inf")]))
def test_sglang_output_lines_are_one_phase_each(lines, rate):
    text = "".join(json.dumps({**_client_dict(run, kind="sglang", sent=False, latencies=False),
                               "request_rate": rate}) + "\n" for run in lines)
    phases = read_measured(_write(text, ".jsonl"))
    assert len(phases) == len(lines)
    for phase, run in zip(phases, lines):
        prompts, ttft_s, tpot_s = _expected(run)
        assert sorted(phase.requests.input_tokens.tolist()) == prompts
        assert _same(phase.ttft_s, ttft_s) and _same(phase.decode_s, tpot_s) and phase.rate == rate
        assert not phase.sent and phase.requests.arrival_s[0] == 0.0
        assert (np.diff(phase.requests.arrival_s) > 0).all() if math.isfinite(rate) and len(run) > 1 else True


def _guidellm(benchmarks, version: int) -> dict:
    """A guidellm report: schema version 2 (config.strategy, request_start_time) or 0.3 (args, start_time)."""
    out = []
    for run in benchmarks:
        requests = [{"prompt_tokens": r[0], "output_tokens": r[1], "time_to_first_token_ms": r[2] * 1e3,
                     "inter_token_latency_ms": r[3] * 1e3 if r[1] > 1 else None,
                     ("request_start_time" if version == 2 else "start_time"): 1e9 + r[4]} for r in run]
        strategy = {"type_": "concurrent", "streams": 3}
        holder = {"config": {"strategy": strategy}} if version == 2 else {"args": {"strategy": strategy}}
        out.append({**holder, "type_": "generative_benchmark",
                    "requests": {"successful": requests, "incomplete": [], "errored": [], "total": None}})
    return {"metadata": {"version": version}, "benchmarks": out}


@FAST
@given(st.lists(runs, min_size=1, max_size=3), st.sampled_from([2, 0]))
def test_a_guidellm_report_is_one_phase_per_benchmark(benchmarks, version):
    phases = read_measured(_write(json.dumps(_guidellm(benchmarks, version))))
    assert len(phases) == len(benchmarks)
    for phase, run in zip(phases, benchmarks):
        prompts, ttft_s, tpot_s = _expected(run)
        assert sorted(phase.requests.input_tokens.tolist()) == prompts
        assert _same(phase.ttft_s, ttft_s) and _same(phase.decode_s, tpot_s)
        assert phase.sent and phase.concurrency == 3 and phase.requests.arrival_s[0] == 0.0


def test_a_chat_run_gets_the_template_tokens_the_server_added():
    run = [(100, 4, 0.1, 0.01, 0.0)]
    chat = {**_client_dict(run, kind="vllm", sent=False, latencies=True), "backend": "openai-chat"}
    assert read_measured(_write(json.dumps(chat)), chat_template_tokens=9)[0].requests.input_tokens.tolist() == [109]
    plain = _client_dict(run, kind="vllm", sent=False, latencies=True)
    assert read_measured(_write(json.dumps(plain)), chat_template_tokens=9)[0].requests.input_tokens.tolist() == [100]


@pytest.mark.parametrize("kind, drop, said", [
    ("vllm", "ttfts",
     "a vllm bench serve result without per-request `ttfts`; rerun with --save-result --save-detailed"),
    ("sglang", "itls", "an SGLang bench_serving result without per-request `itls`; rerun with --output-details"),
])
def test_a_result_saved_without_its_requests_says_which_flag_keeps_them(kind, drop, said):
    document = _client_dict([(100, 4, 0.1, 0.01, 0.0)], kind=kind, sent=False, latencies=False)
    del document[drop]
    path = _write(json.dumps(document))
    with pytest.raises(UserError) as error:
        read_measured(path)
    assert str(error.value) == f"{path}: {said}"


def test_a_request_that_ends_before_its_first_token_is_a_damaged_file():
    """E2E (`latencies`) shorter than TTFT cannot be measured; it is refused, not fitted as a negative TPOT."""
    document = _client_dict([(100, 4, 0.1, 0.01, 0.0), (120, 4, 0.1, 0.01, 1.0)], kind="vllm", sent=True,
                            latencies=True)
    document["latencies"][1] = 0.05
    path = _write(json.dumps(document))
    with pytest.raises(UserError) as error:
        read_measured(path)
    assert str(error.value) == (f"{path}: request 1's `latencies` entry (0.05 s) is shorter than its `ttfts` entry "
                                "(0.1 s): a request ends after its first token; the file is damaged")


@pytest.mark.parametrize("benchmarks, said", [
    ([], "a guidellm report with no benchmarks (`benchmarks` is empty): the run measured nothing"),
    ({"a": 1}, "a guidellm report whose `benchmarks` is not a list"),
])
def test_a_guidellm_report_without_a_benchmark_says_which(benchmarks, said):
    path = _write(json.dumps({"benchmarks": benchmarks}))
    with pytest.raises(UserError) as error:
        read_measured(path)
    assert str(error.value).startswith(f"{path}: {said}")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@FAST
@given(st.sampled_from(["vllm", "sglang", "guidellm"]), st.data())
def test_a_damaged_file_is_a_user_error_never_a_traceback(kind, data):
    """A valid file with one field replaced by any JSON value, deleted, or the text cut short."""
    run = [(100, 4, 0.1, 0.01, 1.0), (200, 1, 0.2, 0.01, 2.0)]
    document = _guidellm([run], 2) if kind == "guidellm" else _client_dict(run, kind=kind, sent=True, latencies=True)
    if kind == "guidellm" and data.draw(st.booleans()):
        document = document["benchmarks"][0]["requests"]["successful"][0]
    key = data.draw(st.sampled_from(sorted(document)))
    action = data.draw(st.sampled_from(["replace", "delete", "cut", "item"]))
    if action == "replace":
        document[key] = data.draw(json_values)
    elif action == "delete":
        del document[key]
    elif action == "item" and isinstance(document[key], list) and document[key]:
        document[key][data.draw(st.integers(0, len(document[key]) - 1))] = data.draw(json_values)
    if kind == "guidellm" and "benchmarks" not in document:
        document = {"benchmarks": [{"requests": {"successful": [document]}}]}
    text = json.dumps(document)
    if action == "cut":
        text = text[:data.draw(st.integers(0, len(text)))]
    try:
        phases = read_measured(_write(text))
    except UserError as error:
        assert "\n" not in str(error)
        return
    for phase in phases:
        assert len(phase.requests) >= 1 and len(phase.counted) == len(phase.requests)


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_are_a_user_error_or_phases(blob):
    folder = Path(tempfile.mkdtemp())
    (folder / "x.json").write_bytes(blob)
    try:
        read_measured(str(folder / "x.json"))
    except UserError as error:
        assert "\n" not in str(error)


def test_an_sglang_run_sent_at_a_traces_timestamps_says_so():
    # bench_serving --use-trace-timestamps writes request_rate "trace" and no send times: nothing to replay
    run = [(12, 3, 0.05, 0.01, 0.0), (20, 4, 0.06, 0.012, 0.1)]
    text = json.dumps({**_client_dict(run, kind="sglang", sent=False, latencies=False), "request_rate": "trace"})
    with pytest.raises(UserError, match='request_rate: "trace": the run sent its requests at a trace\'s timestamps'):
        read_measured(_write(text + "\n", ".jsonl"))


@pytest.mark.parametrize("kind, change", [
    ("vllm", {"input_lens": [10**30, 200]}), ("vllm", {"output_lens": [4, 2**63 - 1]}),
    ("vllm", {"start_times": [0.0, 1e12]}), ("vllm", {"start_times": [0.0, -1e300]}),
    ("guidellm", {"prompt_tokens": 10**30}), ("guidellm", {"output_tokens": 10**30}),
    ("guidellm", {"request_start_time": 1e300}),
])
def test_counts_and_send_times_out_of_range_are_a_user_error(kind, change):
    # A count past int64 raised OverflowError (np.array(..., np.int64)); send times a trillion seconds apart
    # were read, and the fit's simulation then overflowed int64 nanoseconds (OverflowError, a traceback).
    run = [(100, 4, 0.1, 0.01, 1.0), (200, 1, 0.2, 0.01, 2.0)]
    if kind == "guidellm":
        document = _guidellm([run], 2)
        document["benchmarks"][0]["requests"]["successful"][1].update(change)
    else:
        document = {**_client_dict(run, kind=kind, sent=True, latencies=True), **change}
    with pytest.raises(UserError) as error:
        read_measured(_write(json.dumps(document)))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("text, said", [("null\n", "not a measurement tokenpath reads"), ("garbage\n", ":1: not JSON"),
                                        ("\n\n", "empty")])
def test_json_null_is_json_that_is_no_measurement_and_text_that_is_not_json_says_so(text, said, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(UserError, match=said):
        read_measured(str(path))
