"""Delivery calibration: the file format, the cost it implies per step, and simulate using it."""

from __future__ import annotations

import json
import socket
import sys

import numpy as np
import pytest
import tomli_w
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from cli_helpers import run_cli
from tokenpath.config.errors import UserError
from tokenpath.delivery import Detokenizer
from tokenpath.delivery import request_measure as rm
from tokenpath.delivery.calibration import (
    SCHEMA,
    BatchCost,
    CalibratedCost,
    Calibration,
    FramingCost,
    HttpCost,
    RequestCost,
)
from tokenpath.delivery.chat_template import LLAMA3_SPECIAL_TOKENS, LLAMA3_TEMPLATE, render, renderer_for
from tokenpath.delivery.engine_protocol import engine_event, validate_request
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.measure import calibrate, stream_contexts, token_streams
from tokenpath.delivery.path import TextPath
from tokenpath.delivery.sample_text import MIXED
from tokenpath.delivery.spec import DETOKENIZE_PER_TOKEN_S, DeliverySpec
from tokenpath.delivery.sse import SseFramer


def write(tmp_path, batches, name="cal.toml"):
    path = tmp_path / name
    Calibration(batches=batches, machine={"cpu": "test"}).write(path)
    return str(path)


TWO = [BatchCost(1, 10e-6, 2e-6, 0.5e-6), BatchCost(100, 20e-6, 1e-6, 0.25e-6)]


def test_cost_is_interpolated_between_batch_sizes_and_extended_linearly(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, TWO))
    t1, t100 = 10e-6 + 2e-6, 20e-6 + 100 * 1e-6          # whole-step cost at the measured sizes
    slope = (t100 - t1) / 99
    assert cost.host_s(1, 1) == pytest.approx(t1)
    assert cost.host_s(100, 100) == pytest.approx(t100)
    assert cost.host_s(50, 50) == pytest.approx(t1 + 49 * slope)
    assert cost.host_s(300, 300) == pytest.approx(t100 + 200 * slope)
    assert cost.host_s(0, 0) == 0.0


def test_grouped_events_pay_framing_per_event(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, TWO))
    assert cost.host_s(100, 25) == pytest.approx(cost.host_s(100, 100) - 75 * 0.25e-6)


def test_a_single_batch_size_gives_a_line_through_it(tmp_path):
    cost = CalibratedCost.from_file(write(tmp_path, [BatchCost(8, 4e-6, 1e-6, 0.1e-6)]))
    assert cost.host_s(8, 8) == pytest.approx(12e-6)
    assert cost.host_s(16, 16) == pytest.approx(20e-6)


def test_last_mile_charges_the_calibrated_host_cost(tmp_path):
    path = write(tmp_path, TWO)
    # Pricing this package's server, whose detokenizer the batch rows time.
    constant = LastMile(DeliverySpec(detokenize="engine"))
    measured = LastMile(DeliverySpec(detokenize="engine", calibration=path, calibrated_server="serve"))
    blocking_constant, *_ = constant.on_step(0, 50, 50)
    blocking_measured, leave, _, framing_ns = measured.on_step(0, 50, 50)
    copy_ns = blocking_constant - round(50 * DeliverySpec().detokenize_per_token * 1e9)
    # Detokenizing blocks the engine; the API server then frames the 50 events.
    calibrated = CalibratedCost.from_file(path, "serve")
    assert framing_ns == round(calibrated.frame_s(50, 50) * 1e9)
    assert blocking_measured + framing_ns == pytest.approx(copy_ns + calibrated.host_s(50, 50) * 1e9, abs=1)
    assert leave == blocking_measured + framing_ns


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("schema = 'other/1'\n", "expected 'tokenpath.delivery-calibration/1'"),
    ("schema = 'tokenpath.delivery-calibration/1'\n[[batch]]\nbatch_size = 1\n", "batch[0] lacks"),
    ("schema = 'tokenpath.delivery-calibration/1'\n", "no [[batch]] rows"),
    ("not = [toml", "not valid TOML"),
])
def test_a_bad_calibration_file_names_the_field_and_the_fix(tmp_path, content, message):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match="delivery.calibration") as error:
        LastMile(DeliverySpec(calibration=str(path)))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("command", ["simulate", "levers", "capacity"])
