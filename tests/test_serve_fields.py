"""serve's request fields: each one emulated, accepted as harmless, or refused with a 400 naming it;
bodies that do not parse are 400s, never 500s."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_serve import read_events, serve
from tokenpath.serve.app import MAX_JSON_DEPTH, decode_body
from tokenpath.serve.fields import parse_request
from tokenpath.serve.openai import ApiError, Ask

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
TEXT = {"model": "m", "prompt": "Hi", "max_tokens": 5}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]

# (endpoint, fields added to a valid request, the refused field or None for accepted)
CASES = [
    ("chat", {"tools": TOOLS}, "tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ("chat", {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
    ("completions", {"logprobs": 0}, "logprobs"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"suffix": "end"}, "suffix"),
    ("completions", {"best_of": 2}, "best_of"),
    ("chat", {"n": 2}, "n"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format"),
    ("chat", {"response_format": {"type": "yaml"}}, "response_format"),
    ("chat", {"guided_json": {"type": "object"}}, "guided_json"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"temperature": 3}, "temperature"),
    ("chat", {"top_p": "high"}, "top_p"),
    ("chat", {"stream": True, "stream_options": {"include_usage": "no"}}, "stream_options.include_usage"),
    ("chat", {"stream": True, "stream_options": {"include_usage": True, "extra": 1}}, "stream_options"),
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),  # only with stream, as OpenAI
    ("completions", {"prompt": ""}, "prompt"),                  # nothing to continue
    ("chat", {"frobnicate": 1}, "frobnicate"),
    ("chat", {"prompt": "Hi"}, "prompt"),                        # the other endpoint's field
    ("completions", {"max_completion_tokens": 9}, "max_completion_tokens"),
    ("completions", {"min_tokens": 9}, "min_tokens"),  # more than max_tokens
    ("completions", {"stop": ""}, "stop"),                      # a stop string is non-empty
    ("chat", {"logit_bias": {"a": 1}}, "logit_bias"),           # keys are token ids
    ("chat", {"logit_bias": {"5": 1000}}, "logit_bias"),        # biases run from -100 to 100
    ("chat", {"logit_bias": [5]}, "logit_bias"),
    ("chat", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ("chat", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": None}]},
     "messages[1].content"),
    ("chat", {"messages": [{"role": "assistant"}, {"role": "user", "content": "Hi"}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "tool", "tool_call_id": "c1"}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": "Hi", "frobnicate": 1}]}, "messages[0].frobnicate"),
    ("chat", {"messages": [{"role": "user", "content": "Hi", "tool_calls": []}]}, "messages[0].tool_calls"),
    # accepted: harmless, or asking for nothing the emulator cannot give
    ("chat", {"tools": TOOLS, "tool_choice": "none"}, None),
    ("chat", {"response_format": {"type": "text"}}, None),
    ("chat", {"logprobs": False, "top_logprobs": 0}, None),
    ("chat", {"temperature": 0.7, "top_p": 0.9, "presence_penalty": 1, "frequency_penalty": -1, "seed": 1,
              "user": "u", "logit_bias": {"50": -100}, "parallel_tool_calls": False, "n": 1}, None),
    ("completions", {"ignore_eos": True, "top_k": 20, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 2,
                     "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, None),
    ("completions", {"logprobs": None, "echo": False, "best_of": 1}, None),
    ("completions", {"stop": []}, None),
    ("completions", {"stream": None, "n": None}, None),        # null: the default, as OpenAI's schema has it
    ("chat", {"messages": [{"role": role, "content": "Hi"} for role in ("system", "developer", "user", "assistant",
                                                                        "tool", "function")]}, None),
    ("chat", {"messages": [{"role": "system", "content": "Be brief", "name": "s"},
                           {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "u"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                           {"role": "tool", "content": "42", "tool_call_id": "c1"},
                           {"role": "assistant", "content": "42.", "reasoning_content": "easy"},
                           {"role": "function", "content": None, "name": "f"},
                           {"role": "user", "content": ""}]}, None),
]


def test_each_field_is_refused_with_its_name_or_accepted():
    async def body(url, session):
        results = []
        for endpoint, fields, _ in CASES:
            request = {**(CHAT if endpoint == "chat" else TEXT), **fields}
            path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
            async with session.post(f"{url}{path}", json=request) as response:
                results.append((response.status, await response.read()))
        return results

    for (_endpoint, fields, refused), (status, reply) in zip(CASES, serve()(body)):
        if refused is None:
            assert status == 200, (fields, reply)
            continue
        error = json.loads(reply)["error"]
        assert status == 400, (fields, reply)
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["param"] == refused and refused.split(".")[0] in error["message"]
    unknown = json.loads(serve_reply_for({**CHAT, "frobnicate": 1}))["error"]["message"]
    assert unknown == "Unrecognized request argument supplied: frobnicate"  # OpenAI's words
    inside = {**CHAT, "messages": [{"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}]}
    assert json.loads(serve_reply_for(inside))["error"]["message"] == (
        "messages[0]: unrecognized key 'name' in a tool message; it has role, content, tool_call_id")
    missing = json.loads(serve_reply_for({**CHAT, "messages": [{"role": "user"}]}))["error"]["message"]
    assert missing == "messages[0].content is required in a user message: a string or a list of text parts"


def serve_reply_for(request):
    """One chat request's raw reply (a check of messages, cheap: no engine work for a 400)."""
    try:
        parse_request(request, "chat", lambda text: len(text.split()), 3)
    except ApiError as error:
        return json.dumps(error.body())
    raise AssertionError("accepted")


