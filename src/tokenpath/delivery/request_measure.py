"""Measure a serving front end's host cost of one chat request before the engine sees it.

Four pieces, each with the library a server uses (`RequestCost`):
- parse: orjson decodes a streaming chat-completions body and the engine's pydantic request validates
  it (engine_protocol.py, modelled on vLLM's; `tokenpath serve` checks requests its own way, in
  serve/openai.py and serve/fields.py, which this does not time);
- template: the chat template of a system + user conversation (chat_template.py); where the renderer
  also encodes the messages (mistral-common), that encoding's own time is taken out;
- tokenize: the slope of encoding time over prompts of PROMPT_TOKENS tokens of the mixed sample text,
  a least-squares line through the medians (the intercept is a call's fixed cost, left out);
- hand-off: the tokenized request (ids and sampling parameters) pickled, sent over a socket pair and
  unpickled at the other end, as an API server hands a request to its engine process (vLLM v0 pickles
  over ZeroMQ; v1 encodes with msgspec, not a dependency here).

Each figure is the median of `repeats` timings, each of enough calls to last MIN_REPEAT_S.
"""

from __future__ import annotations

import math
import pickle
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from tokenpath.delivery.calibration import RequestCost
from tokenpath.delivery.chat_template import renderer_for
from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.engine_protocol import ChatCompletionRequest, validate_request
from tokenpath.delivery.sample_text import MIXED

PROMPT_TOKENS = (128, 512, 2048, 8192)
HANDOFF_PROMPT_TOKENS = 1024
# A timing shorter than a few milliseconds is mostly timer and scheduler noise on a shared machine.
MIN_REPEAT_S = 0.003
MAX_TOKENS = 256


def median_s(call: Callable[[], object], repeats: int, min_repeat_s: float = MIN_REPEAT_S) -> float:
    """Median seconds of one `call`: `repeats` timings, each of as many calls as last `min_repeat_s`
    (the first call, untimed, warms caches and sizes the loop)."""
    start = time.perf_counter()
    call()
    once_s = time.perf_counter() - start
    number = max(1, math.ceil(min_repeat_s / max(once_s, 1e-9)))
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        timings.append((time.perf_counter() - start) / number)
    return statistics.median(timings)


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x through (x, y) points; needs two distinct x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        raise ValueError("a line needs points at two different x at least")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return mean_y - slope * mean_x, slope


def request_body(messages: list[dict[str, Any]], model: str = "tokenpath") -> bytes:
    """A streaming chat-completions body as clients send it."""
    return orjson.dumps({"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.7,
                         "top_p": 0.95, "stream": True, "stream_options": {"include_usage": True},
                         "stop": ["\n\nUser:"], "user": "calibration"})


def prompt_ids(det: Detokenizer, tokens: int) -> list[int]:
    """`tokens` ids of the mixed sample text, repeated as often as needed."""
    ids = det.encode(MIXED)
    return (ids * (tokens // len(ids) + 1))[:tokens]


def engine_request(request: ChatCompletionRequest, ids: list[int]) -> dict[str, Any]:
    """What an API server sends its engine: the prompt's ids and the sampling parameters."""
    sampling = {key: getattr(request, key) for key in (
        "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
        "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens",
        "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "logit_bias")}
    return {"request_id": request.request_id, "prompt_token_ids": ids, "mm_inputs": None, "sampling_params": sampling,
            "eos_token_id": 2, "arrival_time": time.time(), "lora_request": None, "cache_salt": None,
            "priority": request.priority}


def _receive(connection: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        got += connection.recv_into(view[got:])
    return bytes(buffer)


def hand_off(sender: socket.socket, receiver: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    """`request` pickled, framed with its length, sent, received and unpickled at the other end."""
    payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    sender.sendall(len(payload).to_bytes(4, "little") + payload)
    size = int.from_bytes(_receive(receiver, 4), "little")
    return pickle.loads(_receive(receiver, size))


def measure_request(det: Detokenizer, repeats: int = 5,
                    prompt_tokens: Sequence[int] = PROMPT_TOKENS) -> tuple[RequestCost, dict[str, Any]]:
    """The request path's costs on this machine, and how each was measured (for the file's [path])."""
    renderer, conversation = renderer_for(det.path, det.kind)
    body = request_body(conversation)
    parse_s = median_s(lambda: validate_request(body), repeats)

    template_s = median_s(lambda: renderer.apply(conversation), repeats)
    if renderer.encodes is not None:
        encode = renderer.encodes
        template_s -= median_s(lambda: [encode(m["content"]) for m in conversation], repeats)

    points = []
    for tokens in prompt_tokens:
        text = det.decode(prompt_ids(det, tokens))
        points.append((len(det.encode(text)), median_s(lambda text=text: det.encode(text), repeats)))
    _, per_token_s = fit_line(points)

    request = engine_request(validate_request(body), prompt_ids(det, HANDOFF_PROMPT_TOKENS))
    sender, receiver = socket.socketpair()
    with sender, receiver:
        handoff_s = median_s(lambda: hand_off(sender, receiver, request), repeats)

    cost = RequestCost(parse_s, max(0.0, template_s), max(0.0, per_token_s), handoff_s)
    how = {"parse": "orjson.loads + the engine's pydantic ChatCompletionRequest (modelled on vLLM's; not "
                    "tokenpath serve's own checks)",
           "template": renderer.name, "conversation_roles": [m["role"] for m in conversation],
           "tokenize_prompt_tokens": [x for x, _ in points], "tokenize_median_s": [y for _, y in points],
           "handoff": "pickle over a local socket pair, prompt ids + sampling parameters",
           "handoff_prompt_tokens": HANDOFF_PROMPT_TOKENS, "repeats": repeats, "statistic": "median"}
    return cost, how
