"""bench sends the shared prefixes a workload names: byte-identical text (and tokens) for the tokens a
shared segment covers, then each request's own text; the unique tag comes after the shared prefix.
Prompts travel over real HTTP on loopback and are read back as the server received them."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import run_cli
from serve_helpers import LoopbackServer
from test_bench_server import MODEL, FakeServer
from tokenpath import load_scenario
from tokenpath.bench import Target, run_bench, workload_requests
from tokenpath.prefixes import Prefixes
from tokenpath.serve import ServeOptions

# A vLLM KV block (vllm/config: block_size defaults to 16 tokens), the least a prefix cache reuses.
CACHE_BLOCK_TOKENS = 16
SMALL = {"workload.input": {"kind": "fixed", "value": 200}, "workload.output": {"kind": "fixed", "value": 4},
         "workload.arrival.rate": "inf"}


def _sent(scenario, tmp_path, unique=True):
    """The prompts as the server received them, and the planned requests."""
    with FakeServer() as server:
        result = run_bench(scenario, Target(server.url, MODEL), str(tmp_path / "results.jsonl"), workers=1,
                           unique_prompts=unique)
        prompts = list(server.prompts)
    assert result.summary["requests"]["completed"] == len(prompts)
    return prompts, workload_requests(scenario), result


@pytest.mark.parametrize("unique", [True, False])
def test_a_shared_prefix_is_sent_as_identical_text_then_the_prompts_differ(tmp_path, tekken, unique):
    scenario = load_scenario("typical", {**SMALL, "workload.num_requests": 2,
                                         "workload.shared_prefix": {"count": 1, "tokens": 1000, "fraction": 1.0}})
    (a, b), requests, result = _sent(scenario, tmp_path, unique)
    assert requests.prefixes.tokens.tolist() == [1000, 1000]
    ids_a, ids_b = tekken.encode(a), tekken.encode(b)
    assert len(ids_a) == len(ids_b) == 1200  # exact: 1,000 shared + 200 drawn
    shared = os.path.commonprefix([a, b])
    assert tekken.encode(shared)[:1000] == ids_a[:1000]  # the shared text covers the prefix's tokens...
    assert ids_a[:1000] == ids_b[:1000]                  # ...as the same tokens in both prompts
    assert len(tekken.encode(shared)) < 1000 + CACHE_BLOCK_TOKENS  # and they part within a block of its end
    assert a[len(shared):] != b[len(shared):]
    if unique:  # each request's tag comes right after the shared prefix
        tag = result.header["prompt_tag"]
        first, second = (a, b) if f" [{tag}0]" in a else (b, a)  # the server may receive them in either order
        at = first.index(f" [{tag}0]")
        assert second.index(f" [{tag}1]") == at and len(tekken.encode(first[:at])) == 1000
    else:
        assert result.header["prompt_tag"] is None and "-0]" not in a


def test_unique_prompts_share_no_cache_block(tmp_path, tekken):
    scenario = load_scenario("typical", {**SMALL, "workload.num_requests": 30})
    prompts, requests, result = _sent(scenario, tmp_path)
    heads = {tuple(tekken.encode(p)[:CACHE_BLOCK_TOKENS]) for p in prompts}
    assert len(heads) == len(prompts) == 30
    assert sorted(len(tekken.encode(p)) for p in prompts) == sorted(requests.input_tokens.tolist())
    assert result.header["unique_prompts"] is True and result.header["prompt_tag"]


def test_distinct_prefixes_differ_and_each_is_shared_by_its_requests(tmp_path, tekken):
    scenario = load_scenario("typical", {**SMALL, "workload.num_requests": 24,
                                         "workload.shared_prefix": {"count": 3, "tokens": 700, "fraction": 0.75}})
    prompts, requests, result = _sent(scenario, tmp_path)
    assert sorted(len(tekken.encode(p)) for p in prompts) == sorted(requests.input_tokens.tolist())
    by_head: dict[str, list[str]] = {}
    for prompt in prompts:
        ids = tekken.encode(prompt)
        by_head.setdefault(tekken.decode(ids[:CACHE_BLOCK_TOKENS]), []).append(prompt)
    carried = requests.prefixes.tokens > 0
    first = requests.prefixes.keys[requests.prefixes.offsets[:-1][carried]]
    # one group per distinct prefix, holding its requests; every request without one stands alone
    expected = sorted([int((first == key).sum()) for key in np.unique(first)] + [1] * int((~carried).sum()))
    assert sorted(len(group) for group in by_head.values()) == expected
    for group in by_head.values():
        if len(group) > 1:
            ids = [tekken.encode(p) for p in group]
            assert all(i[:700] == ids[0][:700] for i in ids)
    assert result.header["shared_prefix_requests"] == int(carried.sum())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prefixed_prompts_have_exact_lengths_and_shared_tokens(tekken, builder, data):
    """Random hash chains (trees of segments of any length): every prompt exact, every key's tokens
    the same in every prompt that carries it."""
    n = data.draw(st.integers(2, 6))
    levels = sorted(data.draw(st.sets(st.integers(1, 900), min_size=1, max_size=3)))  # segment ends, shared by all
    rows, covered = [], []
    for _ in range(n):
        cuts = levels[:data.draw(st.integers(0, len(levels)))]
        path = [data.draw(st.integers(0, 1)) for _ in cuts]  # two branches per level: many chains shared
        rows.append((tuple(zip(path, cuts)), cuts))
        covered.append(cuts[-1] if cuts else 0)
    keys, ends, counts, names = [], [], [], {}
    for chain_ids, cuts in rows:
        for depth in range(len(cuts)):
            keys.append(names.setdefault(chain_ids[:depth + 1], len(names)))
            ends.append(cuts[depth])
        counts.append(len(cuts))
    prefixes = Prefixes(np.array(keys, np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        np.array(covered, np.int64), ends=np.array(ends, np.int64))
    own = np.array([data.draw(st.integers(0 if c else 1, 300)) for c in covered])
    lengths = np.array(covered) + own
    unique = data.draw(st.booleans())
    prompts = builder.build_many(lengths, np.random.default_rng(0), "t-", prefixes, unique)
    encoded = [tekken.encode(p) for p in prompts]
    assert [len(ids) for ids in encoded] == lengths.tolist()
    seen: dict[int, list[int]] = {}
    for i in range(n):
        for key, end in zip(*prefixes.segments(i)):
            assert encoded[i][:end] == seen.setdefault(key, encoded[i][:end])


def test_a_shared_prefix_workload_against_serve(tmp_path):
    scenario = load_scenario("typical", {**SMALL, "workload.num_requests": 12, "workload.arrival.rate": 50.0,
                                         "delivery.network_rtt": 0,
                                         "workload.shared_prefix": {"count": 2, "tokens": 600, "fraction": 0.5}})
    with LoopbackServer(scenario, ServeOptions(network_delay=False)) as url:
        result = run_bench(scenario, Target(url, "m"), str(tmp_path / "results.jsonl"), workers=1)
    assert len(result.rows) == 12
    assert result.summary["requests"]["completed"] == 12 and result.summary["requests"]["failed"] == 0
    assert result.header["shared_prefix_requests"] == int((workload_requests(scenario).prefixes.tokens > 0).sum()) > 0


def test_a_start_that_would_merge_across_the_join_is_passed_over(builder, tekken):
    left = "The last line.\n"  # Tekken encodes a run of new lines as one token: "\n" + "\n..." merges
    assert not builder.joins_cleanly(left, "\nNext")
    newline_start = next(int(s) for s in builder._starts if builder._pieces[s].startswith("\n"))
    text = builder.build(50, newline_start, after=left)
    assert len(tekken.encode(text)) == 50
    assert tekken.encode(left + text) == tekken.encode(left) + tekken.encode(text)


def test_the_mooncake_trace_prompts_share_what_its_hash_ids_share(builder, tekken):
    from tokenpath.workload.traces import read_trace

    requests = read_trace("tests/data/mooncake_conversation_2000.jsonl", "mooncake").take(np.arange(12))
    prompts = builder.build_many(requests.input_tokens, np.random.default_rng(0), "t-", requests.prefixes)
    encoded = [tekken.encode(p) for p in prompts]
    assert [len(ids) for ids in encoded] == requests.input_tokens.tolist()
    seen: dict[int, tuple[str, list[int]]] = {}
    shared = 0
    for i, prompt in enumerate(prompts):
        for key, end in zip(*requests.prefixes.segments(i)):
            text, ids = seen.setdefault(key, (prompt, encoded[i][:end]))
            assert encoded[i][:end] == ids
            shared += text is not prompt
    assert shared > 5  # the trace's conversations repeat earlier blocks


def test_no_unique_prompts_from_the_command_line(monkeypatch, capsys, tmp_path):
    with FakeServer() as server:
        code, out, err = run_cli(["bench", "--base-url", server.url, "--model", MODEL, "--results",
                                  str(tmp_path / "r.jsonl"), "--num-requests", "5", "--input-len", "60",
                                  "--output-len", "3", "--request-rate", "inf", "--no-unique-prompts"],
                                 monkeypatch, capsys)
        prompts = list(server.prompts)
    assert code == 0, err
    assert len(prompts) == 5 and not any(p.startswith("[") for p in prompts)
    assert "untagged" in out