def test_a_missing_calibration_file_read_during_the_run_is_the_only_line_on_stderr(tmp_path, monkeypatch, capsys,
                                                                                  command):
    """The file is read as the run starts, inside its progress bar: nothing else reaches stderr before the error."""
    missing = tmp_path / "none.toml"
    code, out, err = run_cli([command, "--set", f"delivery.calibration={missing}"], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.endswith(f"delivery.calibration = '{missing}': no such file; write one with "
                        f"`tokenpath calibrate delivery --out {missing}`\n")
    assert err.startswith("error: ") and err.count("\n") == 1


def test_measuring_writes_a_file_that_reads_back(tmp_path):
    det = Detokenizer.load("tokenizer.model.v1")
    calibration = calibrate(det, [1, 4], steps=10, repeats=1)
    path = tmp_path / "m.toml"
    calibration.write(path)
    back = Calibration.read(path)
    assert [b.batch_size for b in back.batches] == [1, 4]
    assert back.batches == calibration.batches
    assert back.request == calibration.request and back.framing == calibration.framing
    assert back.path["request"]["tokenize_prompt_tokens"] == [128, 512, 2048, 8192]
    assert back.path["request"]["template"] == "mistral-common encode_chat_completion"
    assert back.path["request"]["conversation_roles"] == ["system", "user"]
    assert back.tokenizer == {"name": "tokenizer.model.v1", "kind": "sentencepiece", "vocab_size": 32000}
    assert all(b.step_s >= 0 and b.per_token_s >= 0 and 0 <= b.frame_per_event_s <= b.per_token_s
               for b in back.batches)


def test_token_streams_are_windows_of_the_sample_text():
    det = Detokenizer.load("tokenizer.model.v1")
    ids = token_streams(det, batch=3, steps=7000)
    assert ids.shape == (7000, 3) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < det.vocab_size


def test_the_cli_writes_a_calibration_and_refuses_bad_batch_sizes(tmp_path, monkeypatch):
    from tokenpath.calibrate import engine_http
    from tokenpath.cli import app

    # Without fastapi and uvicorn the engine's HTTP layer is skipped with a note (tests/test_engine_http.py
    # runs it where they are installed).
    monkeypatch.setattr(engine_http, "missing", lambda: "fastapi not installed (pip install 'tokenpath[engines]')")
    out = tmp_path / "host.toml"
    result = CliRunner().invoke(app, ["calibrate", "delivery", "--tokenizer", "tokenizer.model.v1", "--out", str(out),
                                      "--batch-sizes", "2", "4", "--steps", "10", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    written = Calibration.read(out)
    assert [b.batch_size for b in written.batches] == [2, 4]
    assert written.request is not None and written.framing is not None and written.http is not None
    assert "front end per request" in result.output and "hand-off to engine" in result.output
    # mistral-common's Tekken renders without Jinja: the template source is timed on the embedded Llama 3's
    assert written.path["template_parse"] == {"template": "Llama 3 template (embedded)", "chars": len(LLAMA3_TEMPLATE),
                                              "work": "delivery/template_parse.py, per character"}
    parse = written.template_parse
    # both timed on this machine: each a positive cost under a millisecond a character (which is larger
    # depends on the machine's load at the moment)
    assert 0 < parse.template_format_detection_per_char_s < 1e-3
    assert 0 < parse.template_kwargs_resolution_per_char_s < 1e-3
    assert "template source, vLLM 0.11.0" in result.output
    assert "HTTP server, per request" in result.output and "chunk written to its socket" in result.output
    assert written.path["http"]["request"].startswith("a burst of 200 connections at once")
    assert "template_s" in written.path["http"]["serve"] and "handoff_s" in written.path["http"]["serve"]
    assert written.engine_http is None and "fastapi not installed" in written.path["engine_http"]["skipped"]
    assert "an engine's HTTP layer (FastAPI, uvicorn) was not measured" in result.output
    for sizes in ("0", "10000000000000"):  # (a batch no engine's step holds: it read as running out of memory)
        bad = CliRunner().invoke(app, ["calibrate", "delivery", "--batch-sizes", sizes, "--out", str(out)])
        assert isinstance(bad.exception, UserError) and "must be batch sizes from 1 to 1,048,576" in str(bad.exception)


def test_simulate_uses_the_calibration(tmp_path):
    from tokenpath import load_scenario, simulate

    slow = write(tmp_path, [BatchCost(1, 1e-3, 1e-3, 0.0), BatchCost(256, 1e-3, 1e-3, 0.0)], "slow.toml")
    overrides = {"workload.num_requests": 60, "delivery.detokenize": "engine", "delivery.calibrated_server": "serve"}
    base = simulate(load_scenario("typical", overrides)).run
    calibrated = simulate(load_scenario("typical", {**overrides, "delivery.calibration": slow})).run
    # 1 ms of fixed cost plus 1 ms per token, inline: every step a request takes part in (one per
    # output token) blocks at least 2 ms instead of the constant model's few microseconds.
    growth = calibrated.delivery_ns.astype(np.int64) - base.delivery_ns
    assert np.all(growth >= 1.9e6 * calibrated.output_tokens)


# The request path -------------------------------------------------------------------------------

REQUEST = RequestCost(parse_s=2**-16, template_s=2**-15, tokenize_per_token_s=2**-22, handoff_s=2**-17)
FRAMING = FramingCost(engine_frame_per_event_s=1e-5, own_frame_per_event_s=8.5e-7)
HEAD = f"schema = '{SCHEMA}'\n[[batch]]\nbatch_size = 1\nstep_s = 1e-6\nper_token_s = 1e-6\nframe_per_event_s = 0.0\n"


def test_per_request_cost_is_the_fixed_pieces_plus_tokens_times_the_rate():
    assert REQUEST.per_request_s(0) == 2**-16 + 2**-15 + 2**-17
    assert REQUEST.per_request_s(1000) == 2**-16 + 2**-15 + 2**-17 + 1000 * 2**-22


def test_request_and_framing_tables_round_trip(tmp_path):
    path = tmp_path / "c.toml"
    Calibration(TWO, {"cpu": "test"}, request=REQUEST, framing=FRAMING, http=HTTP, engine_http=ENGINE_HTTP).write(path)
    text = path.read_text()
    assert "[request]" in text and "[framing]" in text and "[http]" in text and "[engine_http]" in text
    back = Calibration.read(path)
    assert back.request == REQUEST and back.framing == FRAMING and back.http == HTTP and back.batches == TWO
    assert back.engine_http == ENGINE_HTTP


HTTP = HttpCost(request_s=2**-12, event_s=2**-16)
ENGINE_HTTP = HttpCost(request_s=2**-11, event_s=2**-17)


def test_the_http_server_adds_its_cost_to_each_request_and_each_event(tmp_path):
    path = tmp_path / "c.toml"
    Calibration(TWO, request=REQUEST, http=HTTP).write(path)
    with_http = CalibratedCost.from_file(path, "serve")
    without = CalibratedCost(Calibration(TWO, request=REQUEST), "serve")
    r = REQUEST  # as it arrives: the HTTP server's work and parsing; then the template and the hand-off
    assert with_http.request_stages_s() == (2**-12 + r.parse_s, r.template_s + r.handoff_s, r.tokenize_per_token_s)
    assert without.request_stages_s() == (r.parse_s, r.template_s + r.handoff_s, r.tokenize_per_token_s)
    assert CalibratedCost(Calibration(TWO, http=HTTP), "serve").request_stages_s() is None  # no [request]
    # Each event is written to its socket: 25 events of 100 tokens add 25 writes to the step and to its framing.
    assert with_http.host_s(100, 25) == pytest.approx(without.host_s(100, 25) + 25 * 2**-16)
    assert with_http.frame_s(100, 25) == pytest.approx(without.frame_s(100, 25) + 25 * 2**-16)
    assert with_http.host_s(0, 0) == with_http.frame_s(0, 0) == 0.0
    last_mile = LastMile(DeliverySpec(detokenize="api-server", calibration=str(path), calibrated_server="serve"))
    assert last_mile.request_cost_s(1000) == pytest.approx(REQUEST.per_request_s(1000) + 2**-12, rel=1e-12)
    detokenize_s, framing_s = last_mile.host_costs_s(100, 25)
    assert detokenize_s == pytest.approx(without.host_s(100, 25) - without.frame_s(100, 25))
    assert framing_s == pytest.approx(without.frame_s(100, 25) + 25 * 2**-16)



def test_an_engine_s_front_end_is_its_http_server_its_chunks_and_the_request_path(tmp_path):
    path = tmp_path / "c.toml"
    Calibration(TWO, request=REQUEST, framing=FRAMING, http=HTTP, engine_http=ENGINE_HTTP).write(path)
    engine, serve = CalibratedCost.from_file(path), CalibratedCost.from_file(path, "serve")
    r = REQUEST  # the engine's HTTP figure holds the body's validation: parse_s is not added again
    assert engine.request_stages_s() == (2**-11, r.template_s + r.handoff_s, r.tokenize_per_token_s)
    # Per event: the engine's pydantic chunk and its server's write, in place of this package's framer
    # (TWO's rows at batch 100: a step of 20 us + 100 x 1 us, of which 0.25 us a token is framing).
    assert engine.frame_s(100, 25) == pytest.approx(25 * (1e-5 + 2**-17))
    assert engine.host_s(100, 25) == pytest.approx(20e-6 + 100 * (1e-6 - 0.25e-6) + 25 * (1e-5 + 2**-17))
    assert serve.host_s(100, 25) == pytest.approx(20e-6 + 100 * 1e-6 - 75 * 0.25e-6 + 25 * 2**-16)
    last_mile = LastMile(DeliverySpec(detokenize="api-server", calibration=str(path)))
    assert last_mile.request_cost_s(1000) == pytest.approx(2**-11 + r.template_s + r.handoff_s
                                                           + 1000 * r.tokenize_per_token_s, rel=1e-12)
    # Per token, the engine's own work (the registry's, timed with vLLM's code), not this package's
    # detokenizer's batch rows, which price `serve` alone.
    detokenize_s, framing_s = last_mile.host_costs_s(100, 25)
    assert detokenize_s == pytest.approx(100 * DETOKENIZE_PER_TOKEN_S)
    assert framing_s == pytest.approx(engine.frame_s(100, 25))
    # A file without [engine_http] (fastapi absent when it was measured): the validation, no HTTP server.
    bare = CalibratedCost(Calibration(TWO, request=REQUEST, framing=FRAMING, http=HTTP))
    assert bare.request_stages_s()[0] == r.parse_s and bare.frame_s(100, 25) == pytest.approx(25 * 1e-5)


def test_an_unknown_calibrated_server_is_named_in_one_line():
    from tokenpath import load_scenario

    with pytest.raises(UserError, match="delivery.calibrated_server: Input should be 'engine' or 'serve'") as error:
        load_scenario("typical", {"delivery.calibrated_server": "vllm"})
    assert "\n" not in str(error.value)


def test_a_file_without_request_or_framing_still_reads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(HEAD)
    old = Calibration.read(path)
    assert old.request is None and old.framing is None and old.http is None and old.engine_http is None
    assert old.batches == [BatchCost(1, 1e-6, 1e-6, 0.0)]
    Calibration(TWO).write(path)                       # nothing to write: no tables
    assert "[request]" not in path.read_text() and Calibration.read(path).request is None


@pytest.mark.parametrize("table, message", [
    ("[request]\nparse_s = 'fast'\ntemplate_s = 0.0\ntokenize_per_token_s = 0.0\nhandoff_s = 0.0\n",
     "request.parse_s is 'fast'"),
    ("[request]\nparse_s = 0.0\ntokenize_per_token_s = 0.0\nhandoff_s = 0.0\n", "request.template_s is missing"),
    ("[request]\nparse_s = 0.0\ntemplate_s = 0.0\ntokenize_per_token_s = -1e-6\nhandoff_s = 0.0\n",
     "request.tokenize_per_token_s is -1e-06"),
    ("[request]\nparse_s = 0.0\ntemplate_s = 0.0\ntokenize_per_token_s = 0.0\nhandoff_s = true\n",
     "request.handoff_s is True"),
    ("request = 3\n", "request is 3, not a table"),
    ("[framing]\nengine_frame_per_event_s = nan\nown_frame_per_event_s = 0.0\n", "framing.engine_frame_per_event_s"),
    ("[http]\nrequest_s = 1e-4\n", "http.event_s is missing"),
    ("[engine_http]\nrequest_s = 1e-4\nevent_s = -1.0\n", "engine_http.event_s is -1.0"),
])
def test_a_garbled_request_field_is_named(tmp_path, table, message):
    path = tmp_path / "c.toml"
    path.write_text(table + HEAD if table.startswith("request =") else HEAD + table)
    with pytest.raises(UserError) as error:
        Calibration.read(path)
    assert message in str(error.value) and "tokenpath calibrate delivery" in str(error.value)
    assert "\n" not in str(error.value)


NOT_SECONDS = st.one_of(st.text(max_size=8), st.booleans(), st.floats(max_value=-1e-300),
                        st.floats(min_value=3600.5, allow_infinity=True), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["parse_s", "template_s", "tokenize_per_token_s", "handoff_s"]), NOT_SECONDS)
def test_any_value_that_is_not_seconds_is_refused_by_name(tmp_path_factory, name, value):
    table = {"parse_s": 1e-5, "template_s": 2e-5, "tokenize_per_token_s": 3e-7, "handoff_s": 4e-5, name: value}
    path = tmp_path_factory.mktemp("c") / "c.toml"
    path.write_text(HEAD + tomli_w.dumps({"request": table}))
    with pytest.raises(UserError, match=f"request\\.{name} is ") as error:
        Calibration.read(path)
    assert "\n" not in str(error.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=3600), min_size=6, max_size=6))
