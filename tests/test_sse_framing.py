"""SSE chunks parse as OpenAI chat / completions chunks and carry exactly the streamed text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.delivery.sse import DONE, SseFramer


def events(blob: bytes) -> list[dict | str]:
    out = []
    for block in blob.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: ")
            payload = block[len(b"data: "):]
            out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def content(event: dict, api: str) -> str:
    choice = event["choices"][0]
    return choice["delta"].get("content", "") if api == "chat" else choice["text"]


@pytest.mark.parametrize("api", ["chat", "completions"])
@settings(max_examples=80, deadline=None)
@given(texts=st.lists(st.text(max_size=5), max_size=20), interval=st.integers(1, 4))
def test_events_carry_the_text_in_order_and_end_with_done(api, texts, interval):
    framer = SseFramer(1, api, interval)
    stream = framer.open(0, "req-1", "my-model", 1700000000)
    sent = []
    for text in texts:
        (chunk,) = framer.step([text], active=[True] if interval > 1 else None)
        sent.append(chunk)
        stream += chunk
    stream += framer.close(0, "length", tail="!")
    parsed = events(stream)
    assert parsed[-1] == "[DONE]"
    body = [e for e in parsed[:-1] if e["choices"] and e["choices"][0]["finish_reason"] is None]
    assert "".join(content(e, api) for e in body) == "".join(texts) + "!"
    final = parsed[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert all(e["id"] == "req-1" and e["model"] == "my-model" and e["created"] == 1700000000 for e in parsed[:-1])
    assert all(e["object"] == ("chat.completion.chunk" if api == "chat" else "text_completion") for e in parsed[:-1])
    if api == "chat":
        assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # The first token goes out at once, later ones in events of `interval` tokens; empty events are not sent.
    closes = [k == 0 or k % interval == 0 for k in range(len(texts))]
    for k, chunk in enumerate(sent):
        if chunk:
            assert closes[k]


def test_grouped_events_follow_the_delivery_model_rule():
    framer = SseFramer(1, "completions", 3)
    framer.open(0, "c", "m", 0)
    got = [events(framer.step([t])[0]) for t in "abcdefg"]
    texts = [content(e[0], "completions") if e else None for e in got]
    assert texts == ["a", None, None, "bcd", None, None, "efg"]


def test_a_batch_frames_each_stream_with_its_own_request():
    framer = SseFramer(2)
    framer.open(0, "a", "m", 0)
    framer.open(1, "b", "m", 0)
    first, second = framer.step(['he said "hi"\n', ""])
    assert second == b""
    (event,) = events(first)
    assert event["id"] == "a" and content(event, "chat") == 'he said "hi"\n'


def test_usage_is_sent_before_done():
    framer = SseFramer(1)
    framer.open(0, "a", "m", 0)
    parsed = events(framer.close(0, usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}))
    assert parsed[-2]["usage"]["total_tokens"] == 8 and parsed[-2]["choices"] == []
    assert framer.close(0).endswith(DONE)


def test_usage_is_null_until_the_end_or_a_running_count_and_the_fingerprint_is_on_every_chunk():
    framer = SseFramer(2, "completions", 3)
    framer.open(0, "a", "m", 0, fingerprint="fp_1", include_usage=True)
    framer.open(1, "b", "m", 0, fingerprint="fp_1", include_usage=True, running_usage_prompt_tokens=10)
    blobs = [b"", b""]
    for text in ["x", "y", "z", "w", "v"]:
        for i, event in enumerate(framer.step([text, text], active=[True, True])):
            blobs[i] += event
    total = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    for i in range(2):
        blobs[i] += framer.close(i, "length", usage=total)
    plain, running = (events(blob)[:-1] for blob in blobs)
    assert all(e["system_fingerprint"] == "fp_1" for e in plain + running)
    assert [e["usage"] for e in plain[:-1]] == [None] * (len(plain) - 1) and plain[-1]["usage"] == total
    # events after tokens 1, 4 and the close with 5: each counts the tokens so far
    counts = [e["usage"]["completion_tokens"] for e in running[:-1]]
    assert counts == [1, 4, 5, 5] and running[-1]["usage"] == total
    assert "".join(e["choices"][0]["text"] for e in running if e["choices"]) == "xyzwv"
