"""The limits an engine picks for the GPU it runs on, where the scenario's [engine] table leaves them out."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from cli_helpers import assert_user_error, run_cli
from test_engine import NO_NETWORK, FixedCosts, SpeculativeCosts
from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.batch_limits import sglang_max_running_requests
from tokenpath.engine.loop import run_engine
from tokenpath.engine.replica import Replica
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.speculative import SpeculativeSpec
from tokenpath.sim.deployment import build_deployment
from tokenpath.sim.scenario import Scenario, load_scenario
from tokenpath.sim.simulate import simulate


def _scenario(chip: str, scheduler: str, **engine) -> Scenario:
    return Scenario.model_validate({"model": {"name": "llama-3.1-8b", "precision": "bf16"},
                                    "deployment": {"chip": chip, "chips": 1, "tp": 1},
                                    "engine": {"scheduler": scheduler, **engine}})


@pytest.mark.parametrize(("chip", "scheduler", "max_num_seqs", "max_num_batched_tokens"), [
    # vLLM V1's OpenAI server: the larger pair on a GPU of 70 GiB or more that is not an A100.
    ("h100", "vllm-v1", 1024, 8192), ("h200", "vllm-v1", 1024, 8192),
    # ... and from 0.28.0 (the newest, a scenario stating no release) 16384 tokens on 160 GiB or more
    ("mi300x", "vllm-v1", 1024, 16384), ("b200", "vllm-v1", 1024, 16384), ("gb200", "vllm-v1", 1024, 16384),
    ("a100", "vllm-v1", 256, 2048), ("a100-40gb", "vllm-v1", 256, 2048), ("tpu-v6e", "vllm-v1", 256, 2048),
    # vLLM V0: 256 sequences anywhere.
    ("a100", "vllm-v0", 256, 8192), ("h200", "vllm-v0", 256, 8192),
    # SGLang's chunked prefill by the GPU's memory: 4096 under 60 GiB, 8192 under 160, 16384 above (its
    # running requests the table's until the deployment sizes its KV cache: below).
    ("a100-40gb", "prefill-first", 1024, 4096), ("h100", "prefill-first", 1024, 8192),
    ("h200", "prefill-first", 1024, 8192), ("b200", "prefill-first", 1024, 16384),
    ("mi300x", "prefill-first", 1024, 16384),
    # trtllm-serve: BuildConfig's 2048 requests and 8192 tokens on any GPU.
    ("a100", "trtllm", 2048, 8192), ("h200", "trtllm", 2048, 8192),
])
def test_each_engine_picks_its_limits_for_the_chip(chip, scheduler, max_num_seqs, max_num_batched_tokens):
    engine = _scenario(chip, scheduler).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (max_num_seqs, max_num_batched_tokens)


@pytest.mark.parametrize(("chip", "version", "large"), [
    # 0.7.0 to 0.8.4: H100 and H200 by name
    ("h100", "0.8.3 (vllm/vllm-openai:v0.8.3, V1)", True), ("h200", "0.7.3", True), ("mi300x", "0.8.4", False),
    ("b200", "0.8.3", False), ("a100", "0.8.3", False),
    # 0.8.5: every GPU of 70 GiB or more, the A100 80 GB too
    ("a100", "0.8.5", True), ("mi300x", "0.8.5.post1", True), ("a100-40gb", "0.8.5", False),
    # 0.9.0 on: not the A100
    ("a100", "0.9.0", False), ("b200", "0.9.2", True),
])
def test_vllm_v1s_limits_follow_each_releases_rule(chip, version, large):
    engine = _scenario(chip, "vllm-v1", version=version).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == ((1024, 8192) if large else (256, 2048))


@pytest.mark.parametrize(("chip", "version", "tokens"), [
    ("b200", "0.27.1", 8192), ("b200", "0.28.0", 16384), ("mi300x", "0.27.1", 8192), ("mi325x", "0.34.0", 16384),
    ("h200", "0.34.0", 8192),  # 141 GiB: the 70 GiB tier
])
def test_vllm_v1_takes_16384_tokens_a_step_on_160_gib_from_0_28_0(chip, version, tokens):
    engine = _scenario(chip, "vllm-v1", version=version).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (1024, tokens)


def test_limits_the_table_states_stand_and_the_other_one_is_still_the_chips():
    engine = _scenario("a100", "vllm-v1", max_num_seqs=128).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (128, 2048)
    engine = _scenario("a100", "vllm-v1", max_num_batched_tokens=4096).engine
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (256, 4096)


def test_switching_the_default_scenario_to_an_a100_takes_vllms_a100_limits():
    """The embedded scenario states none, so a lever or flag that moves it to another chip moves them too."""
    assert (load_scenario().engine.max_num_seqs, load_scenario().engine.max_num_batched_tokens) == (1024, 8192)
    moved = load_scenario(None, {"deployment.chip": "a100"})
    assert (moved.engine.max_num_seqs, moved.engine.max_num_batched_tokens) == (256, 2048)


def test_a_burst_on_an_a100_queues_behind_vllms_256_sequences():
    """1,000 prompts at once on one A100 80 GB, Llama 3.1 8B: the cache holds every one, but at most 256
    run in a step and the rest wait; with the H100's limits stated, four times as many start at once."""
    table = {"model": {"name": "llama-3.1-8b", "precision": "bf16"},
             "deployment": {"chip": "a100", "chips": 1, "tp": 1},
             "workload": {"num_requests": 1000, "arrival": {"rate": "inf"},
                          "input": {"kind": "fixed", "value": 200}, "output": {"kind": "fixed", "value": 200}}}
    a100 = simulate(Scenario.model_validate(table))
    stated = simulate(Scenario.model_validate({**table, "engine": {"max_num_seqs": 1024,
                                                                   "max_num_batched_tokens": 8192}}))
    assert a100.deployment.kv_capacity_tokens > 1000 * 400  # room for every request's whole cache
    assert a100.traces[0].step_seqs.max() == 256 and stated.traces[0].step_seqs.max() > 256

    def started_before_the_first_finished(sim) -> int:
        return int(np.sum(sim.run.sent_ns + sim.run.ttft_engine_ns < sim.run.engine_done_ns.min()))

    assert started_before_the_first_finished(a100) == 256
    assert started_before_the_first_finished(stated) == 1000