def test_any_seconds_round_trip_exactly(tmp_path_factory, values):
    request, framing = RequestCost(*values[:4]), FramingCost(*values[4:])
    path = tmp_path_factory.mktemp("c") / "c.toml"
    Calibration(TWO, request=request, framing=framing).write(path)
    back = Calibration.read(path)
    assert back.request == request and back.framing == framing


@settings(max_examples=80, deadline=None)
@given(st.floats(-1e-3, 1e-3), st.floats(0, 1e-5),
       st.lists(st.integers(1, 100_000), min_size=2, max_size=8, unique=True))
@example(0.0, 6.046013173602564e-06, [82077, 82079])  # two close lengths: the intercept's rounding shows
def test_the_slope_fit_recovers_a_line(intercept, slope, lengths):
    points = [(x, intercept + slope * x) for x in lengths]
    fitted_intercept, fitted_slope = rm.fit_line(points)
    assert fitted_slope == pytest.approx(slope, rel=1e-6, abs=1e-15)
    # The intercept is extrapolated from x's mean back to 0: its rounding error grows as the points' values
    # times mean / spread of x (two points at 82,077 and 82,079 carry 1.6e-12 of it).
    spread = max(lengths) - min(lengths)
    rounding = 8 * sys.float_info.epsilon * max(abs(y) for _, y in points) * max(lengths) / spread
    assert fitted_intercept == pytest.approx(intercept, rel=1e-6, abs=1e-12 + rounding)


