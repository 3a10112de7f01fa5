"""bench without the network: prompts of exact lengths, SSE and HTTP parsing, token accounting, the
measured Run and its summary, the results file."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario
from tokenpath.bench import (
    PromptBuilder,
    Target,
    build_run,
    load_tokenizer,
    read_results,
    runner,
    token_times,
    workload_requests,
)
from tokenpath.bench.http import Connection, Endpoint
from tokenpath.bench.plan import request_body
from tokenpath.bench.results import bench_summary
from tokenpath.bench.runner import Plan, auto_workers, concurrency_share, execute
from tokenpath.bench.stream import DROPPED, EMPTY, INCOMPLETE, MALFORMED, SERVER_ERROR, Exchange, allocate
from tokenpath.config.errors import UserError


# ---- prompts ------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(1, 3000), start=st.integers(0, 10_000), index=st.integers(0, 10**6))
def test_prompt_has_exact_token_length(builder, tekken, length, start, index):
    text = builder.build(length, start, f"[ab12-{index}]")
    assert len(tekken.encode(text)) == length


def test_a_tag_longer_than_the_prompt_is_left_out(builder, tekken):
    tag = "[ab12-100]"  # 9 Tekken tokens: every digit is one
    assert len(tekken.encode(tag)) == 9
    assert len(tekken.encode(builder.build(8, 0, tag))) == 8
    assert not builder.build(8, 0, tag).startswith(tag)
    assert builder.build(10, 0, tag).startswith(tag)


def test_long_prompt_tiles_the_corpus(builder, tekken):
    text = builder.build(20_000, 5, "[x-1]")
    assert len(tekken.encode(text)) == 20_000
    assert text.startswith("[x-1]")


def test_prompts_are_tagged_and_distinct(builder, tekken):
    rng = np.random.default_rng(1)
    lengths = np.array([50, 50, 50, 3, 400])
    prompts = builder.build_many(lengths, rng, "t-")
    assert [len(tekken.encode(p)) for p in prompts] == lengths.tolist()
    assert prompts[0].startswith("[t-0]") and prompts[2].startswith("[t-2]")
    assert not prompts[3].startswith("[")  # too short for a tag
    assert len(set(prompts)) == len(prompts)


def test_prompts_with_a_word_level_tokenizer(tmp_path):
    """A tokenizer whose per-token decode is not a slice of the text takes the decode path, still exact."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tokenpath.bench.prompts import corpus_text

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator([corpus_text()], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    loaded = load_tokenizer(str(path))
    words = PromptBuilder(loaded)
    for length in (1, 2, 9, 77, 1500):
        assert len(loaded.encode(words.build(length, 3, "[q-7]"))) == length


def test_tokenizer_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="missing.json not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="is a folder; give the path to the tokenizer.json in it"):
        load_tokenizer(str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="tokenizer"):
        load_tokenizer(str(bad))


# ---- plan ---------------------------------------------------------------------------------------------
def test_workload_is_drawn_as_simulate_draws_it():
    from tokenpath.sim.simulate import prepare

    scenario = load_scenario(None, {"workload.num_requests": 300, "seed": 7})
    assert workload_requests(scenario) == prepare(scenario).requests


def test_bench_sends_at_the_schedule_simulate_draws():
    """Gamma sends as simulate draws them: the first at 0 and the gaps as drawn, not vLLM's schedule
    (its first after one gap, the sends rescaled to end at n / rate)."""
    from tokenpath.sim.simulate import prepare, simulate

    scenario = load_scenario(None, {"workload.num_requests": 200, "workload.arrival.rate": 4.0,
                                    "workload.arrival.burstiness": 0.5, "seed": 3})
    sends_s = workload_requests(scenario).arrival_s
    np.testing.assert_array_equal(sends_s, prepare(scenario).requests.arrival_s)
    np.testing.assert_array_equal(np.rint(sends_s * 1e9).astype(np.int64), simulate(scenario).run.scheduled_ns)
    assert sends_s[0] == 0.0 and sends_s[-1] != 200 / 4.0


def test_request_bodies():
    target = Target("http://h:1/", "m")
    body = orjson.loads(request_body(target, "hello", 17))
    assert body == {"model": "m", "stream": True, "max_tokens": 17, "prompt": "hello", "ignore_eos": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chat = Target("http://h:1/v1", "m", "chat", strict_openai=True, extra_body={"temperature": 0})
    body = orjson.loads(request_body(chat, "hi", 3))
    assert body == {"model": "m", "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
                    "stream_options": {"include_usage": True}, "temperature": 0}
    assert target.url() == "http://h:1/v1/completions"
    assert chat.url() == "http://h:1/v1/chat/completions"


def test_endpoint_parsing():
    assert Endpoint.parse("http://127.0.0.1:8000").host_header == "127.0.0.1:8000"
    assert Endpoint.parse("https://api.example.com/v1").port == 443
    for bad in ("ftp://x", "127.0.0.1:8000", "http://"):
        with pytest.raises(UserError, match="--base-url"):
            Endpoint.parse(bad)


def test_worker_counts():
    assert auto_workers(10.0, 150.0, None, 2000, cpus=8) == 1
    assert auto_workers(100.0, 150.0, None, 10_000, cpus=8) == 2
    assert auto_workers(2000.0, 150.0, None, 10_000, cpus=8) == 8
    assert auto_workers(2000.0, 150.0, None, 10_000, cpus=2) == 2
    assert auto_workers(2000.0, 150.0, None, 3, cpus=8) == 3
    assert auto_workers(float("inf"), 150.0, 64, 1000, cpus=8) == 1
    assert [concurrency_share(5, 2, w) for w in range(2)] == [3, 2]
    assert concurrency_share(None, 3, 0) is None


def test_the_heap_is_frozen_before_the_start_time_is_fixed(tmp_path, monkeypatch):
    """A full pass of the garbage collector takes tens of milliseconds: taken after the start time is
    fixed, every first request would leave that late (and a burst split between workers)."""
    order = []
    monkeypatch.setattr(runner, "_freeze_heap", lambda: order.append(("frozen", runner.perf_counter_ns())))

    def run(worker, appender, index):
        order.append(("start", worker.t0_ns - runner._START_DELAY_NS))  # when the start time was fixed
        return 0

    monkeypatch.setattr(runner, "_run_measured", run)
    one = np.ones(1, np.int64)
    execute(Plan("http://127.0.0.1:9/v1/completions", [b"{}"], np.zeros(1, np.int64), one, one),
            str(tmp_path / "results.jsonl"), {}, workers=1)
    assert [what for what, _ in order] == ["frozen", "start"]
    assert order[0][1] <= order[1][1]


# ---- SSE ----------------------------------------------------------------------------------------------
def _sse(events: list[dict | str], sep: bytes = b"\n\n") -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + sep for e in events)


def _text(t: str, done: int | None = None, finish: str | None = None) -> dict:
    event = {"id": "x", "choices": [{"index": 0, "text": t, "finish_reason": finish}]}
    if done is not None:
        event["usage"] = {"prompt_tokens": 5, "completion_tokens": done}
    return event


def _delta(content=None, reasoning=None, role=False, finish=None) -> dict:
    delta = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _exchange() -> tuple[Exchange, list[Exchange]]:
    ended: list[Exchange] = []
    exchange = Exchange(0, 0, 1000, ended.append, 10, 4)
    exchange.status = 200
    return exchange, ended


STREAM = [_text(" a", 1), _text(" b c", 3), _text(" d", 4, "length"),
          {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}, "[DONE]"]


@settings(max_examples=80, deadline=None)
@given(cuts=st.lists(st.integers(0, len(_sse(STREAM, b"\r\n\r\n"))), max_size=8),
       sep=st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r", b"\r\n\n", b"\n\n\n"]))
def test_sse_pieces_parse_the_same_however_split(cuts, sep):
    data = _sse(STREAM, sep)
    exchange, ended = _exchange()
    bounds = sorted(set([0, *cuts, len(data)]))
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        exchange.feed(data[a:b], 2000 + k)
    assert ended == [exchange] and exchange.error is None
    assert sum(exchange.arrival_tokens) == 4
    assert exchange.usage_prompt == 5 and exchange.per_event_usage
    record = exchange.record(0)
    assert record["output_tokens"] == 4 and record["ok"] and record["finish_reason"] == "length"


def test_role_only_and_empty_chunks_do_not_start_ttft():
    exchange, ended = _exchange()
    exchange.feed(_sse([_delta(role=True, content="")]), 2000)
    exchange.feed(_sse([_delta(content="")]), 3000)
    exchange.feed(_sse([_delta(content="  ")]), 4000)  # whitespace: a token, not visible
    exchange.feed(_sse([_delta(content="Hi", finish="stop"), "[DONE]"]), 5000)
    assert exchange.first_token_ns == 4000
    assert exchange.first_visible_ns == 5000
    assert exchange.arrival_ns == [4000, 5000] and exchange.arrival_tokens == [1, 1]
    assert exchange.tokens_from == "events" and ended


def test_reasoning_is_counted_apart():
    exchange, _ = _exchange()
    exchange.feed(_sse([_delta(reasoning="think")]), 2000)
    exchange.feed(_sse([_delta(reasoning="more")]), 3000)
    exchange.feed(_sse([_delta(content="Answer", finish="stop"), "[DONE]"]), 4000)
    record = exchange.record(0)
    assert record["first_token_ns"] == 2000 and record["first_visible_ns"] == 4000
    assert record["first_content_ns"] == 4000 and record["reasoning_tokens"] == 2 and record["output_tokens"] == 3


def test_usage_total_spreads_multi_token_events_by_text():
    exchange, _ = _exchange()
    exchange.feed(_sse([_text("a")]), 2000)
    exchange.feed(_sse([_text("bbbbbb")]), 3000)  # several tokens in one event, no per-event usage
    exchange.feed(_sse([_text("c", finish="length"), {"choices": [], "usage": {"completion_tokens": 8}}, "[DONE]"]),
                  4000)
    assert exchange.tokens_from == "usage"
    assert exchange.arrival_tokens == [1, 6, 1]


@pytest.mark.parametrize("last", [_text("", finish="stop"), _text("ee", finish="stop")])
def test_a_usage_total_on_the_last_choice_is_spread_by_text(last):
    # llama.cpp's /v1/completions puts its usage on the finish chunk (empty text, or the last token's):
    # a total, not that event's tokens, spread over the events by their text; an empty one is no arrival.
    exchange, _ = _exchange()
    for k, text in enumerate(["aa", "bb", "cc", "dd"]):
        exchange.feed(_sse([_text(text)]), 2000 + k)
    total = 8 + 2 * bool(last["choices"][0]["text"])
    last = {**last, "usage": {"prompt_tokens": 5, "completion_tokens": total}}
    exchange.feed(_sse([last, "[DONE]"]), 3000)
    assert exchange.error is None and exchange.tokens_from == "usage"
    assert exchange.arrival_tokens == [2] * (total // 2) and sum(exchange.arrival_tokens) == total


def test_without_usage_a_length_stop_has_the_tokens_asked_for():
    # No usage at all: an output stopped at max_tokens (4 here) has that many, spread by text, as
    # SGLang's bench_serving takes the requested length; one stopped otherwise counts its events.
    exchange, _ = _exchange()
    exchange.feed(_sse([_text("ab"), _text("cd", finish="length"), "[DONE]"]), 2000)
    assert exchange.tokens_from == "max_tokens" and exchange.arrival_tokens == [2, 2]
    exchange, _ = _exchange()
    exchange.feed(_sse([_text("ab"), _text("cd", finish="stop"), "[DONE]"]), 2000)
    assert exchange.tokens_from == "events" and exchange.arrival_tokens == [1, 1]


def test_allocate():
    assert allocate(3, [1, 1, 1], [1, 1, 1]) == [1, 1, 1]
    assert allocate(7, [1, 1], [1, 3]) == [2, 5]
    assert allocate(2, [1, 1, 1], [5, 5, 5]) == [1, 1, 0]
    assert allocate(0, [1, 1], [1, 1]) == [0, 0]


@pytest.mark.parametrize("events, reason", [
    ([_text("a"), "{broken"], MALFORMED),
    ([_text("a"), {"error": {"message": "boom"}}], SERVER_ERROR),
    ([{"object": "error", "message": "bad"}], SERVER_ERROR),
    (["[DONE]"], EMPTY),
    ([_text("a"), '{"choices": [5]}'], MALFORMED),
    (['[1, 2]'], MALFORMED),
])
def test_stream_failures(events, reason):
    exchange, ended = _exchange()
    exchange.feed(_sse(events), 2000)
    assert ended == [exchange] and exchange.error == reason


def test_comments_and_fields_are_skipped():
    exchange, _ = _exchange()
    exchange.feed(b": ping\n\nevent: message\nid: 3\ndata: " + orjson.dumps(_text("x", finish="stop"))
                  + b"\n\ndata: [DONE]\n\n", 5)
    assert exchange.error is None and exchange.arrival_tokens == [1] and exchange.events == 1


def test_body_end_without_finish_is_incomplete():
    exchange, _ = _exchange()
    exchange.feed(_sse([_text("x")]), 5)
    exchange.body_end(6)
    assert exchange.error == INCOMPLETE
    exchange, _ = _exchange()
    exchange.feed(b": keep-alive\n\n", 5)  # SSE, but nothing came before the end
    exchange.body_end(6)
    assert exchange.error == INCOMPLETE


def test_events_read_together_are_arrivals_of_their_own_at_one_time():
    exchange, _ = _exchange()
    exchange.feed(_sse([_text(" a"), _text(" b"), _text(" c d")]), 2000)
    exchange.feed(_sse([_text(" e", finish="length"), "[DONE]"]), 3000)
    assert exchange.arrival_ns == [2000, 2000, 2000, 3000]
    assert exchange.arrival_tokens == [1, 1, 1, 1] and exchange.error is None


@pytest.mark.parametrize("content_type, body, detail", [
    ("application/json", b'{"id": "c", "choices": [{"text": "Hello there", "finish_reason": "stop"}]}',
     'the server answered application/json, not an SSE stream (does it ignore "stream": true?): {"id": "c", "choices"'),
    ("application/problem+json; charset=utf-8", b'{"title": "nope"}',
     'not an SSE stream (does it ignore "stream": true?): {"title": "nope"}'),
    ("text/html", b"<html>\n<body>Welcome</body>\n</html>\n\n",
     "not an SSE stream (Content-Type: text/html): <html> <body>Welcome"),
    ("", b"plain words " * 20, "not an SSE stream (Content-Type: none): plain words plain words"),
])
def test_an_answer_that_is_not_sse_says_what_came(content_type, body, detail):
    exchange, ended = _exchange()
    exchange.head(200, content_type)
    for k in range(0, len(body), 7):
        exchange.feed(body[k:k + 7], 2000)
    exchange.body_end(3000)
    assert ended == [exchange] and exchange.error == MALFORMED
    assert detail in exchange.detail
    assert len(exchange.detail) < 300 and "\n" not in exchange.detail


def test_a_partial_event_grows_in_place_and_is_bounded():
    """A huge SSE line costs its size once (not a copy per piece), and past the limit fails its request."""
    import tracemalloc

    size = 8 * 2**20
    head, text, tail = (b'data: {"choices": [{"text": "', b"x" * size,
                        b'", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    pieces = [head, *(text[k:k + 2**16] for k in range(0, size, 2**16))]
    exchange, ended = _exchange()
    exchange.max_event_bytes = 2 * size
    tracemalloc.start()
    for piece in pieces:
        exchange.feed(piece, 2000)
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak_bytes < 1.5 * size  # appending to an immutable buffer would hold two copies: 2x
    exchange.feed(tail, 3000)
    assert ended == [exchange] and exchange.error is None and exchange.arrival_tokens == [1]
    assert exchange.arrival_chars == [size]

    exchange, ended = _exchange()
    exchange.max_event_bytes = 2**20
    for piece in pieces:
        exchange.feed(piece, 2000)
    assert ended == [exchange] and exchange.error == MALFORMED
    assert "event 0 is over 1048576 bytes (raise --max-event-bytes" in exchange.detail
    assert 'it starts: data: {"choices": [{"text": "xxx' in exchange.detail
    assert len(exchange._sse) == 0  # what it held is let go
    # An event over the limit that arrives whole in one piece fails the same way.
    exchange, ended = _exchange()
    exchange.max_event_bytes = 100
    exchange.feed(_sse([_text("y" * 200)]), 2000)
    assert exchange.error == MALFORMED and "over 100 bytes" in exchange.detail


def test_usage_counts_must_be_integers_not_booleans():
    exchange, _ = _exchange()
    exchange.feed(_sse([_text("a"), _text("b", finish="stop"),
                        {"choices": [], "usage": {"prompt_tokens": True, "completion_tokens": True}}, "[DONE]"]), 5)
    assert exchange.usage_completion is None and exchange.usage_prompt is None
    assert exchange.arrival_tokens == [1, 1]


# ---- HTTP parsing -------------------------------------------------------------------------------------
class _Transport:
    def __init__(self):
        self.written, self.closed = [], False

    def write(self, data):
        self.written.append(data)

    def close(self):
        self.closed = True


class _Pool:
    """The pool's side of a connection: the stamped-bytes inbox, parsed on flush."""

    def __init__(self):
        self.released, self.inbox = [], []

    def schedule_flush(self):
        pass

    def flush(self):
        items, self.inbox = self.inbox, []
        for connection, data, now in items:
            connection.process(data, now)

    def release(self, connection):
        self.released.append(connection)


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for size in sizes:
        piece = body[pos:pos + size]
        if not piece:
            break
        out.append(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        pos += len(piece)
    if pos < len(body):
        out.append(b"%x\r\n" % (len(body) - pos) + body[pos:] + b"\r\n")
    return b"".join(out) + b"0\r\n\r\n"


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 60), max_size=6), cuts=st.lists(st.integers(0, 2000), max_size=10),
       chunked=st.booleans())
def test_http_response_parsing_however_split(sizes, cuts, chunked):
    body = _sse(STREAM)
    if chunked:
        wire = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + _chunked(body, sizes))
    else:
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    pool = _Pool()
    connection = Connection(pool)
    connection.connection_made(_Transport())
    exchange, ended = _exchange()
    connection.send(exchange, b"request")
    bounds = sorted(set([0, *[c % (len(wire) + 1) for c in cuts], len(wire)]))
    for a, b in zip(bounds, bounds[1:]):
        connection.data_received(wire[a:b])
    assert not ended  # stamped, not parsed yet
    pool.flush()
    assert ended == [exchange] and exchange.error is None and sum(exchange.arrival_tokens) == 4
    assert pool.released == [connection]  # the whole body was read: the connection is reusable


def test_http_error_status_and_dropped_connection():
    pool = _Pool()
    connection = Connection(pool)
    connection.connection_made(_Transport())
    exchange, _ = _exchange()
    connection.send(exchange, b"r")
    body = b'{"error": {"message": "slow down"}}'
    connection.data_received(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    pool.flush()
    assert exchange.error == "http_429" and exchange.detail == "slow down"

    connection = Connection(_Pool())
    connection.connection_made(_Transport())
    exchange, _ = _exchange()
    connection.send(exchange, b"r")
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + _chunked(_sse([_text("a")]), [])[:-5])
    connection.connection_lost(None)
    assert exchange.error == DROPPED


def test_http_garbage_status_line():
    pool = _Pool()
    connection = Connection(pool)
    transport = _Transport()
    connection.connection_made(transport)
    exchange, _ = _exchange()
    connection.send(exchange, b"r")
    connection.data_received(b"SSH-2.0-OpenSSH\r\n\r\n")
    pool.flush()
    assert exchange.error == MALFORMED and transport.closed


# ---- the measured run ---------------------------------------------------------------------------------
def test_tokens_arrive_with_their_event():
    times = token_times(np.array([100, 200, 500]), np.array([2, 1, 3]))
    assert times.tolist() == [100, 100, 200, 500, 500, 500]
    assert token_times(np.array([], np.int64), np.array([], np.int64)).tolist() == []
    # ITL: one gap per event after the first (the 3-token event is one 300 ns gap, not three of 100).
    run = build_run([_row(0, arrivals=((100, 2), (200, 1), (500, 3)), end=500, visible=100)])
    assert run.itl_ns().tolist() == [100, 300]
    # Events read together share the read's time: each still an arrival (1 ns apart, as vLLM's client stamps each
    # message), and the summary says how many shared.
    rows = [_row(0, arrivals=((100, 1), (200, 1), (200, 1), (200, 2), (500, 1)), end=500, visible=100)]
    assert build_run(rows).itl_ns().tolist() == [100, 1, 1, 298]
    assert token_times(np.array([100, 200, 200, 200, 500]), np.array([1, 1, 1, 2, 1])).tolist() == [
        100, 200, 201, 202, 202, 500]
    header = {"scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 1}
    assert bench_summary(header, rows)["bench"]["arrivals"] == {"events": 5, "sharing_a_read": 2}


def _row(i, ok=True, sent=0, arrivals=((10, 1), (20, 1), (40, 2)), end=45, visible=20, **extra):
    row = {"i": i, "scheduled_ns": sent - 5, "sent_ns": sent, "input_tokens": 7, "ok": ok,
           "error": None if ok else "http_500", "detail": None if ok else "x",
           "first_token_ns": sent + arrivals[0][0] if arrivals else None,
           "first_visible_ns": None if visible is None else sent + visible, "first_content_ns": sent + 10,
           "end_ns": sent + end, "arrival_ns": [sent + a for a, _ in arrivals],
           "arrival_tokens": [k for _, k in arrivals],
           "tokens_from": "usage_per_event", "reasoning_tokens": 0, "prompt_tokens_server": 8, "output_tokens": 4}
    row.update(extra)
    return row


def test_a_measured_run_judges_each_requests_continuity_once(monkeypatch):
    """The summary and the per-request rows read the same stalls and QoE, judged once by build_run."""
    from tokenpath.report.requests import request_columns
    from tokenpath.sim import continuity

    judged = []
    per_request = continuity.per_request
    monkeypatch.setattr(continuity, "per_request", lambda *args: judged.append(args) or per_request(*args))
    rows = [_row(0), _row(1, ok=False, arrivals=()), _row(2, sent=100, visible=None)]
    header = {"scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 3}
    run = build_run(rows, header)
    summary = bench_summary(header, rows, run)
    columns = request_columns(run)
    assert len(judged) == 1
    expected = per_request(*judged[0])
    assert np.array_equal(run.qoe, expected["qoe"], equal_nan=True) and np.array_equal(run.stalls, expected["stalls"])
    assert columns["qoe"][[0, 2]].tolist() == expected["qoe"][[0, 2]].tolist() and np.isnan(columns["qoe"][1])
    assert summary["continuity"]["qoe"]["mean"] == pytest.approx(expected["qoe"][[0, 2]].mean())


def test_build_run_metrics():
    rows = [_row(0), _row(1, ok=False, arrivals=()), _row(2, sent=100, visible=None)]
    run = build_run(rows)
    assert run.failed.tolist() == [False, True, False]
    assert run.output_tokens.tolist() == [4, 0, 4]
    assert run.ttft_ns.tolist() == [10, 0, 10]
    assert run.ttfv_ns.tolist() == [20, 0, 45]  # nothing visible: the reply shows at its end
    assert run.e2e_ns.tolist() == [45, 0, 45]
    assert run.token_client_ns.tolist() == [10, 20, 40, 40, 110, 120, 140, 140]
    assert sorted(run.itl_ns().tolist()) == [10, 10, 20, 20]
    header = {"scenario": {"name": "s", "fingerprint": "f"}, "slo": {"ttft": 1.0, "tpot": None}, "planned": 4}
    summary = bench_summary(header, rows)
    assert summary["source"] == "bench" and summary["attribution_s"] is None
    assert summary["requests"] == {"completed": 2, "failed": 1, "input_tokens_mean": 7.0, "output_tokens_mean": 4.0,
                                  "warmup": 0}
    # TPOT to the last token's event (40 ns after the send), not the last byte (45): (40 - 10) / 3
    assert summary["latency_s"]["tpot"]["mean"] == pytest.approx(30 / 3 / 1e9)
    assert run.stream_ns().tolist() == [40, 0, 40]
    assert summary["window_s"] == pytest.approx(145 / 1e9)
    assert summary["bench"]["not_sent"] == 1 and summary["bench"]["failure_reasons"] == {"http_500": 1}
    assert summary["bench"]["client_wait_s"]["mean"] == pytest.approx(5e-9)


def test_the_bench_block_leaves_the_warm_up_out_as_the_metrics_do():
    # Request 0 is the warm-up: it waited 1 ms for its send, read one event more and counted its tokens
    # from events; the measured requests 1 and 2 waited 5 ns and read three events each.
    rows = [_row(0, sent=0, scheduled_ns=-1_000_000, arrivals=((10, 1), (20, 1), (30, 1), (40, 1)),
                 tokens_from="events", prompt_tokens_server=99), _row(1, sent=100), _row(2, sent=200)]
    header = {"scenario": {"name": "s", "fingerprint": "f", "table": {"workload": {"warmup_requests": 1}}},
              "slo": {}, "planned": 3}
    block = bench_summary(header, rows)["bench"]
    assert block["client_wait_s"]["mean"] == pytest.approx(5e-9)
    assert block["arrivals"]["events"] == 6
    assert block["output_tokens_from"] == {"usage_per_event": 2}
    assert block["server_prompt_tokens_mean"] == 8.0
    assert block["recorded"] == 3 and block["not_sent"] == 0  # every request is accounted for


def test_a_per_request_results_file_rebuilds_the_summarys_window_throughput_and_failures(tmp_path):
    """`report rows.csv` rebuilds window, throughput and failures as the summary has them: the window from
    the first measured send (request 1's, which failed) to the last byte, the failures after the warm-up
    (request 0's left out)."""
    from tokenpath.bench.results import warmup_rows
    from tokenpath.report.requests import request_columns, to_arrow, write_results
    from tokenpath.report.views import load_inputs

    rows = [_row(0, ok=False, arrivals=()), _row(1, ok=False, sent=100, arrivals=()), _row(2, sent=200),
            _row(3, sent=300, end=60)]
    header = {"scenario": {"name": "s", "fingerprint": "f", "table": {"workload": {"warmup_requests": 1}}},
              "slo": {}, "planned": 4}
    run = build_run(rows, header)
    summary = bench_summary(header, rows, run)
    path = tmp_path / "rows.csv"
    write_results(to_arrow(request_columns(run, warmup_rows(header, rows), np.arange(4))), str(path))
    rebuilt = load_inputs([str(path)]).runs[0].summary
    assert rebuilt["requests"]["failed"] == summary["requests"]["failed"] == 1
    assert rebuilt["requests"]["completed"] == summary["requests"]["completed"] == 2
    assert rebuilt["window_s"] == pytest.approx(summary["window_s"], rel=1e-9) == 260e-9  # 100 ns to 300 + 60
    for key in ("output_tokens_per_s", "requests_per_s"):
        assert rebuilt["throughput"][key] == pytest.approx(summary["throughput"][key], rel=1e-9), key


def test_results_file_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"schema": "tokenpath.bench/1", "scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 3}
    lines = [json.dumps(header), json.dumps(_row(1)), json.dumps(_row(0)), json.dumps(_row(2))[:40]]
    path.write_text("\n".join(lines))  # a crash mid-write: the last line has no newline
    warnings = []
    got_header, rows = read_results(path, warnings.append)
    assert got_header["planned"] == 3 and [r["i"] for r in rows] == [0, 1]
    assert warnings == [f"{path}:4: skipped a torn last line (the run was cut off while writing it)"]
    path.write_text("\n".join([lines[0], lines[3], lines[1]]) + "\n")
    with pytest.raises(UserError, match=":2: not a JSON line"):
        read_results(path)
    path.write_text("\n".join(lines) + "\n")  # a whole last line that is not JSON: damage, not a crash
    with pytest.raises(UserError, match=":4: not a JSON line"):
        read_results(path)
    path.write_text('{"schema": "other"}\n')
    with pytest.raises(UserError, match="not a tokenpath bench results file"):
        read_results(path)
    with pytest.raises(UserError, match="no such results file"):
        read_results(tmp_path / "none.jsonl")


@pytest.mark.parametrize("line, change, message", [
    (2, {"sent_ns": "soon"}, ":2: 'sent_ns' must be an integer (ns), got \"soon\""),
    (2, {"sent_ns": None}, ":2: 'sent_ns' must be an integer (ns), got null"),
    (3, {"arrival_tokens": [1, -1, 2]}, ":3: 'arrival_tokens' must be a list of counts"),
    (3, {"arrival_tokens": [1, 1]}, ":3: 'arrival_ns' has 3 entries but 'arrival_tokens' 2"),
    (3, {"ok": "yes"}, ":3: 'ok' must be true or false"),
    (2, {"i": 0}, ":3: request 0 is already on line 2"),
    (2, {"end_ns": 2**70}, ":2: 'end_ns' must be an integer (ns)"),
    (2, {"sent_ns": 11}, ":2: 'first_token_ns' = 10 is before 'sent_ns' = 11 (a token cannot arrive before"),
    (3, {"end_ns": 9}, ":3: 'end_ns' = 9 is before 'first_token_ns' = 10 (a request cannot end before"),
    (1, {"scenario": "typical"}, ":1: 'scenario' must be an object"),
    (1, {"slo": {"ttft": "fast"}}, ':1: slo "ttft" = "fast" is not an SLO'),
])
def test_a_damaged_results_line_is_a_one_line_error(tmp_path, line, change, message):
    header = {"schema": "tokenpath.bench/1", "scenario": {"name": "s", "fingerprint": "f"}, "slo": {}, "planned": 2}
    documents = [header, _row(1), _row(0)]
    documents[line - 1] = {**documents[line - 1], **change}
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in documents) + "\n")
    with pytest.raises(UserError) as error:
        read_results(path)
    line = str(error.value)
    assert line.startswith(f"{path}{message}") and "\n" not in line and len(line) < len(str(path)) + 200


_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats(allow_nan=False)
                       | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_damage_to_a_results_file_is_a_user_error_or_a_summary(tmp_path_factory, data):
    """Whatever is changed in a results file, `report` reads it or says which line is damaged."""

    from tokenpath.report.bench import describe_bench

    header = {"schema": "tokenpath.bench/1", "kind": "header", "planned": 3, "workers": 1,
              "scenario": {"name": "s", "fingerprint": "f", "table": {"workload": {"arrival": {"rate": 2.0}}}},
              "slo": {"ttft": 1.0, "tpot": None}}
    documents = [header, _row(0), _row(1, ok=False, arrivals=()), _row(2, sent=100),
                 {"client": {"cpu_s": 0.5, "wall_s": 2.0, "lag_us": [120, 0, 3400]}, "worker": 0}]
    target = data.draw(st.sampled_from(documents))
    for _ in range(data.draw(st.integers(1, 3))):
        keys = st.text(max_size=4) if not target else st.sampled_from(sorted(target)) | st.text(max_size=4)
        key = data.draw(keys)  # (every key may be gone already)
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = data.draw(_VALUES)
    try:
        text = b"\n".join(orjson.dumps(d) for d in documents) + b"\n"
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: not what a JSON writer would produce
        return
    if data.draw(st.booleans()):
        text = text[:data.draw(st.integers(0, len(text)))]
    path = tmp_path_factory.mktemp("r") / "r.jsonl"
    path.write_bytes(text)
    try:
        header, rows = read_results(path, lambda message: None)
        summary = bench_summary(header, rows)
        describe_bench(header, rows, str(path))
    except UserError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)
        return
    json.dumps(summary)  # the summary is plain JSON


@pytest.mark.parametrize("usage", [{"prompt_tokens": -5, "completion_tokens": 1},
                                   {"prompt_tokens": 99_999_999, "completion_tokens": 1},
                                   {"prompt_tokens": 1, "completion_tokens": 2**40},
                                   {"prompt_tokens": 1, "completion_tokens": -4}])
@pytest.mark.parametrize("per_event", [False, True])
def test_a_usage_count_out_of_range_fails_the_request_not_the_results_file(usage, per_event, tmp_path):
    # A server's usage that no request could have (negative, or more tokens than a results file holds)
    # was recorded as is, and `read_results` then refused the whole file as damaged: the run was lost.
    from tokenpath.bench.results import _check_row

    exchange, ended = _exchange()
    events = ([{**_text("a"), "usage": usage}] if per_event
              else [_text("a"), _text("b", finish="stop"), {"choices": [], "usage": usage}])
    exchange.feed(_sse([*events, "[DONE]"]), 2000)
    assert ended == [exchange] and exchange.error == MALFORMED and "usage." in exchange.detail
    _check_row(json.loads(json.dumps(exchange.record(0))), "bench.jsonl:2")  # the row reads back
