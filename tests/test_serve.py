"""tokenpath serve over real HTTP on loopback: OpenAI shapes, simulated timing, refusals."""

import asyncio
import json
import random
import threading
import time
from types import SimpleNamespace

import aiohttp
import numpy as np
import pytest

from serve_state import leftovers, settled
from tokenpath import load_scenario
from tokenpath.delivery import Detokenizer
from tokenpath.engine.replica import Replica
from tokenpath.serve import ServeOptions, live, make_app
from tokenpath.serve.app import SERVER, Server, start_server, stop_server
from tokenpath.serve.live import LiveEngine
from tokenpath.serve.openai import Ask
from tokenpath.serve.output import OutputSlots, new_response

FAST = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "delivery.network_rtt": 0}


def serve(options=ServeOptions(), with_app=False, **overrides):
    """Run `body(base_url, session)` (with `with_app`: `body(base_url, session, app)`) against a live
    server on a free loopback port."""

    def run(body):
        async def main():
            app = make_app(load_scenario("typical", {**FAST, **overrides}), options)
            runner, listener = await start_server(app, "127.0.0.1", 0)
            try:
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                    return await body(f"http://127.0.0.1:{listener.port}", session, *((app,) if with_app else ()))
            finally:
                await stop_server(runner, listener)

        return asyncio.run(main())

    return run


async def read_events(response):
    """The SSE data payloads of a streamed response, with their arrival times."""
    events, buffer = [], b""
    async for piece in response.content.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            line, buffer = buffer.split(b"\n\n", 1)
            assert line.startswith(b"data: ")
            events.append((time.perf_counter(), line[6:].decode()))
    return events