def test_the_slope_fit_is_least_squares():
    # Medians at 128, 512, 2048, 8192 tokens with the middle two off a 1 us + 0.25 us/token line by
    # +2 and -2 us: the mean stays on the line, the slope tilts by 2 us * (512 - 2048) / sum((x - mean)^2).
    points = [(128, 1e-6 + 128 * 0.25e-6), (512, 1e-6 + 512 * 0.25e-6 + 2e-6),
              (2048, 1e-6 + 2048 * 0.25e-6 - 2e-6), (8192, 1e-6 + 8192 * 0.25e-6)]
    intercept, slope = rm.fit_line(points)
    residual = 2e-6 * ((512 - 2048) / sum((x - 2720) ** 2 for x, _ in points))
    assert slope == pytest.approx(0.25e-6 + residual, rel=1e-9)
    assert intercept == pytest.approx(1e-6 - residual * 2720, rel=1e-6)
    with pytest.raises(ValueError, match="two different x"):
        rm.fit_line([(128, 1.0), (128, 2.0)])


def test_median_s_times_enough_calls_per_repeat(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(rm.time, "perf_counter", lambda: clock[0])
    calls = []

    def call():                                        # each call "takes" 1 ms of the fake clock
        calls.append(1)
        clock[0] += 1e-3

    assert rm.median_s(call, repeats=3, min_repeat_s=2.5e-3) == pytest.approx(1e-3)
    assert len(calls) == 1 + 3 * 3                     # one to size the loop, then 3 repeats of 3 calls


CONVERSATION = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi <b>there</b>"}]


def test_the_llama3_template_renders_the_exact_prompt():
    prompt = render(LLAMA3_TEMPLATE, CONVERSATION, **LLAMA3_SPECIAL_TOKENS)
    assert prompt == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi <b>there</b><|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render(LLAMA3_TEMPLATE, CONVERSATION, add_generation_prompt=False, **LLAMA3_SPECIAL_TOKENS).endswith(
        "Hi <b>there</b><|eot_id|>")


# Written over several lines as tokenizer_config.json templates often are: trim_blocks and lstrip_blocks
# drop the block tags' lines, tojson keeps HTML and non-ASCII characters, raise_exception refuses.
HAND_WRITTEN = """\
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>
{% endif %}
{{ {'note': 'café <b>'} | tojson }}
"""


def test_a_hand_written_template_renders_as_transformers_would():
    prompt = render(HAND_WRITTEN, CONVERSATION)
    assert prompt == ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\n"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi <b>there</b><|eot_id|>\n"
                      "<|start_header_id|>assistant<|end_header_id|>\n"
                      '{"note": "café <b>"}')
    import jinja2

    with pytest.raises(jinja2.TemplateError, match="unknown role tool"):
        render(HAND_WRITTEN, [{"role": "tool", "content": "x"}])