@pytest.mark.parametrize(("pool_tokens", "context_len", "running"), [
    (967_495, 131_072, 3779),   # int(967,495 / 131,072 x 512)
    (300_000, 131_072, 2048),   # 1,171, held at the floor
    (3_000, 131_072, 1500),     # the floor is more than half the pool: half the pool
    (2_000_000, 32_768, 4096),  # 31,250, held at the ceiling
])
def test_sglangs_running_requests_follow_its_pool(pool_tokens, context_len, running):
    """resolve_max_num_reqs: pool / context x 512 within 2,048 to 4,096, at most half the pool."""
    assert sglang_max_running_requests(pool_tokens, context_len) == running


def test_sglang_sets_its_running_requests_from_the_pool_the_deployment_sizes():
    """Llama 3.1 8B (131,072 tokens of context) on one H200: the running requests follow the KV pool, where
    the table leaves them out; stated, they stand; vLLM's stay its own."""
    deployment = build_deployment(_scenario("h200", "prefill-first"))
    pool = deployment.kv_capacity_tokens
    assert deployment.engine.max_num_seqs == int(pool / 131_072 * 512) > 1024
    assert build_deployment(_scenario("h200", "prefill-first", max_num_seqs=512)).engine.max_num_seqs == 512
    assert build_deployment(_scenario("h200", "vllm-v1")).engine.max_num_seqs == 1024


def test_each_attention_rank_runs_its_own_share_and_the_step_budget_caps_them():
    sglang = EngineSpec(scheduler="prefill-first", max_num_batched_tokens=32768)
    # one scheduler over 4.8M tokens: the ceiling; 8 ranks of 600,000 tokens: 2,343 each (600,000 / 131,072
    # x 512); of 60,000: the floor each
    assert sglang.with_running_from_kv(8 * 600_000, 131_072, 1).max_num_seqs == 4096
    assert sglang.with_running_from_kv(8 * 600_000, 131_072, 8).max_num_seqs == 8 * 2343
    assert sglang.with_running_from_kv(8 * 60_000, 131_072, 8).max_num_seqs == 8 * 2048
    budget = sglang.model_copy(update={"max_num_batched_tokens": 8192})
    assert budget.with_running_from_kv(8 * 600_000, 131_072, 8).max_num_seqs == 8192
    vllm = EngineSpec(scheduler="vllm-v1")
    assert vllm.with_running_from_kv(8 * 600_000, 131_072, 1) is vllm


def test_a_burst_beyond_1024_runs_at_once_under_sglang():
    """1,500 short prompts at once on one H200: SGLang's own limit (3,779 here) runs every one before any
    finishes; stated at 1,024, the rest wait."""
    table = {"model": {"name": "llama-3.1-8b", "precision": "bf16"},
             "deployment": {"chip": "h200", "chips": 1, "tp": 1},
             "workload": {"num_requests": 1500, "arrival": {"rate": "inf"},
                          "input": {"kind": "fixed", "value": 32}, "output": {"kind": "fixed", "value": 64}}}
    own = simulate(Scenario.model_validate({**table, "engine": {"scheduler": "prefill-first"}}))
    stated = simulate(Scenario.model_validate({**table, "engine": {"scheduler": "prefill-first",
                                                                   "max_num_seqs": 1024}}))

    def started_before_the_first_finished(sim) -> int:
        return int(np.sum(sim.run.sent_ns + sim.run.ttft_engine_ns < sim.run.engine_done_ns.min()))

    assert started_before_the_first_finished(own) == 1500
    assert started_before_the_first_finished(stated) == 1024


