"""The OpenAI-compatible request side of `tokenpath serve`: what a request asks for, and errors in
the shape OpenAI clients expect ({"error": {"message", "type", "param", "code"}})."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tokenpath.config.errors import quoted

Endpoint = Literal["completions", "chat"]


class ApiError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Extras:
    """What the fields checked in fields.py ask for (the defaults: nothing)."""

    json_mode: bool = False             # response_format json_object: the output is a JSON document
    seed: int | None = None             # the same seed gives the same text and length
    min_tokens: int = 0
    ignore_eos: bool = False            # vLLM's: no end of sequence, so only a limit ends the answer
    truncate_prompt_tokens: int | None = None
    prompt_tokens_added: int = 0        # tool definitions in the prompt (sent with tool_choice "none")
    continuous_usage: bool = False      # stream_options.continuous_usage_stats: usage on every chunk


@dataclass(frozen=True)
class Ask:
    """One parsed completion request."""

    endpoint: Endpoint
    model: str
    prompt_tokens: int
    max_tokens: int | None      # None: as many as the scenario's output lengths draw
    stream: bool
    include_usage: bool
    stop: list[str] = field(default_factory=list)
    extras: Extras = Extras()


# OpenAI's API reference: `stop` takes "up to 4 sequences".
MAX_STOPS = 4
# A stop string's regular expression costs about 1 us per character to build (4 x 256 characters: 0.95
# ms), and the filter holds back len - 1 characters of the stream; 256 is far beyond any stop marker in use.
MAX_STOP_CHARS = 256
# Hugging Face model ids are at most 96 + 1 + 96 characters (namespace/name, huggingface_hub's
# REPO_ID_REGEX); the name is repeated in every chunk of the response, so it is bounded.
MAX_MODEL_CHARS = 256


def _unicode(text: str, where: str) -> str:
    """`text`, if it can be sent on as UTF-8 (a JSON escape such as \\ud800 decodes to a lone surrogate,
    which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, f"'{where}' holds a lone surrogate (\\u{ord(text[error.start]):04x}) at character "
                            f"{error.start}: send valid Unicode", where) from None
    return text


def _int(body: dict[str, Any], key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"'{key}' must be an integer >= {low}, got {value!r}", key)
    return value


def _text_parts(content: Any, where: str) -> str:
    """A chat message's text: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return _unicode(content, where)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: only text content parts are supported", where)
            texts.append(part["text"])
        return _unicode("".join(texts), where)
    if content is None:
        return ""
    raise ApiError(400, f"{where} must be a string or a list of text parts", where)


def _check_message(message: dict[str, Any], j: int) -> None:
    """A chat message has only its role's keys, and content unless it is an assistant's tool call (or a
    deprecated function message, whose content may be null), as OpenAI's schema has it."""
    role = message["role"]
    keys = MESSAGE_KEYS[role]
    for key in message:
        if key not in keys:
            raise ApiError(400, f"messages[{j}]: unrecognized key {quoted(_clip(key))} in a {role} message; it has "
                                f"{', '.join(keys)}", f"messages[{j}].{_clip(key)}")
    if message.get("content") is not None or role == "function" and "content" in message:
        return
    if role == "assistant":
        if message.get("tool_calls") is None and message.get("function_call") is None:
            raise ApiError(400, f"messages[{j}].content is required in an assistant message without tool_calls",
                           f"messages[{j}].content")
        return
    raise ApiError(400, f"messages[{j}].content is required in a {role} message: a string or a list of text parts",
                   f"messages[{j}].content")


def _clip(key: str) -> str:
    return key if len(key) <= 64 else key[:64] + "..."


# Token ids are int32 in inference engines (vLLM, TensorRT-LLM): anything outside 0..2^31-1 is no token.
MAX_TOKEN_ID = 2**31 - 1
# The roles of OpenAI's chat messages (platform.openai.com/docs/api-reference/chat/create; function:
# deprecated, still accepted there).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# The keys of each role's message there (vLLM's assistant messages add reasoning_content and reasoning,
# a reasoning model's thinking sent back in a later turn).
MESSAGE_KEYS = {"system": ("role", "content", "name"), "developer": ("role", "content", "name"),
                "user": ("role", "content", "name"),
                "assistant": ("role", "content", "name", "refusal", "tool_calls", "function_call", "audio",
                              "reasoning_content", "reasoning"),
                "tool": ("role", "content", "tool_call_id"), "function": ("role", "content", "name")}


def parse(body: Any, endpoint: Endpoint, count_tokens: Callable[[str], int], template_tokens: int) -> Ask:
    """Validate a request body; raises ApiError naming the offending field. A chat prompt is its messages'
    tokens and `template_tokens` for each user message (at least one), as simulate counts a session's
    turns (workload.chat_template_tokens)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: the name of a model from /v1/models", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise ApiError(400, f"'model' is {len(model)} characters long; a model name has at most {MAX_MODEL_CHARS}",
                       "model")
    _unicode(model, "model")
    if (n := _int(body, "n", 1)) not in (None, 1):
        raise ApiError(400, f"'n': one choice per request is emulated, got {n}; send n = 1 (or {n} requests)", "n")
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_tokens = count_tokens(_unicode(prompt, "prompt"))
            if not prompt_tokens:
                raise ApiError(400, "'prompt' is empty: give at least one token to continue", "prompt")
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            bad = next((t for t in prompt if not 0 <= t <= MAX_TOKEN_ID), None)
            if bad is not None:
                raise ApiError(400, f"'prompt' token ids must be whole numbers from 0 to {MAX_TOKEN_ID}, got "
                                    f"{quoted(bad)}", "prompt")
            prompt_tokens = len(prompt)
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content}", "messages")
        prompt_tokens = template_tokens * max(1, sum(isinstance(m, dict) and m.get("role") == "user"
                                                     for m in messages))
        for j, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise ApiError(400, f"messages[{j}] must be an object with a 'role'", f"messages[{j}]")
            if message["role"] not in ROLES:
                raise ApiError(400, f"messages[{j}].role: {quoted(message['role'])} is not a role; use one of "
                                    f"{', '.join(ROLES)}", f"messages[{j}].role")
            _check_message(message, j)
            prompt_tokens += count_tokens(
                _text_parts(message.get("content"), f"messages[{j}].content"))
    max_tokens = _int(body, "max_completion_tokens", 1) if endpoint == "chat" else None
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stream = False if body.get("stream") is None else body["stream"]  # (null: false, as OpenAI's default)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    if body.get("stream_options") is not None and not stream:
        raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options")
    stop = [] if body.get("stop") is None else body["stop"]
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them", "stop")
    for j, text in enumerate(stop):
        if len(text) > MAX_STOP_CHARS:
            raise ApiError(400, f"stop[{j}] is {len(text)} characters long; a stop string has at most "
                                f"{MAX_STOP_CHARS}", "stop")
        _unicode(text, "stop")
    return Ask(endpoint, model, prompt_tokens, max_tokens, stream, bool(options.get("include_usage")), stop)