def test_json_mode_output_parses_streamed_or_not_and_carries_the_fingerprint():
    async def body(url, session):
        request = {**CHAT, "max_tokens": 60, "response_format": {"type": "json_object"}}
        async with session.post(f"{url}/v1/chat/completions", json=request) as response:
            whole = await response.json()
        async with session.post(f"{url}/v1/chat/completions", json={**request, "stream": True}) as response:
            events = await read_events(response)
        return whole, [json.loads(data) for _, data in events[:-1]]

    whole, chunks = serve()(body)
    assert isinstance(json.loads(whole["choices"][0]["message"]["content"]), dict)
    assert whole["usage"]["completion_tokens"] == 60
    # Closed within max_tokens, it ends by "stop" (the SDK's parse() refuses a "length" as cut short).
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert isinstance(json.loads(streamed), dict)
    assert whole["system_fingerprint"].startswith("fp_")
    assert {c["system_fingerprint"] for c in chunks} == {whole["system_fingerprint"]}


def test_chunks_carry_usage_null_until_the_last_and_a_running_count_when_asked():
    async def body(url, session):
        out = []
        for options in ({"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}, {}):
            request = {**TEXT, "max_tokens": 6, "stream": True, **({"stream_options": options} if options else {})}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                out.append([json.loads(data) for _, data in (await read_events(response))[:-1]])
        return out

    plain_usage, running, none = serve()(body)
    # include_usage: null on every chunk but the last, which has the total and no choices
    assert all("usage" in c and c["usage"] is None for c in plain_usage[:-1])
    assert plain_usage[-1]["choices"] == [] and plain_usage[-1]["usage"]["completion_tokens"] == 6
    # continuous_usage_stats (vLLM): each chunk counts the tokens so far, ending at 6
    counts = [c["usage"]["completion_tokens"] for c in running]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in (c["usage"] for c in running))
    # not asked: no usage key at all
    assert all("usage" not in c for c in none)


def test_the_same_seed_gives_the_same_text():
    async def body(url, session):
        texts = []
        for seed in (7, 7, 8):
            async with session.post(f"{url}/v1/completions", json={**TEXT, "max_tokens": 12, "seed": seed}) as response:
                texts.append((await response.json())["choices"][0]["text"])
        return texts

    first, again, other = serve()(body)
    assert first == again and first != other


@pytest.mark.parametrize("payload, fragment", [
    (b"[" * 100_000 + b"]" * 100_000, f"more than {MAX_JSON_DEPTH} deep"),
    (b'{"model": "m", "prompt": ' + b"[" * 200 + b"]" * 200 + b"}", f"more than {MAX_JSON_DEPTH} deep"),
    (b'{"model": "m", "prompt": "\xff\xfe"}', "not valid JSON"),
    (b'{"model": "m", "temperature": NaN}', "not valid JSON"),
    (b'{"model": "m", "prompt": "\\ud800"}', "not valid JSON"),
    (b"", "not valid JSON"),
])
def test_a_body_that_does_not_parse_is_a_400_with_the_reason(payload, fragment):
    with pytest.raises(ApiError) as refused:
        decode_body(payload)
    assert refused.value.status == 400 and fragment in refused.value.message


def test_a_parser_that_refuses_deep_nesting_itself_gives_the_same_400(monkeypatch):
    """orjson 3.9 and later stop at 1024 levels with their own message; the reply names the depth all the same."""
    import orjson

    import tokenpath.serve.app as app

    raw = b"[" * 2000 + b"]" * 2000

    def refuse_deep(text):
        raise orjson.JSONDecodeError("depth limit exceeded", text.decode(), 1025)

    monkeypatch.setattr(app.orjson, "loads", refuse_deep)
    with pytest.raises(ApiError) as refused:
        decode_body(raw)
    assert refused.value.status == 400
    assert refused.value.message == f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} deep"