def _trtllm_trace(max_num_seqs, max_num_batched_tokens, drafts=None):
    """8 requests of a 1-token prompt and 3 tokens out, all at once, under TensorRT-LLM."""
    speculative = None if drafts is None else SpeculativeSpec(method="ngram", num_speculative_tokens=drafts)
    spec = EngineSpec(scheduler="trtllm", max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                      speculative=speculative)
    costs = FixedCosts() if drafts is None else SpeculativeCosts(drafts=drafts, acceptance=0.0)
    return run_engine(np.zeros(8, np.int64), np.ones(8, np.int64), np.full(8, 3), costs, LastMile(NO_NETWORK),
                      spec, 10**6)


def test_tensorrt_llm_decodes_as_many_sequences_a_step_as_max_num_tokens_holds():
    """TensorRT-LLM neither refuses nor clamps max_num_tokens below max_batch_size: its micro-batch scheduler
    adds generation requests, each its token and drafts, until the next would pass max_num_tokens, and the
    others wait. max_batch_size 8 and max_num_tokens 4: 4 sequences a step, never 8 (8 requests of one prompt
    token and 3 out: 4 prompts, 2 steps of their 4 decodes, then the other 4 alike). With one n-gram draft (2
    tokens a decode) its capacity scheduler still fits 4 prompts of one token in the first step; then 2 of
    them decode a step (requests 0 and 1 twice, then 2 and 3, which wait holding their KV), no prompt beside
    them, and the other 4 alike."""
    trace = _trtllm_trace(8, 4)
    assert list(trace.step_seqs) == [4, 4, 4, 4, 4, 4]
    assert list(trace.step_tokens) == [4, 4, 4, 4, 4, 4]
    speculating = _trtllm_trace(8, 4, drafts=1)
    assert list(speculating.step_seqs) == [4, 2, 2, 2, 2] * 2
    assert list(speculating.step_tokens) == [4] * 10


def test_tensorrt_llm_s_decodes_past_the_budget_keep_their_kv_and_reservations():
    """The requests TensorRT-LLM's capacity scheduler fits keep their blocks and their reservation to
    completion (GUARANTEED_NO_EVICT) while the micro-batch scheduler leaves them waiting. The case above on
    blocks of 4: after the first step 4 requests run, each reserving 1 + 3 tokens and a draft (2 blocks) and
    holding its prompt's block; after the second, requests 2 and 3 have waited and still hold both; after the
    third, 0 and 1 are done and the 4 left wait in the queue, holding nothing."""
    spec = EngineSpec(scheduler="trtllm", max_num_seqs=8, max_num_batched_tokens=4, block_size=4,
                      speculative=SpeculativeSpec(method="ngram", num_speculative_tokens=1))
    replica = Replica(SpeculativeCosts(drafts=1, acceptance=0.0), LastMile(NO_NETWORK), spec, 4 * 64)
    for _ in range(8):
        replica.submit(1, 3, 0)
    held = []
    for _ in range(3):
        replica.step()
        held.append((list(replica.decoding), replica.cache_blocks - replica.unreserved_blocks,
                     replica.cache_blocks - replica.free_blocks))
    assert held == [([0, 1, 2, 3], 8, 4), ([0, 1, 2, 3], 8, 4), ([2, 3], 4, 2)]
    assert list(replica.waiting) == [4, 5, 6, 7]


def test_a_budget_under_one_decode_is_refused_in_one_line_and_vllm_refuses_one_under_its_sequences():
    EngineSpec(scheduler="trtllm", max_num_seqs=64, max_num_batched_tokens=32)  # (runs 32 a step)
    with pytest.raises(ValidationError, match=r"max_num_batched_tokens \(3\) holds no decoding sequence's 4 tokens"):
        EngineSpec(scheduler="trtllm", max_num_seqs=8, max_num_batched_tokens=3,
                   speculative=SpeculativeSpec(method="mtp", num_speculative_tokens=3))
    with pytest.raises(ValidationError, match=r"max_num_batched_tokens \(32\) must be at least max_num_seqs \(64\)"):
        EngineSpec(scheduler="vllm-v1", max_num_seqs=64, max_num_batched_tokens=32)


def test_a_trtllm_budget_under_one_decode_is_one_line_and_exit_2(monkeypatch, capsys):
    assert_user_error(*run_cli(["simulate", "--num-requests", "4", "--set", 'engine.scheduler="trtllm"', "--set",
                                "engine.max_num_seqs=8", "--set", "engine.max_num_batched_tokens=3", "--set",
                                'engine.speculative.method="ngram"', "--set",
                                "engine.speculative.num_speculative_tokens=3", "--set",
                                "workload.draft_acceptance=0.5"], monkeypatch, capsys),
                      "engine: max_num_batched_tokens (3) holds no decoding sequence's 4 tokens")
