"""`[workload] chat_template_tokens`: the tokens a chat endpoint's template adds to every prompt, which
the engine prefills and the client does not count."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.config.errors import UserError
from tokenpath.sim.scenario import build_scenario, load_scenario
from tokenpath.sim.simulate import simulate
from tokenpath.workload import WorkloadSpec, generate
from tokenpath.workload.spec import MAX_TOKENS

PROMPT, ANSWER, REQUESTS = 300, 5, 6


def _scenario(template: int | str, **workload):
    """Llama 3.1 8B on one H100, a few fixed-length requests far apart (each alone in the engine)."""
    table = {"model": {"name": "llama-3.1-8b"},
             "deployment": {"chip": "h100", "chips": 1, "tp": 1},
             "workload": {"num_requests": REQUESTS, "chat_template_tokens": template,
                          "input": {"kind": "fixed", "value": PROMPT}, "output": {"kind": "fixed", "value": ANSWER},
                          "arrival": {"rate": 1.0, "pattern": "constant"}, **workload}}
    return build_scenario(table, "test")


def test_a_count_adds_exactly_that_many_prefill_tokens_and_the_client_counts_none():
    plain, chat = simulate(_scenario(0)), simulate(_scenario(7))
    processed = [sum(int(t.step_tokens.sum()) for t in sim.traces) for sim in (plain, chat)]
    assert processed[0] == REQUESTS * (PROMPT + ANSWER - 1)  # the prompt, then one decode step per later token
    assert processed[1] - processed[0] == REQUESTS * 7
    assert chat.requests.input_tokens.tolist() == [PROMPT + 7] * REQUESTS
    assert chat.run.input_tokens.tolist() == plain.run.input_tokens.tolist() == [PROMPT] * REQUESTS
    assert chat.summary["requests"]["input_tokens_mean"] == PROMPT
    assert chat.summary["resolved"]["workload"]["chat_template_tokens"] == 7
    assert (chat.run.ttft_ns > plain.run.ttft_ns).all()  # more to prefill


def test_template_tokens_follow_a_shared_prefix_and_accumulate_over_a_sessions_turns():
    def both(**workload):
        return [generate(WorkloadSpec(**workload, chat_template_tokens=k), np.random.default_rng(3)) for k in (0, 5)]

    plain, chat = both(num_requests=40, shared_prefix={"count": 2, "tokens": 64, "fraction": 0.5})
    assert (chat.input_tokens - plain.input_tokens == 5).all() and chat.prefixes == plain.prefixes
    assert (chat.client_input_tokens == plain.input_tokens).all()
    plain, chat = both(num_requests=30, sessions={"turns": 4, "think_time": 1.0})
    turn = chat.sessions.turn
    assert turn.max() == 3
    assert (chat.input_tokens - plain.input_tokens == 5 * (turn + 1)).all()  # every message of the history has one
    assert (chat.client_input_tokens == plain.input_tokens).all()
    # The prefix keys follow the prompts the engine sees: a turn's cached history (the turn before, its answer
    # less the last token) leaves exactly its new message and that message's template tokens to prefill.
    later = np.flatnonzero(turn > 0)
    message = plain.input_tokens[later] - plain.input_tokens[later - 1] - plain.output_tokens[later - 1]
    assert (chat.input_tokens[later] - (chat.prefixes.tokens[later - 1] + 1) == message + 5).all()
    assert chat.take(later).template_tokens.tolist() == (5 * (turn[later] + 1)).tolist()


def test_auto_is_what_mistral_commons_chat_encoding_adds_for_the_default_tokenizer():
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    from tokenpath.delivery.chat_template import QUESTION
    from tokenpath.delivery.detokenizer import DEFAULT_TOKENIZER, resolve

    tokenizer = MistralTokenizer.from_file(str(resolve(DEFAULT_TOKENIZER)))
    rendered = tokenizer.encode_chat_completion(ChatCompletionRequest(messages=[UserMessage(content=QUESTION)]))
    text = tokenizer.instruct_tokenizer.tokenizer.encode(QUESTION, bos=False, eos=False)
    expected = len(rendered.tokens) - len(text)
    scenario = _scenario("auto")
    assert scenario.chat_template_tokens() == expected == 3  # <s>[INST] ... [/INST]
    assert scenario.resolved_workload().chat_template_tokens == expected
    assert scenario.resolved_workload(chat_template=False).chat_template_tokens == 0
    assert simulate(scenario).requests.input_tokens.tolist() == [PROMPT + expected] * REQUESTS


def test_a_huggingface_tokenizers_own_template_is_counted(tmp_path):
    """A tokenizer.json with Llama 3's special tokens and template beside it: the count is what its rendering
    adds, special tokens encoded as such (as transformers' apply_chat_template tokenizes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tokenpath.delivery.chat_template import LLAMA3_SPECIAL_TOKENS, LLAMA3_TEMPLATE, QUESTION, added_tokens, render

    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([QUESTION, "user assistant system"] * 20, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials,
        show_progress=False))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3_TEMPLATE,
                                                                "bos_token": "<|begin_of_text|>"}))
    rendered = render(LLAMA3_TEMPLATE, [{"role": "user", "content": QUESTION}], **LLAMA3_SPECIAL_TOKENS)
    expected = (len(tokenizer.encode(rendered, add_special_tokens=False).ids)
                - len(tokenizer.encode(QUESTION, add_special_tokens=False).ids))
    ids = tokenizer.encode(rendered, add_special_tokens=False).ids
    assert sum(tokenizer.id_to_token(i) in specials for i in ids) == 6  # each a single token
    assert added_tokens(tmp_path / "tokenizer.json") == expected