def _nested(depth: int, inner: str) -> bytes:
    return ("[" * depth + json.dumps(inner) + "]" * depth).encode()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.text(alphabet='[]{}"\\ab', max_size=20))
def test_nesting_is_counted_outside_strings_only(depth, inner):
    from tokenpath.serve.app import _text_depth

    assert _text_depth(_nested(depth, inner)) == depth
    assert _text_depth(_nested(depth, inner)[:depth]) == depth  # cut short, as where a parser stopped


def test_a_body_nested_100000_deep_is_a_400_over_http():
    async def body(url, session):
        async with session.post(f"{url}/v1/completions", data=b"[" * 100_000 + b"]" * 100_000) as response:
            return response.status, await response.json()

    status, reply = serve()(body)
    assert status == 400 and "deep" in reply["error"]["message"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_a_400(raw):
    try:
        decode_body(raw)
    except ApiError as error:
        assert error.status == 400 and error.message


SCALARS = st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(SCALARS,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
KEYS = st.sampled_from(["model", "prompt", "messages", "max_tokens", "stream", "stream_options", "stop", "n", "tools",
                        "tool_choice", "logprobs", "top_logprobs", "response_format", "seed", "min_tokens", "echo",
                        "temperature", "top_k", "ignore_eos", "truncate_prompt_tokens", "suffix", "frobnicate"])


@settings(max_examples=200, deadline=None)
@given(endpoint=st.sampled_from(["chat", "completions"]), fields=st.dictionaries(KEYS, JSON, max_size=6))
def test_any_request_is_an_ask_or_a_400_naming_a_field(endpoint, fields):
    base = dict(CHAT if endpoint == "chat" else TEXT)
    try:
        ask = parse_request({**base, **fields}, endpoint, lambda text: len(text.encode()), 3)
    except ApiError as error:
        assert error.status == 400 and isinstance(error.param, str) and error.message
    else:
        assert isinstance(ask, Ask) and ask.prompt_tokens >= 0


def test_an_unset_max_tokens_fills_at_most_the_context_left_and_ends_by_length():
    # Llama 2's 4,096 tokens of context: a prompt of 4,050 leaves 46, fewer than the scenario's answer of
    # 150, so the answer stops there, as OpenAI's and vLLM's servers cap an unset max_tokens
    async def body(url, session):
        request = {"model": "m", "prompt": [7] * 4050}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            return response.status, await response.json()

    status, reply = serve(**{"model.name": "llama-2-7b", "workload.output": {"kind": "fixed", "value": 150}})(body)
    assert status == 200, reply
    assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 46


def test_ignore_eos_without_max_tokens_runs_to_the_context():
    # vLLM ignores the model's end of sequence: only a limit ends the answer, an unset max_tokens being the
    # context the prompt leaves (get_max_tokens), not the scenario's drawn answer of 10
    async def body(url, session):
        replies = []
        for extra in ({"ignore_eos": True}, {"ignore_eos": False}, {"ignore_eos": True, "max_tokens": 5}):
            request = {"model": "m", "prompt": [7] * 4000, **extra}
            async with session.post(f"{url}/v1/completions", json=request) as response:
                replies.append((response.status, await response.json()))
        return replies

    scenario = {"model.name": "llama-2-7b", "workload.output": {"kind": "fixed", "value": 10}}
    ignored, kept, limited = serve(**scenario)(body)
    assert ignored[0] == kept[0] == limited[0] == 200
    assert ignored[1]["choices"][0]["finish_reason"] == "length" and ignored[1]["usage"]["completion_tokens"] == 96
    assert kept[1]["choices"][0]["finish_reason"] == "stop" and kept[1]["usage"]["completion_tokens"] == 10
    assert limited[1]["choices"][0]["finish_reason"] == "length" and limited[1]["usage"]["completion_tokens"] == 5


def test_a_json_document_cut_short_ends_by_length_and_a_whole_one_by_stop():
    async def body(url, session):
        replies = []
        for tokens in (3, 60):  # too few tokens to close the document, and enough
            request = {**CHAT, "response_format": {"type": "json_object"}}
            request.pop("max_tokens")
            async with session.post(f"{url}/v1/chat/completions", json={**request, "min_tokens": tokens}) as response:
                replies.append((await response.json())["choices"][0])
        request = {**CHAT, "response_format": {"type": "json_object"}, "max_tokens": 3}  # cut by its max_tokens
        async with session.post(f"{url}/v1/chat/completions", json=request) as response:
            replies.append((await response.json())["choices"][0])
        return replies

    cut, whole, cut_by_max = serve(**{"workload.output": {"kind": "fixed", "value": 3}})(body)
    assert cut["finish_reason"] == "length" and cut_by_max["finish_reason"] == "length"
    assert whole["finish_reason"] == "stop" and isinstance(json.loads(whole["message"]["content"]), dict)


def test_serve_counts_a_chat_prompt_as_simulate_does():
    """A one-message chat: the text's tokens plus the chat template's, 3 for the default tokenizer
    (<s>[INST]...[/INST], what chat_template_tokens = "auto" adds), or the scenario's own count."""
    from tokenpath import load_scenario
    from tokenpath.delivery.chat_template import QUESTION, added_tokens
    from tokenpath.delivery.detokenizer import Detokenizer
    from tokenpath.serve.app import ServeOptions, Server

    detokenizer = Detokenizer.load(None)
    text = len(detokenizer.encode(QUESTION))
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": QUESTION}]}
    for template, expected in ((0, text + added_tokens()), (35, text + 35)):
        server = Server(load_scenario(overrides={"workload.chat_template_tokens": template}), ServeOptions())
        assert parse_request(body, "chat", server.count_tokens, server.template_tokens).prompt_tokens == expected
    assert added_tokens() == 3
    two_turns = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Soon."},
        {"role": "user", "content": QUESTION}]}
    answer = len(detokenizer.encode("Soon."))
    assert parse_request(two_turns, "chat", server.count_tokens, 35).prompt_tokens == 2 * (text + 35) + answer
