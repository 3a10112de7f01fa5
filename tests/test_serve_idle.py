"""tokenpath serve over real HTTP on loopback, under every engine profile: whatever mix of requests came
(finished, ended by a stop string or max_tokens, hung up mid-stream or before their first token, timed out,
refused), once idle the server holds nothing of them, and later requests run as on a fresh server."""

import asyncio
import dataclasses
import json
import random

import aiohttp
import pytest

from serve_state import SimulatedTimes, leftovers, settled
from test_serve import read_events
from tokenpath import load_scenario
from tokenpath.serve import ServeOptions, make_app
from tokenpath.serve import app as serve_app
from tokenpath.serve.app import start_server, stop_server

# A round trip of 4 ms: a request spends 2 ms on its way in, where a client can leave before it arrives.
FAST = {"model.name": "llama-3.1-8b", "deployment.chips": 1, "deployment.tp": 1, "delivery.network_rtt": 0.004,
        "engine.block_size": 4}
# A KV cache of 640 tokens, in blocks of 4, which a few of the mix's requests fill: requests are preempted, and
# the profiles that keep what a preempted request computed make their prefix cache.
CACHE_TOKENS = 640

# (vLLM V0 with chunked prefill forms vLLM V1's batches: tests/test_engine.py compares its aborts with the
# reference's)
PROFILES = {
    "vllm-v1": {},
    "vllm-v1, two replicas, no overlap or prefix caching": {"deployment.chips": 2, "engine.host_overlap": False,
                                                            "engine.prefix_caching": False},
    "vllm-v0, multi-step": {"engine.scheduler": "vllm-v0", "engine.chunked_prefill": False,
                            "engine.num_scheduler_steps": 4},
    "sglang": {"engine.scheduler": "prefill-first"},
    "sglang, multi-step": {"engine.scheduler": "prefill-first", "engine.num_scheduler_steps": 4},
    "sglang, mixed chunks, no overlap": {"engine.scheduler": "prefill-first", "engine.mixed_chunk": True,
                                         "engine.host_overlap": False},
    "trtllm": {"engine.scheduler": "trtllm"},
    "trtllm, on demand, no chunked prefill": {"engine.scheduler": "trtllm", "engine.kv_admission": "on_demand",
                                              "engine.chunked_prefill": False},
}

# Requests the server refuses with a 4xx JSON error: (endpoint, fields over a valid request, or a raw body).
BAD = [
    ("completions", {"n": 2}),
    ("chat", {"n": 3}),
    ("completions", {"best_of": 2}),
    ("completions", {"max_tokens": 10**6}),
    ("chat", {"min_tokens": 50, "max_tokens": 5}),
    ("completions", {"stop": ["a", "b", "c", "d", "e"]}),
    ("chat", {"max_tokens": "many"}),
    ("chat", b'{"model": "m", "messages": ['),
]
# Each request seen alone before the mix and again after it: a stream, a whole chat answer, a stream a stop
# string ends, and one whose client leaves after its first token (on a multi-step engine, inside the window
# that follows its prompt: the only sequence in it).
PROBES = [
    ("completions", {"prompt": "Once upon a time " * 20, "max_tokens": 9, "seed": 1, "stream": True}),
    ("chat", {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6, "seed": 2}),
    ("chat", {"messages": [{"role": "user", "content": "Go on"}], "max_tokens": 40, "seed": 3, "stop": ["."],
              "stream": True}),
    ("completions", {"prompt": "Tell me a story", "max_tokens": 40, "seed": 4, "stream": True, "hang_up": True}),
]


def _path(endpoint):
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _body(endpoint, rng, words=(1, 300)):
    words = " ".join(rng.choice(("time", "story", "the", "river", "and", "a")) for _ in range(rng.randint(*words)))
    if endpoint == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": words}]}
    return {"model": "m", "prompt": words}