def test_a_huggingface_tokenizer_uses_the_template_beside_it(tmp_path):
    config = {"chat_template": HAND_WRITTEN.replace("<|start_header_id|>{{", "{{ bos_token }}{{", 1),
              "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    renderer, conversation = renderer_for(tmp_path / "tokenizer.json", "huggingface")
    assert renderer.name == "tokenizer_config.json chat_template, Jinja2 as in transformers"
    assert renderer.encodes is None and conversation[0]["role"] == "system"
    assert renderer.apply(CONVERSATION).startswith("<s>system<|end_header_id|>\n\nBe brief.<|eot_id|>\n<s>user")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(UserError, match="Jinja2 cannot compile the chat template"):
        renderer_for(tmp_path / "tokenizer.json", "huggingface")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    fallback, _ = renderer_for(tmp_path / "tokenizer.json", "huggingface")
    assert fallback.name.startswith("Llama 3 template (embedded)")
    assert fallback.apply(CONVERSATION) == render(LLAMA3_TEMPLATE, CONVERSATION, **LLAMA3_SPECIAL_TOKENS)


def test_a_template_that_refuses_system_messages_gets_the_question_alone(tmp_path):
    only_users = "{% for m in messages %}{% if m['role'] != 'user' %}{{ raise_exception('no') }}{% endif %}" \
                 "[{{ m['content'] }}]{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": only_users}))
    _, conversation = renderer_for(tmp_path / "tokenizer.json", "huggingface")
    assert [m["role"] for m in conversation] == ["user"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ raise_exception('never') }}"}))
    with pytest.raises(UserError, match="refuses a system \\+ user and a user-only conversation \\(never\\)"):
        renderer_for(tmp_path / "tokenizer.json", "huggingface")


