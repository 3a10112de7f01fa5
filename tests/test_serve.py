"""tokenpath serve over real HTTP on loopback: OpenAI shapes, simulated timing, refusals."""

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from tokenpath.scenario import load_scenario
from tokenpath.serve import ServeOptions, make_app

FAST = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "delivery.network_rtt": 0}


def serve(options=ServeOptions(), **overrides):
    """Run `body(base_url, session)` against a live server on a free loopback port."""

    def run(body):
        async def main():
            app = make_app(load_scenario("typical", {**FAST, **overrides}), options)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            try:
                async with aiohttp.ClientSession() as session:
                    return await body(f"http://127.0.0.1:{port}", session)
            finally:
                await runner.cleanup()

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
                                    {"engine.scheduler": "trtllm"}])
def test_other_scheduler_profiles_stream_every_token(engine):
    # Multi-step: the 20 tokens after the first leave in windows of 8, the last window ending early.
    async def body(url, session):
        request = {"model": "m", "prompt": "Once upon a time", "max_tokens": 21, "stream": True,
                   "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            return await read_events(response)

    chunks = [json.loads(data) for _, data in serve(**engine)(body)[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 21
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"

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


def test_tokens_never_arrive_before_the_simulated_engine_releases_them():
    # Alone on the engine, a 2,000-token prompt's first token cannot come before its prefill step.
    from tokenpath.pipeline import build_deployment

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
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": 3}]}', 400, "messages[0].content"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(path, payload, status, param):
    async def body(url, session):
        async with session.post(f"{url}{path}", data=payload) as response:
            bad = response.status, await response.json()
        async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "ok", "max_tokens": 3}) as response:
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