@pytest.mark.parametrize("value", [-1, "lots", True, 2.5, MAX_TOKENS // 2 + 1, "Auto"])
def test_a_bad_count_is_one_line_naming_the_key(value):
    with pytest.raises(UserError) as error:
        load_scenario(overrides={"workload.chat_template_tokens": value})
    message = str(error.value)
    assert "\n" not in message and "workload.chat_template_tokens" in message and '"auto"' in message


@given(st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=12), st.floats(allow_nan=False)))
@settings(max_examples=60, deadline=None)
def test_only_whole_counts_in_range_or_auto_are_taken(value):
    good = value == "auto" or (type(value) is int and 0 <= value <= MAX_TOKENS // 2)
    try:
        spec = WorkloadSpec(chat_template_tokens=value)
    except ValueError:
        assert not good
    else:
        assert good and spec.chat_template_tokens == value


def test_a_trace_already_holds_the_servers_counts(tmp_path):
    with pytest.raises(UserError, match="workload: a trace's token counts are the server's own"):
        _scenario(10, trace={"path": str(tmp_path / "t.csv"), "format": "azure"})


def test_bench_sends_the_clients_prompts_and_the_fit_adds_the_template_where_the_server_did_not_count(tmp_path):
    from tokenpath.bench import workload_requests
    from tokenpath.bench.results import RESULTS_SCHEMA
    from tokenpath.calibrate.probe import measured_from_results

    assert workload_requests(_scenario("auto")) == workload_requests(_scenario(0))
    assert workload_requests(_scenario(9)).input_tokens.tolist() == [PROMPT] * REQUESTS

    def results(endpoint: str, server: int | None) -> str:
        path = tmp_path / f"{endpoint}-{server}.jsonl"
        header = {"schema": RESULTS_SCHEMA, "kind": "header", "scenario": {"name": "s", "fingerprint": "f"},
                  "endpoint": endpoint, "planned": 1}
        row = {"i": 0, "scheduled_ns": 0, "sent_ns": 0, "input_tokens": PROMPT, "ok": True, "first_token_ns": 10,
               "end_ns": 40, "arrival_ns": [10, 20, 40], "arrival_tokens": [1, 1, 1], "tokens_from": "usage",
               "prompt_tokens_server": server}
        path.write_bytes(orjson.dumps(header) + b"\n" + orjson.dumps(row) + b"\n")
        return str(path)

    prompt = lambda endpoint, server: measured_from_results(  # noqa: E731
        results(endpoint, server), chat_template_tokens=9).requests.input_tokens.tolist()
    assert prompt("chat", None) == [PROMPT + 9]           # the client's count, plus what the server's template added
    assert prompt("chat", PROMPT + 3) == [PROMPT + 3]      # the server's own count is what it computed
    assert prompt("completions", None) == [PROMPT]         # no template on a completions endpoint