def test_the_engine_request_is_validated_as_the_engine_does():
    body = rm.request_body(CONVERSATION)
    request = validate_request(body)
    assert request.messages == CONVERSATION and request.max_tokens == rm.MAX_TOKENS and request.stream is True
    assert request.stream_options.include_usage is True and request.tool_choice == "none"
    with pytest.raises(ValidationError, match="Stream options can only be defined when `stream=True`"):
        validate_request(body.replace(b'"stream":true', b'"stream":false'))
    with pytest.raises(ValidationError):
        validate_request(body.replace(b'"role":"user"', b'"rolle":"user"'))


@pytest.mark.parametrize("text", ["Hello", " wor", "ld \\\"quoted\\\"\n", "café 🎉", "<|end|>"])
def test_the_engine_chunk_has_the_same_bytes_as_the_own_framer(text):
    framer = SseFramer(1)
    framer.open(0, "chatcmpl-7", "m", 123)
    assert engine_event("chatcmpl-7", "m", 123, text) == framer.step([text])[0]


def test_the_hand_off_delivers_the_request_unchanged():
    request = rm.engine_request(validate_request(rm.request_body(CONVERSATION)), list(range(1024)))
    sender, receiver = socket.socketpair()
    with sender, receiver:
        assert rm.hand_off(sender, receiver, request) == request
    assert request["sampling_params"]["temperature"] == 0.7 and request["sampling_params"]["max_tokens"] == 256


