"""Which request fields `tokenpath serve` emulates, accepts as harmless, or refuses.

The emulator's text is a stretch of the shipped corpus, not a model's sample, so a field either:
- changes only which words a model would sample (temperature, penalties, top_k, logit_bias, ...):
  accepted, with OpenAI's type and range checks, since the text is arbitrary anyway;
- changes what the client receives in a way the emulator reproduces: `response_format` json_object
  (the output is a JSON document), `seed` (the same seed gives the same text), `min_tokens`, `ignore_eos`
  (without max_tokens, the answer runs to the context), `truncate_prompt_tokens`,
  `stream_options.continuous_usage_stats` (vLLM's running usage);
- or changes what the client parses in a way it cannot reproduce (tool calls, log probabilities,
  JSON matching a schema, several choices, echo): refused with a 400 naming the field, so a client
  fails at once with the reason instead of later on prose where it expected a tool call.

Unknown fields are refused as OpenAI refuses them ("Unrecognized request argument supplied"); vLLM's
extra fields (which `tokenpath bench` and vLLM clients send) are known.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import orjson

from tokenpath.serve.openai import ApiError, Ask, Endpoint, Extras, parse

Check = Callable[[str, Any], None]


def _refuse(key: str, why: str) -> ApiError:
    return ApiError(400, f"'{key}': {why}", key)


def _number(low: float, high: float) -> Check:
    def check(key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise _refuse(key, f"must be a number from {low:g} to {high:g}, got {_quote(value)}")
    return check


def _integer(low: int, high: int | None = None) -> Check:
    def check(key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"from {low} to {high}"
            raise _refuse(key, f"must be an integer {bound}, got {_quote(value)}")
    return check


def _kind(kind: type | tuple[type, ...], name: str) -> Check:
    def check(key: str, value: Any) -> None:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise _refuse(key, f"must be {name}, got {_quote(value)}")
    return check


def _logit_bias(key: str, value: Any) -> None:
    """OpenAI's form: token ids (as JSON keys, so strings of digits) mapped to a bias from -100 to 100."""
    if not isinstance(value, dict):
        raise _refuse(key, f"must be an object mapping token ids to biases, got {_quote(value)}")
    for token, bias in value.items():
        if not token.isdigit():
            raise _refuse(key, f"keys are token ids (whole numbers), got {_quote(token)}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise _refuse(key, f"token {token}'s bias must be a number from -100 to 100, got {_quote(bias)}")


def _integers(key: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _refuse(key, f"must be a list of token ids, got {_quote(value)}")


def _any(key: str, value: Any) -> None:
    pass


def _only(harmless: tuple[Any, ...], why: str) -> Check:
    """A field the emulator cannot reproduce: accepted only at a value that asks for nothing."""
    def check(key: str, value: Any) -> None:
        if not any(value is h or (type(value) is type(h) and value == h) for h in harmless):
            raise _refuse(key, why)
    return check


def _quote(value: Any, limit: int = 100) -> str:
    """A value as an error message quotes it: its repr, at most `limit` characters."""
    return _clip(repr(value), limit)


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


_BOOL = _kind(bool, "true or false")
_STRING = _kind(str, "a string")
_OBJECT = _kind(dict, "an object")
_NOT_EMULATED_TOOLS = ("tool calls are not emulated (the emulator streams corpus text, never a tool call); "
                       "send no tools, or tool_choice \"none\"")
_NOT_EMULATED_LOGPROBS = ("log probabilities are not emulated (the emulator samples from no distribution, so "
                          "any value would be invented); leave it unset")
_NOT_EMULATED_GUIDED = ("guided decoding is not emulated (the output would not follow it); "
                        "use response_format {\"type\": \"json_object\"} for JSON output, or leave it unset")

# Fields that change only which tokens a model would sample, or nothing a client sees. Ranges are
# OpenAI's (platform.openai.com/docs/api-reference/chat/create) and vLLM's SamplingParams checks.
_HARMLESS: dict[str, Check] = {
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "logit_bias": _logit_bias,
    "user": _STRING,
    "metadata": _OBJECT,
    "store": _BOOL,
    "service_tier": _STRING,
    "reasoning_effort": _STRING,
    "parallel_tool_calls": _BOOL,
    # vLLM's sampling and extra parameters (vllm/entrypoints/openai/protocol.py)
    "top_k": _integer(-1),
    "min_p": _number(0, 1),
    "repetition_penalty": _number(1e-9, math.inf),
    "length_penalty": _number(-math.inf, math.inf),
    "stop_token_ids": _integers,
    "bad_words": _kind(list, "a list of strings"),
    "allowed_token_ids": _integers,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "add_special_tokens": _BOOL,
    "add_generation_prompt": _BOOL,
    "chat_template": _STRING,
    "chat_template_kwargs": _OBJECT,
    "mm_processor_kwargs": _OBJECT,
    "priority": _integer(-2**63),
    "request_id": _STRING,
    "cache_salt": _STRING,
}

# Fields whose effect a client would see and the emulator cannot reproduce: refused unless they
# ask for nothing.
_REFUSED: dict[str, Check] = {
    "top_logprobs": _only((None, 0), _NOT_EMULATED_LOGPROBS),
    "prompt_logprobs": _only((None,), _NOT_EMULATED_LOGPROBS),
    "functions": _only((None, []), _NOT_EMULATED_TOOLS),
    "function_call": _only((None, "none"), _NOT_EMULATED_TOOLS),
    "best_of": _only((None, 1), "one choice per request is emulated; send best_of = 1"),
    "use_beam_search": _only((None, False), "beam search is not emulated; leave it unset"),
    "suffix": _only((None, ""), "insertion (suffix) is not emulated; leave it unset"),
    "include_stop_str_in_output": _only((None, False), "the emulator never includes the stop string; leave it unset"),
    "return_tokens_as_token_ids": _only((None, False), "token ids in place of text are not emulated; leave it unset"),
    "continue_final_message": _only((None, False), "continuing the last message is not emulated; leave it unset"),
    "audio": _only((None,), "audio output is not emulated; leave it unset"),
    "modalities": _only((None, ["text"]), "only text output is emulated; send [\"text\"] or leave it unset"),
    "prediction": _only((None,), "predicted outputs are not emulated; leave it unset"),
    "web_search_options": _only((None,), "web search is not emulated; leave it unset"),
    "documents": _only((None, []), "retrieval documents are not emulated; leave it unset"),
    "logits_processors": _only((None, []), "logits processors are not emulated; leave it unset"),
    "kv_transfer_params": _only((None,), "KV transfer is not emulated; leave it unset"),
    "guided_json": _only((None,), _NOT_EMULATED_GUIDED),
    "guided_regex": _only((None,), _NOT_EMULATED_GUIDED),
    "guided_choice": _only((None,), _NOT_EMULATED_GUIDED),
    "guided_grammar": _only((None,), _NOT_EMULATED_GUIDED),
    "structural_tag": _only((None,), _NOT_EMULATED_GUIDED),
    "guided_decoding_backend": _any,
    "guided_whitespace_pattern": _any,
}

# Fields `parse` reads itself (openai.py), and those read below.
_PARSED = {"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "stop", "messages",
           "prompt"}
_HERE = {"logprobs", "tools", "tool_choice", "response_format", "seed", "min_tokens", "truncate_prompt_tokens", "echo",
         "ignore_eos"}
# Fields of one endpoint only (OpenAI's two references; vLLM's ChatCompletionRequest and CompletionRequest):
# sent to the other, they would be ignored, so they are unknown there.
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
              "functions", "function_call", "metadata", "store", "service_tier", "modalities", "audio", "prediction",
              "reasoning_effort", "web_search_options", "add_generation_prompt", "continue_final_message",
              "documents", "chat_template", "chat_template_kwargs", "mm_processor_kwargs"}
_COMPLETIONS_ONLY = {"prompt", "best_of", "suffix"}
_ALL = _PARSED | _HERE | set(_HARMLESS) | set(_REFUSED)
_KNOWN = {"chat": _ALL - _COMPLETIONS_ONLY, "completions": _ALL - _CHAT_ONLY}
_STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}


