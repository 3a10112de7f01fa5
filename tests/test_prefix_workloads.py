"""Shared prefixes end to end: a replayed Mooncake trace, a shared system prompt, and routing."""

import json
from pathlib import Path

import numpy as np
import pytest

from test_engine import NO_NETWORK, FixedCosts
from tokenpath import load_scenario, simulate
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.loop import run_engine
from tokenpath.engine.spec import EngineSpec
from tokenpath.sim.document import result_document
from tokenpath.workload.traces import read_trace

MOONCAKE = Path(__file__).parent / "data" / "mooncake_conversation_2000.jsonl"
BLOCK = 16


def implied_hit_tokens(rows):
    """Per request, in time order: the longest run of its hash_ids that prefixes an earlier request's,
    in tokens (512 per id, the last one ending at the prompt's end), whole 16-token blocks only, and
    never the block of the prompt's last token (it is always computed)."""
    seen, hits = set(), []
    for row in rows:
        ids, prompt = row["hash_ids"], row["input_length"]
        matched = 0
        while matched < len(ids) and tuple(ids[:matched + 1]) in seen:
            matched += 1
        while matched and min(matched * 512, prompt) // BLOCK > (prompt - 1) // BLOCK:
            matched -= 1
        hits.append(min(matched * 512, prompt) // BLOCK * BLOCK)
        seen.update(tuple(ids[:k + 1]) for k in range(len(ids)))
    return np.array(hits)


def test_replaying_the_mooncake_trace_with_a_large_cache_finds_the_prefixes_its_hash_ids_imply():
    rows = sorted((json.loads(line) for line in MOONCAKE.read_text().splitlines()), key=lambda r: r["timestamp"])
    requests = read_trace(MOONCAKE, "mooncake")
    n = len(requests)
    # One request at a time, one output token each: every earlier prompt is cached when a request comes.
    trace = run_engine(np.zeros(n, np.int64), requests.input_tokens, np.ones(n, np.int64), FixedCosts(),
                       LastMile(NO_NETWORK), EngineSpec(block_size=BLOCK), 10**9, max_concurrency=1,
                       prefixes=requests.prefixes)
    expected = implied_hit_tokens(rows)
    assert np.array_equal(trace.prefix_hit_tokens, expected)
    rate = trace.prefix_hit_tokens.sum() / requests.input_tokens.sum()
    assert 0.29 < rate < 0.30  # this first sixth of the trace; the whole trace implies 0.374 (docs/prefix-caching.md)


def _system_prompt_run(caching, model="llama-3.1-70b"):
    scenario = load_scenario("typical", {
        "model.name": model, "workload.num_requests": 30, "workload.warmup_requests": 1,
        "workload.arrival": {"rate": 1.0, "pattern": "constant"},
        "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 8},
        "workload.shared_prefix": {"count": 1, "tokens": 1000, "fraction": 1.0},
        "deployment.chips": 8, "deployment.tp": 8, "engine.prefix_caching": caching,
    })
    sim = simulate(scenario)
    return sim, result_document(sim)[0]


@pytest.mark.parametrize("model", ["llama-3.1-70b", "deepseek-v3"])
def test_a_shared_system_prompt_is_found_after_warm_up_and_saves_its_prefill_time(model):
    on, on_doc = _system_prompt_run(True, model)
    off, off_doc = _system_prompt_run(False, model)
    assert on_doc["prefix_cache"]["hit_rate"] == pytest.approx(960 / 1100)
    # 15 whole blocks of the 1,000 tokens, the newest vLLM's 64 tokens each
    assert on.run.prefix_hit_tokens[1:].tolist() == [960] * 29
    assert off_doc["prefix_cache"]["hit_rate"] == 0.0
    # Requests come one second apart and each is alone: TTFT differs by exactly the prefill step's
    # compute and traffic for 1,100 tokens against 140 tokens after 960 cached ones (whose latents
    # DeepSeek's MLA decompresses: the step records them as the chunk's context).
    assert on.traces[0].step_chunk_context_tokens.max() == 960
    costs = on.deployment.costs
    def prefill_ns(q, p):
        return (round(costs.compute_s(q, 1, q * p + q * (q + 1) // 2, p + q, p) * 1e9)
                + round(costs.traffic_s(q, False) * 1e9))
    saved_ns = prefill_ns(1100, 0) - prefill_ns(140, 960)
    assert saved_ns > 0
    assert np.array_equal(off.run.ttft_ns[1:] - on.run.ttft_ns[1:], np.full(29, saved_ns))


def test_disaggregated_prefill_replicas_report_the_system_prompt_they_find():
    """The prefill replicas look prompts up in their caches (the decode replicas take them whole): the
    summary's hit rate is theirs, as a colocated deployment's is its engines'."""
    scenario = load_scenario("typical", {
        "workload.num_requests": 30, "workload.warmup_requests": 1,
        "workload.arrival": {"rate": 1.0, "pattern": "constant"},
        "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 8},
        "workload.shared_prefix": {"count": 1, "tokens": 1000, "fraction": 1.0},
        "deployment.chips": 8, "deployment.tp": 4, "deployment.prefill_replicas": 1,
        "engine.prefix_caching": True,
    })
    sim = simulate(scenario)
    assert sim.run.prefix_hit_tokens[1:].tolist() == [960] * 29
    assert result_document(sim)[0]["prefix_cache"]["hit_rate"] == pytest.approx(960 / 1100)


def _routed(policy):
    scenario = load_scenario("typical", {
        "workload.num_requests": 800, "workload.warmup_requests": 100,
        "workload.arrival": {"rate": 8.0},
        "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 20},
        "workload.shared_prefix": {"count": 16, "tokens": 4000, "fraction": 1.0},
        # 4 replicas of 2 chips, about 52,000 tokens of KV cache each: less than the 16 x 4,000 tokens
        # of every prefix, more than a quarter of them.
        "deployment.chips": 8, "deployment.tp": 2, "engine.gpu_memory_utilization": 0.31,
        "deployment.routing": policy,
    })
    sim = simulate(scenario)
    assert 4 * 4000 < sim.deployment.kv_capacity_tokens < 16 * 4000
    return result_document(sim)[0]


def test_prefix_aware_routing_finds_more_of_the_prefixes_than_round_robin_and_answers_sooner():
    spread, aware = _routed("round_robin"), _routed("prefix_aware")
    assert aware["prefix_cache"]["hit_rate"] > spread["prefix_cache"]["hit_rate"] + 0.1
    assert aware["latency_s"]["ttft"]["p50"] < spread["latency_s"]["ttft"]["p50"]
    assert aware["routing"]["imbalance"] < 1.5  # the 16 prefixes spread over the 4 replicas


def test_replicas_stepped_together_on_one_clock_match_replicas_run_apart():
    # Routing round-robin through the shared clock must give each replica exactly the trace it has
    # when simulated on its own: the clock changes when the router looks, not what replicas do.
    from test_prefix_cache import random_prefixes
    from tokenpath.delivery.spec import DeliverySpec
    from tokenpath.engine.cluster import run_cluster
    rng = np.random.default_rng(7)
    n, replicas = 120, 3
    inputs, outputs = rng.integers(1, 600, n), rng.integers(1, 80, n)
    prefixes = random_prefixes(rng, inputs, 3, 64)
    scheduled = np.sort(rng.integers(0, 2_000_000_000, n))
    spec, costs = EngineSpec(max_num_seqs=8, max_num_batched_tokens=512), FixedCosts(base_s=3e-4, per_token_s=2e-6)
    delivery = DeliverySpec(stream_interval=2)
    assignment, traces, _ = run_cluster(scheduled, inputs, outputs, prefixes, costs,
                                     [LastMile(delivery) for _ in range(replicas)], spec, 16 * 200, "round_robin")
    assert np.array_equal(assignment, np.arange(n) % replicas)
    for r in range(replicas):
        rows = np.arange(r, n, replicas)
        alone = run_engine(scheduled[rows], inputs[rows], outputs[rows], costs, LastMile(delivery), spec, 16 * 200,
                           prefixes=prefixes.take(rows))
        for field in alone.__dataclass_fields__:
            assert np.array_equal(getattr(alone, field), getattr(traces[r], field)), field