def test_a_measured_template_parse_replaces_the_registry_s_rate(tmp_path):
    """A scenario on a release that parses its template per request takes the file's rate per character,
    where the file measured one; a file without [template_parse] leaves the registry's."""
    from tokenpath import load_scenario
    from tokenpath.config.assumptions import default
    from tokenpath.delivery.calibration import TemplateParseCost

    measured = tmp_path / "measured.toml"
    Calibration(batches=TWO, template_parse=TemplateParseCost(2e-6, 5e-6)).write(measured)
    assert Calibration.read(measured).template_parse == TemplateParseCost(2e-6, 5e-6)
    base = {"model.name": "qwen3-8b", "engine.scheduler": "vllm-v1", "engine.version": "0.11.0"}

    def parse_s(calibration: str) -> float:
        scenario = load_scenario("typical", {**base, "delivery.calibration": calibration})
        return scenario.resolved_delivery().chat_template_parse_per_request

    assert parse_s(str(measured)) == pytest.approx(5e-6 * 4168)
    assert parse_s(write(tmp_path, TWO)) == pytest.approx(default("template_kwargs_resolution_per_char_s") * 4168)


def test_each_measured_stream_follows_the_sample_tokens_before_its_window():
    det = Detokenizer.load("tokenizer.model.v1")
    ids, context = token_streams(det, batch=3, steps=20), stream_contexts(det, batch=3)
    sample = det.encode(MIXED)
    for column, tail in zip(ids.T.tolist(), context):
        start = next(s for s in range(len(sample)) if sample[s:s + 20] == column)
        assert tail == [sample[(start - 5 + k) % len(sample)] for k in range(5)]
    path = TextPath(det, 3, context=context)
    events = [path.step(row) for row in ids] + [path.finish()]
    for i, tail in enumerate(context):  # each stream's text is its window as it reads after its prompt
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for step in events for line in step[i].decode().split("\n\n")
                       if line.startswith("data: {"))
        assert text == det.decode(tail + ids[:, i].tolist())[len(det.decode(tail)):]