def parse_request(body: Any, endpoint: Endpoint, count_tokens: Callable[[str], int], template_tokens: int) -> Ask:
    """A request body as an `Ask`: the fields `parse` reads (a chat's `template_tokens` a user message),
    then every other field checked here."""
    ask = parse(body, endpoint, count_tokens, template_tokens)
    extras = check_fields(body, endpoint, count_tokens)
    prompt_tokens = ask.prompt_tokens + extras.prompt_tokens_added
    if extras.truncate_prompt_tokens is not None:
        prompt_tokens = min(prompt_tokens, extras.truncate_prompt_tokens)
    return dataclasses.replace(ask, prompt_tokens=prompt_tokens, extras=extras)


def check_fields(body: dict[str, Any], endpoint: Endpoint, count_tokens: Callable[[str], int]) -> Extras:
    """Refuse unknown fields and fields that are not emulated; validate the harmless ones."""
    known = _KNOWN[endpoint]
    for key, value in body.items():
        if key not in known:
            raise ApiError(400, f"Unrecognized request argument supplied: {_clip(key)}", _clip(key))
        check = _HARMLESS.get(key) or _REFUSED.get(key)
        if check is not None and value is not None:
            check(key, value)
    if endpoint == "completions":
        _only((None,), _NOT_EMULATED_LOGPROBS)("logprobs", body.get("logprobs"))
        _only((None, False), "echoing the prompt is not emulated; leave it unset")("echo", body.get("echo"))
    else:
        _only((None, False), _NOT_EMULATED_LOGPROBS)("logprobs", body.get("logprobs"))
        _only((None, False), "echo is not emulated in chat; leave it unset")("echo", body.get("echo"))
    options = body.get("stream_options") or {}
    for key, value in options.items():
        if key not in _STREAM_OPTIONS:
            raise ApiError(400, f"Unrecognized request argument supplied: stream_options.{_clip(key)}",
                           "stream_options")
        if value is not None:
            _BOOL(f"stream_options.{key}", value)
    if body.get("ignore_eos") is not None:
        _BOOL("ignore_eos", body["ignore_eos"])
    seed, min_tokens, truncate = body.get("seed"), body.get("min_tokens"), body.get("truncate_prompt_tokens")
    for key, value, low in (("seed", seed, -2**63), ("min_tokens", min_tokens, 0),
                            ("truncate_prompt_tokens", truncate, 1)):
        if value is not None:
            _integer(low, 2**64 - 1)(key, value)
    return Extras(
        json_mode=_json_mode(body.get("response_format")),
        seed=seed,
        min_tokens=min_tokens or 0,
        ignore_eos=bool(body.get("ignore_eos")),
        truncate_prompt_tokens=truncate,
        prompt_tokens_added=_tools(body, count_tokens),
        continuous_usage=bool(options.get("continuous_usage_stats")),
    )


def _json_mode(response_format: Any) -> bool:
    if response_format is None:
        return False
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return False
    if kind == "json_object":
        return True
    if kind == "json_schema":
        raise _refuse("response_format", "json_schema output is not emulated (the output would not match the "
                                         "schema); use {\"type\": \"json_object\"} or {\"type\": \"text\"}")
    raise _refuse("response_format", "must be {\"type\": \"text\"} or {\"type\": \"json_object\"}, "
                                     f"got {_quote(response_format)}")


def _tools(body: dict[str, Any], count_tokens: Callable[[str], int]) -> int:
    """Tool definitions are refused unless tool_choice is "none"; then they only lengthen the prompt."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and choice != "none":
        raise _refuse("tool_choice", _NOT_EMULATED_TOOLS)
    if tools is None or tools == []:
        return 0
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise _refuse("tools", f"must be a list of tool objects, got {_quote(tools)}")
    if choice is None:
        raise _refuse("tools", _NOT_EMULATED_TOOLS)
    # A chat template writes the definitions into the prompt: count them as their JSON text.
    return count_tokens(orjson.dumps(tools).decode())