async def _answer(response, endpoint, stream):
    """(text, finish_reason, completion tokens, response id) of a whole response."""
    if not stream:
        reply = await response.json()
        choice = reply["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        return text, choice["finish_reason"], reply["usage"]["completion_tokens"], reply["id"]
    chunks = [json.loads(data) for _, data in await read_events(response) if data != "[DONE]"]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    text = "".join(c["delta"].get("content") or "" if endpoint == "chat" else c["text"] for c in choices)
    return text, choices[-1]["finish_reason"], chunks[-1]["usage"]["completion_tokens"], chunks[0]["id"]


async def _probe(session, url, endpoint, fields):
    """(text, finish_reason, completion tokens, response id); hanging up, (its first event, the id)."""
    request = {"model": "m", **fields}
    hang_up = request.pop("hang_up", False)
    if request.get("stream"):
        request["stream_options"] = {"include_usage": True}
    async with session.post(url + _path(endpoint), json=request) as response:
        assert response.status == 200
        if hang_up:
            first = json.loads((await response.content.readuntil(b"\n\n"))[len(b"data: "):])
            return first["choices"][0]["text"], first["id"]
        return await _answer(response, endpoint, request.get("stream", False))


async def _one_of_the_mix(session, url, profile, k):
    """Request k of the mix, drawn from a stream of its own: returns what to check of its answer, or None (its
    client left). The first four run long, their prompts together nearly all the KV cache holds: growing, they
    preempt."""
    rng, long = random.Random(f"{profile} {k}"), k < 4
    await asyncio.sleep(rng.uniform(0, 0.005 if long else 0.04))
    kinds = ["whole", "stop", "hang up", "before its first token", "time out", "bad"]
    kind = rng.choice(["whole", "whole", "hang up"] if long else kinds)
    endpoint, stream = rng.choice(["chat", "completions"]), rng.random() < 0.6
    if kind == "bad":
        endpoint, fields = rng.choice(BAD)
        body = fields if isinstance(fields, bytes) else json.dumps({**_body(endpoint, rng), **fields}).encode()
        async with session.post(url + _path(endpoint), data=body,
                                headers={"Content-Type": "application/json"}) as response:
            error = (await response.json())["error"]
            return "bad", response.status, isinstance(error["message"], str) and error["message"] != ""
    request = {**_body(endpoint, rng, (145, 155) if long else (1, 300)), "seed": k, "stream": stream,
               "max_tokens": rng.randint(40, 56) if long else rng.randint(1, 24)}
    if stream:
        request["stream_options"] = {"include_usage": True}
    if kind == "stop":
        request["stop"] = rng.choice([["."], [" the"], ["e"]])
    timeout = None
    if kind == "time out" or (kind == "before its first token" and not stream):
        stream = request["stream"] = False
        request.pop("stream_options", None)
        timeout = aiohttp.ClientTimeout(total=rng.uniform(0.001, 0.02 if kind == "time out" else 0.004))
    try:
        async with session.post(url + _path(endpoint), json=request, timeout=timeout) as response:
            assert response.status == 200
            if kind == "before its first token":
                return None  # (leaving the block unread closes the connection)
            if kind == "hang up":
                if stream:
                    for _ in range(rng.randint(1, 12)):
                        await response.content.readuntil(b"\n\n")
                    return None
                kind = "whole"
            text, reason, tokens, _ = await _answer(response, endpoint, stream)
            return kind, reason, tokens, request["max_tokens"]
    except asyncio.TimeoutError:
        return None


@pytest.mark.parametrize("profile", PROFILES)
def test_an_idle_server_holds_nothing_of_the_requests_before_and_serves_later_ones_as_a_fresh_one(
        profile, monkeypatch):
    build = serve_app.build_deployment
    monkeypatch.setattr(serve_app, "build_deployment",
                        lambda scenario: dataclasses.replace(build(scenario), kv_capacity_tokens=CACHE_TOKENS))

    async def main():
        app = make_app(load_scenario("typical", {**FAST, **PROFILES[profile]}), ServeOptions())
        runner, listener = await start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.port}"
        try:
            times = SimulatedTimes(app)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

                async def settle():
                    for _ in range(1000):  # the server learns of the last hang-ups a few loop turns later
                        if settled(app):
                            return
                        await asyncio.sleep(0.005)

                async def probes():
                    answers = []
                    for endpoint, fields in PROBES:
                        await settle()
                        *answer, request_id = await _probe(session, url, endpoint, fields)
                        # (a client that hangs up: the time of its first token; how many more its engine made
                        # before it learned of it depends on the wall clock)
                        answers.append((*answer, times.by_id[request_id][:1 if fields.get("hang_up") else None]))
                    await settle()
                    return answers, leftovers(app)

                fresh, left_fresh = await probes()
                mix = await asyncio.gather(*(_one_of_the_mix(session, url, profile, k) for k in range(20)))
                await settle()
                left = leftovers(app)
                later, left_later = await probes()
                async with session.get(url + "/health") as response:
                    health = await response.text()
            return fresh, mix, (left_fresh, left, left_later), later, health
        finally:
            await stop_server(runner, listener)

    fresh, mix, left, later, health = asyncio.run(main())
    assert left == ([], [], [])  # after the probes on the fresh server, after the mix, after the probes again
    assert later == fresh  # the same text, ends and simulated times as on the fresh server
    assert [answer[1] for answer in fresh[:3]] == ["length", "length", "stop"]
    assert [answer[2] for answer in fresh[:2]] == [9, 6] and fresh[2][2] < 40
    assert len(fresh[3][1]) == 1  # (the hang-up's first token)
    for answer in filter(None, mix):
        if answer[0] == "bad":
            _, status, described = answer
            assert 400 <= status < 500 and described
        else:
            kind, reason, tokens, max_tokens = answer
            if kind == "whole" or reason == "length":
                assert (reason, tokens) == ("length", max_tokens)
            else:
                assert reason == "stop" and tokens <= max_tokens
    assert health == "ok"