def test_streamed_completion_has_the_openai_shape_and_exact_token_count():
    async def body(url, session):
        request = {"model": "anything", "prompt": "Once upon a time", "max_tokens": 24, "stream": True,
                   "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            return await read_events(response)

    events = serve()(body)
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 24
    assert usage["usage"]["prompt_tokens"] > 0
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert all(c["object"] == "text_completion" and c["model"] == "anything" for c in chunks[:-1])
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    assert len("".join(texts).split()) >= 5  # real words from the corpus



@pytest.mark.parametrize("engine", [{"engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 8},
                                    {"engine.scheduler": "prefill-first"}, {"engine.scheduler": "trtllm"}])
def test_other_scheduler_profiles_stream_every_token(engine):
    # Multi-step: the 20 tokens after the first leave in windows of 8, the last window ending early. SGLang's
    # overlapped loop runs a batch more for the finished request (Profile.runs_finished_batch), whose step
    # leaves no token: the last step's still leave.
    async def body(url, session):
        request = {"model": "m", "prompt": "Once upon a time", "max_tokens": 21, "stream": True,
                   "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            return await read_events(response)

    chunks = [json.loads(data) for _, data in serve(**engine)(body)[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 21
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"

def test_under_multi_step_a_stop_string_ends_the_count_at_the_token_that_completed_it():
    # vLLM V0's windows of 8 steps leave the server together: a response a stop string ended in a window's first
    # steps must take none of its later tokens. It took them, and a whole answer counted them (9 tokens for
    # " read it", the 3 a single-step engine and the stream count).
    request = {"model": "m", "prompt": "Tell me", "max_tokens": 60, "seed": 11, "stop": ["."]}

    async def body(url, session):
        answers = []
        for extra in ({"stream": False}, {"stream": True, "stream_options": {"include_usage": True}}):
            async with session.post(f"{url}/v1/completions", json={**request, **extra}) as response:
                if extra["stream"]:
                    chunks = [json.loads(data) for _, data in (await read_events(response))[:-1]]
                    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
                    answers.append(("".join(c["text"] for c in choices), choices[-1]["finish_reason"],
                                    chunks[-1]["usage"]["completion_tokens"]))
                else:
                    reply = await response.json()
                    answers.append((reply["choices"][0]["text"], reply["choices"][0]["finish_reason"],
                                    reply["usage"]["completion_tokens"]))
        return answers

    multi_step = {"engine.scheduler": "vllm-v0", "engine.chunked_prefill": False, "engine.num_scheduler_steps": 8}
    assert serve(**multi_step)(body) == serve()(body) == [(" read it", "stop", 3)] * 2


def test_chat_streams_a_role_first_and_never_leaks_a_stop_string():
    async def body(url, session):
        request = {"model": "m", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 400,
                   "stream": True, "stop": [" the"]}
        async with session.post(f"{url}/v1/chat/completions", json=request) as response:
            return await read_events(response)

    chunks = [json.loads(data) for _, data in serve()(body)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert " the" not in text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_text_a_stop_string_held_back_leaves_with_the_last_token():
    """A stream that no stop string ends carries one content event a token: the text the stop filter held
    back at the end (it could have begun "zq") goes out with the last token, not in an event of its own."""
    async def body(url, session):
        request = {"model": "m", "prompt": "Tell me a story", "max_tokens": 12, "seed": 1, "stop": ["zq"],
                   "stream": True, "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            streamed = [json.loads(data) for _, data in (await read_events(response))[:-1]]
        async with session.post(f"{url}/v1/completions", json={**request, "stream": False,
                                                                "stream_options": None}) as response:
            whole = await response.json()
        return streamed, whole

    streamed, whole = serve()(body)
    texts = [c["choices"][0]["text"] for c in streamed if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) == streamed[-1]["usage"]["completion_tokens"] == 12
    assert "".join(texts) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in streamed if c["choices"]][-1] == "length"


def test_a_stop_string_ends_no_text_before_min_tokens():
    # The same request with min_tokens = max_tokens: " the" in the first 60 tokens no longer ends it,
    # as vLLM searches for stop strings only past min_tokens.
    async def body(url, session):
        replies = []
        for extra in ({}, {"min_tokens": 60}):
            request = {"model": "m", "prompt": "Tell me a story", "max_tokens": 60, "stop": [" the"], "seed": 4,
                       **extra}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                replies.append(await response.json())
        return replies

    free, held = serve()(body)
    assert free["choices"][0]["finish_reason"] == "stop" and free["usage"]["completion_tokens"] < 60
    assert held["choices"][0]["finish_reason"] == "length" and held["usage"]["completion_tokens"] == 60
    assert held["choices"][0]["text"].startswith(free["choices"][0]["text"] + " the")


def test_tokens_never_arrive_before_the_simulated_engine_releases_them():
    # Alone on the engine, a 2,000-token prompt's first token cannot come before its prefill step.
    from tokenpath.sim.deployment import build_deployment

    deployment = build_deployment(load_scenario("typical", FAST))
    prefill_s = deployment.costs.compute_s(2000, 1, 2000 * 2001 / 2, 2000)
    decode_s = deployment.costs.compute_s(1, 1, 2001, 2001)

    async def body(url, session):
        request = {"model": "m", "prompt": [7] * 2000, "max_tokens": 30, "stream": True}
        sent = time.perf_counter()
        async with session.post(f"{url}/v1/completions", json=request) as response:
            events = await read_events(response)
        return sent, events

    sent, events = serve()(body)
    token_times = [t for t, data in events if data != "[DONE]"]
    assert token_times[0] - sent >= prefill_s
    assert token_times[-1] - sent >= prefill_s + 29 * decode_s


def test_non_streaming_chat_returns_the_message_and_usage():
    async def body(url, session):
        request = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 10}
        async with session.post(f"{url}/v1/chat/completions", json=request) as response:
            return response.status, await response.json()

    status, reply = serve()(body)
    assert status == 200
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] == 10


@pytest.mark.parametrize("path, payload, status, param", [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b'{"prompt": "x"}', 400, "model"),
    ("/v1/completions", b'{"model": "m", "prompt": 5}', 400, "prompt"),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 9999999}', 400, "max_tokens"),
    ("/v1/chat/completions", b'{"model": "m", "messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": 3}]}', 400,
     "messages[0].content"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(path, payload, status, param):
    async def body(url, session):
        async with session.post(f"{url}{path}", data=payload) as response:
            bad = response.status, await response.json()
        async with session.post(f"{url}/v1/completions",
                                json={"model": "m", "prompt": "ok", "max_tokens": 3}) as response:
            good = response.status, await response.json()
        return bad, good

    (bad_status, error), (good_status, reply) = serve()(body)
    assert bad_status == status
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["param"] == param and error["error"]["message"]
    assert good_status == 200 and reply["usage"]["completion_tokens"] == 3


def test_api_key_model_name_and_body_size_are_enforced():
    options = ServeOptions(api_key="sekret", served_model_name="mine")

    async def body(url, session):
        results = []
        ok = {"Authorization": "Bearer sekret"}
        for headers, model, size in ((None, "mine", 10), ({"Authorization": "Bearer nope"}, "mine", 10),
                                     (ok, "other", 10), (ok, "mine", 5 * 2**20), (ok, "mine", 10)):
            request = json.dumps({"model": model, "prompt": "x" * size, "max_tokens": 2}).encode()
            async with session.post(f"{url}/v1/completions", data=request, headers=headers) as response:
                results.append((response.status, (await response.json()).get("error", {}).get("code")))
        async with session.get(f"{url}/v1/models", headers=ok) as response:
            models = await response.json()
        return results, models

    results, models = serve(options)(body)
    assert results == [(401, "invalid_api_key"), (401, "invalid_api_key"), (404, "model_not_found"),
                       (413, None), (200, None)]
    assert [m["id"] for m in models["data"]] == ["mine"]


def test_concurrent_requests_all_complete_with_their_lengths():
    async def body(url, session):
        async def one(n):
            request = {"model": "m", "prompt": "word " * (50 + n), "max_tokens": 5 + n, "stream": True,
                       "stream_options": {"include_usage": True}}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                events = await read_events(response)
            return [json.loads(data) for _, data in events if data != "[DONE]"]

        return await asyncio.gather(*(one(n) for n in range(20)))

    for n, chunks in enumerate(serve()(body)):
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 5 + n
        choices = [c["choices"][0] for c in chunks[:-1]]
        # at most one event per token (tokens that show no text yet are merged forward), then the end
        assert sum(1 for c in choices if c["text"]) <= 5 + n
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length"]


def test_bad_fields_get_a_400_naming_them_while_other_streams_go_on():
    context = 131072  # llama-3.1-8b's
    # (path, body, param): text with a lone surrogate is not valid JSON text, refused as the body is read
    bad = [
        ("/v1/completions", b'{"model": "\\ud800", "prompt": "x"}', None),
        ("/v1/completions", json.dumps({"model": "m" * 257, "prompt": "x"}).encode(), "model"),
        ("/v1/completions", json.dumps({"model": "m", "prompt": "x", "stop": list("abcde")}).encode(), "stop"),
        ("/v1/completions", json.dumps({"model": "m", "prompt": "x", "stop": ["x" * 257]}).encode(), "stop"),
        ("/v1/completions", json.dumps({"model": "m", "prompt": "x", "stop": "." * 3_900_000}).encode(), "stop"),
        ("/v1/completions", b'{"model": "m", "prompt": "x", "stop": ["ok", "\\udfff"]}', None),
        ("/v1/completions", b'{"model": "m", "prompt": "a\\ud800b"}', None),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', None),
        ("/v1/completions", json.dumps({"model": "m", "prompt": [7] * context}).encode(), "prompt"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "word " * context}]}).encode(), "messages"),
    ]

    async def body(url, session):
        async def stream():
            request = {"model": "m", "prompt": "Once upon a time", "max_tokens": 40, "stream": True,
                       "stream_options": {"include_usage": True}}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                events = await read_events(response)
            return json.loads(events[-2][1])["usage"]["completion_tokens"]

        async def refused(path, payload):
            async with session.post(f"{url}{path}", data=payload) as response:
                return response.status, (await response.json())["error"]

        streams = [asyncio.create_task(stream()) for _ in range(8)]
        await asyncio.sleep(0.05)  # the streams are under way
        errors = [await refused(path, payload) for path, payload, _ in bad]
        return errors, await asyncio.gather(*streams)

    errors, streamed = serve()(body)
    assert [(status, error["param"]) for status, error in errors] == [(400, param) for *_, param in bad]
    assert "surrogate" in errors[0][1]["message"] and "at most 256" in errors[1][1]["message"]
    assert errors[-1][1]["code"] == errors[-2][1]["code"] == "context_length_exceeded"
    assert streamed == [40] * 8


@pytest.mark.parametrize(("admission", "prompt", "max_tokens", "param"),
                         [("reserve", 9000, 5, "prompt"), ("on_demand", 9000, 5, "prompt"),
                          ("on_demand", 8000, 500, "max_tokens")])
def test_without_chunked_prefill_a_request_no_step_holds_is_refused_and_the_others_served(admission, prompt,
                                                                                          max_tokens, param):
    # Without chunked prefill a prompt runs whole in one step of max_num_batched_tokens (8,192), and where
    # the KV cache is taken as requests grow, so does a preempted request's recompute, prompt and output.
    # TensorRT-LLM refuses a longer prompt (llmapi/llm.py, _check_arguments) and vLLM a longer request;
    # queued, it would never run, nor would any request behind it.
    async def body(url, session):
        async def ask(tokens, max_tokens):
            request = {"model": "m", "prompt": [7] * tokens, "max_tokens": max_tokens}
            async with session.post(f"{url}/v1/completions", json=request,
                                    timeout=aiohttp.ClientTimeout(total=30)) as response:
                return response.status, await response.json()

        return await ask(prompt, max_tokens), await ask(10, 5)

    (status, refused), (served_status, served) = serve(**{
        "engine.scheduler": "trtllm", "engine.kv_admission": admission, "engine.chunked_prefill": False,
        "engine.max_num_batched_tokens": 8192})(body)
    assert (status, refused["error"]["param"], refused["error"]["code"]) == (400, param, "context_length_exceeded")
    assert "8192" in refused["error"]["message"]
    assert served_status == 200 and served["usage"]["completion_tokens"] == 5


def test_without_chunked_prefill_sglang_serves_a_prompt_longer_than_the_budget():
    async def body(url, session):
        request = {"model": "m", "prompt": [7] * 9000, "max_tokens": 5}
        async with session.post(f"{url}/v1/completions", json=request,
                                timeout=aiohttp.ClientTimeout(total=30)) as response:
            return response.status, await response.json()

    status, reply = serve(**{"engine.scheduler": "prefill-first", "engine.chunked_prefill": False,
                             "engine.max_num_batched_tokens": 8192})(body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 5


def test_a_request_the_kv_caches_whole_blocks_cannot_hold_is_a_400_naming_the_context():
    # At a fifth of the memory Llama-3.1-8B's KV cache holds 123,090 tokens, 1,923 whole blocks of 64: a
    # request of 123,073 tokens (every token's KV but the last's) fits, one of 123,090 never would.
    async def body(url, session, app):
        server = app[SERVER]
        held = server.deployment.kv_capacity_tokens
        replies = []
        for prompt in (held - 10, 10):
            request = {"model": "m", "prompt": [7] * prompt, "max_tokens": 10}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                replies.append((response.status, await response.json()))
        return held, server.context_tokens, replies

    held, context, ((status, refused), (served, _)) = serve(
        with_app=True, **{"engine.gpu_memory_utilization": 0.2})(body)
    assert (held, context) == (123_090, 1_923 * 64 + 1)
    assert (status, refused["error"]["code"], served) == (400, "context_length_exceeded", 200)
    assert f"holds {context} tokens of context" in refused["error"]["message"]


def test_a_large_body_is_tokenized_off_the_event_loop(monkeypatch):
    threads = []

    async def body(url, session, app):
        server = app[SERVER]
        count = server.count_tokens
        monkeypatch.setattr(server, "count_tokens", lambda text: threads.append(threading.get_ident()) or count(text))
        for size in (100, 5_000):  # 500 bytes, then 25 kB (above INLINE_PARSE_BYTES)
            request = {"model": "m", "prompt": "word " * size, "max_tokens": 2}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                assert response.status == 200
        return threading.get_ident()

    loop_thread = serve(with_app=True)(body)
    assert threads[0] == loop_thread != threads[1]



def test_releases_keep_step_order_when_their_timers_fire_out_of_order():
    # Each step's tokens are released by a timer set from a clock read; a stall between reading the
    # clock and setting the timer (a GC pause, a busy machine) made a later step's timer fire first,
    # ending a request before its last token was counted (the flaky completion_tokens 2 of 3).
    async def body(url, session, app):
        rng = random.Random(0)  # a third of the engine's clock reads come 20 ms late
        app[SERVER].engines[0].clock_ns = lambda: time.perf_counter_ns() - (20_000_000 if rng.random() < 1 / 3 else 0)
        counts = []
        for _ in range(8):
            async with session.post(f"{url}/v1/completions",
                                    json={"model": "m", "prompt": "ok", "max_tokens": 3}) as response:
                counts.append((await response.json())["usage"]["completion_tokens"])
        return counts

    assert serve(with_app=True)(body) == [3] * 8


def test_a_steps_release_timer_releases_that_step_and_not_the_one_formed_since(monkeypatch):
    # When a step's tokens leave after the next step has started (here 1 ms after its end), the next
    # step is formed before the first one's timer fires; that timer must not release it early.
    from tokenpath.delivery.lastmile import LastMile
    from tokenpath.sim.deployment import build_deployment

    scenario = load_scenario("typical", FAST)
    timers = []
    on_step = LastMile.on_step

    def late(self, gpu_end_ns, emitted, events):
        blocking_ns, leave_ns, wait_ns, work_ns = on_step(self, gpu_end_ns, emitted, events)
        return blocking_ns, leave_ns + 1_000_000, wait_ns, work_ns

    monkeypatch.setattr(LastMile, "on_step", late)

    class Stop(Exception):
        pass

    class Loop:  # records each step's release timer instead of running it
        def call_later(self, delay_s, callback, due):
            timers.append(lambda: callback(due))

    async def sleep(delay_s):
        if len(timers) == 2:
            raise Stop  # two steps taken, neither timer fired

    monkeypatch.setattr(live, "asyncio", SimpleNamespace(Event=asyncio.Event, get_running_loop=Loop, sleep=sleep))
    engine = LiveEngine(scenario, build_deployment(scenario), Detokenizer.load(None), clock_ns=lambda: 0)
    engine.replica.submit(20, 5, 0, 0)
    with pytest.raises(Stop):
        asyncio.run(engine.run())
    (first, first_leave_ns, *_), (second, second_leave_ns, *_) = engine.unreleased
    assert (first, second) == (0, 1) and first_leave_ns < second_leave_ns
    timers[0]()  # step 0's tokens leave
    assert [step for step, *_ in engine.unreleased] == [1]
    timers[1]()
    assert not engine.unreleased


def test_an_idle_engine_forms_no_batch_before_its_next_arrival_so_a_request_that_arrives_first_runs_first(
        monkeypatch):
    # A request 300 ms on its way (a large body), then 5 ms later one with no way to go: the second reaches the
    # engine first and, the engine idle, runs at once. The engine stepped as soon as the first was submitted,
    # forming its batch at that request's arrival, ahead of the wall clock: the second ran after it (it waited
    # 300 ms less the 5, and the first's step).
    from tokenpath.sim.deployment import build_deployment

    monkeypatch.setattr(live, "Replica", lambda *args, **kwargs: Replica(*args, **{**kwargs, "keep_rows": True}))
    scenario = load_scenario("typical", FAST)

    async def main():
        engine = LiveEngine(scenario, build_deployment(scenario), Detokenizer.load(None))
        task = asyncio.create_task(engine.run())
        ids = np.arange(100, 105)
        late, early = (new_response(Ask("completions", "m", prompt, 5, False, False), ids) for prompt in (40, 30))
        engine.submit(late, 300_000_000)
        await asyncio.sleep(0.005)
        engine.submit(early, 0)
        for response in (late, early):
            while await response.queue.get() is not None:
                pass
        task.cancel()
        return engine.replica

    replica = asyncio.run(main())
    steps, (late_ns, early_ns) = replica.rows.steps(), list(replica.requests.arrival)
    assert early_ns < late_ns
    assert steps["start_ns"][0] == early_ns and steps["tokens"][0] == 30  # (was: late_ns, 40)
    assert late_ns in steps["start_ns"].tolist()  # the first reached an idle engine too, and ran at once


def test_requests_ended_early_leave_the_engine_at_once_and_later_requests_run_as_on_an_idle_server(monkeypatch):
    # 64 requests for 2,000 tokens ended by a stop string, and 64 whose clients leave: mid-stream,
    # before their first token, or a non-streaming client timing out.
    aborts = []  # (handle, tokens released, engine step, by a stop string) when the server learned of the end
    abort_in_engine = LiveEngine.abort

    def abort(engine, response):
        if response.handle in engine.responses:
            aborts.append((response.handle, response.tokens, engine.replica.num_steps, response.ended))
        abort_in_engine(engine, response)

    monkeypatch.setattr(LiveEngine, "abort", abort)
    # the server drops its step rows as it goes; this test reads them back to see where each request stopped
    monkeypatch.setattr(live, "Replica", lambda *args, **kwargs: Replica(*args, **{**kwargs, "keep_rows": True}))
    alone = {"model": "m", "prompt": [7] * 200, "max_tokens": 20, "stream": True}
    long = {"model": "m", "prompt": "Tell me a story.", "max_tokens": 2000, "stream": True}

    async def body(url, session, app):
        async def post(request, events=None, timeout=None):
            """The chunks of a whole response, or None: hung up after `events` events, or timed out."""
            try:
                async with session.post(f"{url}/v1/completions", json=request,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                    assert response.status == 200
                    if events is None:
                        return [json.loads(data) for _, data in await read_events(response) if data != "[DONE]"]
                    async for line in response.content:
                        events -= line.startswith(b"data: ")
                        if events <= 0:
                            return None
            except asyncio.TimeoutError:
                return None

        engine = app[SERVER].engines[0]
        first = await post(alone)
        await asyncio.gather(
            *(post({**long, "stop": ["."]}) for _ in range(64)),
            *(post(long, events=3) for _ in range(48)),
            *(post({**long, "prompt": [7] * 4000}, events=0) for _ in range(8)),
            *(post({**long, "stream": False}, timeout=0.3) for _ in range(8)))
        for _ in range(3000):  # the server learns of the last hang-ups a few loop turns later
            if not engine.responses:
                break
            await asyncio.sleep(0.01)
        replica = engine.replica
        left = replica.idle, replica.free_blocks == replica.cache_blocks
        second = await post(alone)
        return first, second, left, engine

    first, second, left, engine = serve(with_app=True)(body)
    # every one was aborted, but a non-streaming request whose client timed out before it reached
    # the engine (a busy machine) has nothing to abort
    assert 120 <= len(aborts) <= 128 and sum(by_stop for *_, by_stop in aborts) == 64
    assert left == (True, True)  # nothing running, queued or holding KV blocks once they had ended
    assert engine.responses == {} and not engine.unreleased  # nothing kept per dropped stream
    assert all(len(bank.free) == bank.ids.size for bank in engine.output.banks)
    replica = engine.replica
    steps, spans, silent = replica.rows.steps(), replica.rows.spans(), replica.rows.silent_rows.array()
    for handle, tokens, step, by_stop in aborts:
        last_steps = (spans[:, 1] + spans[:, 2] - 1)[spans[:, 0] == handle]
        assert (last_steps < step).all() and (silent[silent[:, 0] == handle, 1] < step).all()
        # a stop string is seen before the next step starts; a client can leave while a step is running
        assert replica.generated[handle] - tokens <= (0 if by_stop else 1)

    def token_steps(handle):
        return np.concatenate([np.arange(f, f + c) for _, f, c in spans[spans[:, 0] == handle]])

    # the later request runs alone, exactly as the first did on the idle server: the same simulated TPOT
    a, b = token_steps(0), token_steps(len(replica.prompt) - 1)
    assert len(a) == len(b) == 20 and (steps["seqs"][b] == 1).all()
    assert np.diff(steps["leave_ns"][a]).mean() == np.diff(steps["leave_ns"][b]).mean()
    assert len(first) == len(second) and first[-1]["choices"][0]["finish_reason"] == "length"


def test_a_response_streams_in_context_after_its_prompt_tail():
    # SentencePiece: the output "Hello world" after a prompt streams " Hello world", as the engine's
    # detokenizer primed with the prompt shows it; without a prompt, the dummy prefix's space is dropped.
    detokenizer = Detokenizer.load("mistral_instruct_tokenizer_240323.model.v3")
    prompt, ids = detokenizer.encode("[INST] Say hi [/INST]"), np.array(detokenizer.encode("Hello world"))
    slots = OutputSlots(detokenizer, 1)
    ask = Ask("completions", "m", len(prompt), len(ids), False, False)
    primed, alone = new_response(ask, ids, context_ids=prompt[-5:]), new_response(ask, ids)
    for _ in ids:
        slots.step([primed, alone])
    for response in (primed, alone):
        slots.finish(response)
    texts = []
    for response in (primed, alone):
        items = []
        while (item := response.queue.get_nowait()) is not None:
            items.append(item)
        texts.append("".join(items))
    assert texts == [" Hello world", "Hello world"]
    assert detokenizer.decode(prompt + ids.tolist()) == detokenizer.decode(prompt) + texts[0]


def test_the_server_s_output_follows_the_corpus_tokens_before_it():
    server = Server(load_scenario("typical"), ServeOptions(tokenizer="tokenizer.model.v1"))
    ask = Ask("completions", "m", 3, 8, True, False)
    ids, context, cut = server.token_ids(ask, 8, np.random.default_rng(0))
    corpus = server.corpus_ids
    start = int(np.random.default_rng(0).integers(0, len(corpus)))
    assert ids.tolist() == np.take(corpus, np.arange(start, start + 8), mode="wrap").tolist() and not cut
    assert context.tolist() == np.take(corpus, np.arange(start - 5, start), mode="wrap").tolist()


def test_one_requests_failing_output_ends_only_that_request_with_an_error():
    # A name that cannot be encoded reached the framer once (now refused at the edge): it raised in
    # the step's release, so its stream never ended and the next stream lost its token.
    detokenizer = Detokenizer.load()
    slots = OutputSlots(detokenizer, 1)
    ids = np.array(detokenizer.encode("The quick brown fox jumps over the lazy dog again and again"))
    asks = [Ask("completions", model, 3, len(ids), True, False) for model in ("a", "\ud800", "c")]
    responses = [new_response(ask, ids) for ask in asks]
    ended = slots.step(responses)
    for _ in range(len(ids) - 1):
        assert slots.step([responses[0], responses[2]]) == []
    for response in responses[::2]:
        slots.finish(response)
    assert ended == [responses[1]] and responses[1].finish_reason == "error"

    def drained(response):
        items = []
        while not response.queue.empty():
            items.append(response.queue.get_nowait())
        return items

    bad = drained(responses[1])
    assert bad[-1] is None and json.loads(bad[0].split(b"\n\n")[0][6:])["error"]["type"] == "server_error"
    assert bad[0].endswith(b"data: [DONE]\n\n")
    for response in responses[::2]:
        events = drained(response)
        text = "".join(json.loads(e.split(b"\n\n")[0][6:])["choices"][0]["text"] for e in events[:-1])
        assert response.tokens == len(ids) and text == detokenizer.decode(ids) and events[-1] is None
    assert all(len(bank.free) == bank.ids.size for bank in slots.banks)  # every slot came back


@pytest.mark.parametrize("scheduler", ["vllm-v1", "prefill-first"])
def test_under_attention_data_parallel_requests_ended_early_leave_their_ranks_and_every_count_comes_back(scheduler):
    # A MoE model over two attention ranks: 8 requests end by a stop string, 8 clients hang up mid-stream,
    # 8 run to the end. Once all are done each rank holds nothing: no request, no running count, no tokens.
    long = {"model": "m", "prompt": "Tell me a story.", "max_tokens": 400, "stream": True}

    async def body(url, session, app):
        async def post(request, events=None):
            async with session.post(f"{url}/v1/completions", json=request) as response:
                assert response.status == 200
                count = 0
                async for line in response.content:
                    count += line.startswith(b"data: ")
                    if events is not None and count >= events:
                        return count
                return count

        engine = app[SERVER].engines[0]
        counts = await asyncio.gather(*(post({**long, "stop": ["."]}) for _ in range(8)),
                                      *(post(long, events=3) for _ in range(8)),
                                      *(post({**long, "max_tokens": 30}) for _ in range(8)))
        for _ in range(3000):  # the server learns of the last hang-ups a few loop turns later
            if settled(app):
                break
            await asyncio.sleep(0.01)
        replica = engine.replica
        ranks = replica.waiting
        return counts, leftovers(app), ranks.rank_of, ranks.running, ranks.tokens, sorted(set(replica.generated[16:]))

    counts, left, rank_of, running, tokens, generated = serve(
        with_app=True, **{"model.name": "qwen3-30b-a3b", "deployment.chips": 2, "deployment.tp": 2,
                          "deployment.attention_dp": True, "engine.scheduler": scheduler})(body)
    assert left == []  # (tests/serve_state.py: no request, KV block, slot, count, ...)
    assert rank_of == {} and running == [0, 0] and tokens == [0, 0]
    assert generated == [30] and all(count >= 3 for count in counts[8:])  # (a stop string can end one sooner)


def test_a_method_not_allowed_names_the_allowed_ones():
    """A 405 carries Allow (RFC 9110, 15.5.6), with the OpenAI-style JSON body."""
    async def body(url, session):
        async with session.put(f"{url}/v1/completions", json={}) as response:
            return response.status, response.headers.get("Allow"), await response.json()

    status, allow, error = serve()(body)
    assert status == 405 and "POST" in allow.split(",")
    assert error["error"]["message"] == "Method Not Allowed"
