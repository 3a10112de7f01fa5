"""serve's HTTP cost measurement (serve/measure.py): what it counts is what serve sends, as serve sends it."""

import asyncio

import orjson

from serve_helpers import dechunk
from tokenpath.delivery.request_measure import request_body
from tokenpath.serve.measure import EVENT_TEXTS, _events_s, events

BODY = request_body([{"role": "user", "content": "Hi"}])


def test_events_are_serve_completion_chunks_of_a_word_each():
    chunks = events(10)
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") for c in chunks)
    texts = [orjson.loads(c[len(b"data: "):])["choices"][0]["text"] for c in chunks]
    assert texts == [EVENT_TEXTS[k % len(EVENT_TEXTS)] for k in range(10)]


def test_each_stream_receives_every_event_the_measurement_counts():
    received = []
    spent_s = asyncio.run(_events_s(3, 4, BODY, received))
    assert len(received) == 3
    for stream in received:
        head, _, chunked = stream.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Type: text/event-stream" in head
        assert dechunk(chunked) == b"".join(events(4))  # each step's event, in order, then the end
    assert spent_s > 0
