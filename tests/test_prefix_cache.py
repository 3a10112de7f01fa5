"""Prefix caching in the engine: against the block-by-block reference, and against closed-form answers."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reference_engine import reference_engine
from test_engine import (
    NO_NETWORK,
    PROFILES,
    FixedCosts,
    assert_aborts_match,
    assert_same_trace,
    draw_abort_steps,
    draw_outputs,
)
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.engine.cluster import run_cluster
from tokenpath.engine.loop import run_engine
from tokenpath.engine.prefix_cache import PrefixCache
from tokenpath.engine.spec import EngineSpec
from tokenpath.prefixes import cached_prompts, chain
from tokenpath.workload.generate import sessions
from tokenpath.workload.spec import SessionSpec

BLOCK = 16


def random_prefixes(rng, inputs, families, segment_tokens):
    """Each request shares the first segments of one of `families` prompts (or none: family -1)."""
    family = rng.integers(-1, families, len(inputs))
    ids, covered = [], []
    for f, prompt in zip(family.tolist(), inputs.tolist()):
        tokens = 0 if f < 0 else int(rng.integers(0, prompt + 1))
        ids.append([(f, k) for k in range(-(-tokens // segment_tokens))])
        covered.append(tokens)
    return chain(ids, covered, segment_tokens)


def _profile(profile, chunked, budget, kv_blocks):
    """The profile's engine settings (multi-step windows of 3) and the longest sequence the run allows."""
    settings_ = {"chunked_prefill": chunked, **PROFILES.get(profile, {})}
    if "num_scheduler_steps" in settings_:
        settings_["num_scheduler_steps"] = 3
    cap = budget if not settings_["chunked_prefill"] else 1500
    return settings_, min(cap, BLOCK * kv_blocks)


def _prefix_workload(profile, n, max_seqs, budget, kv_blocks, chunked, families, segment_tokens, seed):
    """A drawn run of n requests sharing prefix segments: (the generator, to draw on from, the engine spec,
    prompt and output lengths, the prefixes)."""
    settings_, longest = _profile(profile, chunked, budget, kv_blocks)
    rng = np.random.default_rng(seed)
    inputs = rng.integers(1, max(2, longest // 2), n)
    outputs = draw_outputs(rng, n, longest - inputs.max())
    prefixes = random_prefixes(rng, inputs, families, segment_tokens)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=BLOCK,
                      **settings_)
    return rng, spec, inputs, outputs, prefixes


@pytest.mark.parametrize("profile", ["vllm-v1", *PROFILES])
@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 40),
    max_seqs=st.sampled_from([1, 4, 64]),
    budget=st.sampled_from([64, 100, 2048]),
    kv_blocks=st.integers(30, 300),
    chunked=st.booleans(),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    families=st.integers(1, 4),
    segment_tokens=st.sampled_from([16, 40, 512]),
    seed=st.integers(0, 2**16),
)
# Multi-step: a window's growth finds no free block, and the newest sequence, preempted, frees less
# than it holds (a prefix segment an older running sequence shares).
@example(n=24, max_seqs=64, budget=100, kv_blocks=34, chunked=False, concurrency=None, families=2,
         segment_tokens=16, seed=45)
def test_prefix_caching_matches_the_block_by_block_reference(
        profile, n, max_seqs, budget, kv_blocks, chunked, concurrency, families, segment_tokens, seed):
    rng, spec, inputs, outputs, prefixes = _prefix_workload(profile, n, max_seqs, budget, kv_blocks, chunked,
                                                            families, segment_tokens, seed)
    args = (np.rint(np.sort(rng.uniform(0, 0.05, n)) * 1e9).astype(np.int64), inputs, outputs,
            FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5))
    delivery = DeliverySpec(stream_interval=2, detokenize_per_token=2e-5)
    fast = run_engine(*args, LastMile(delivery), spec, BLOCK * kv_blocks, concurrency, prefixes=prefixes)
    slow = reference_engine(*args, LastMile(delivery), spec, BLOCK * kv_blocks, concurrency, prefixes=prefixes)
    assert_same_trace(fast, slow)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 30),
    profile=st.sampled_from(["vllm-v1", *PROFILES]),
    max_seqs=st.sampled_from([1, 4, 64]),
    budget=st.sampled_from([64, 100]),
    kv_blocks=st.integers(30, 150),
    chunked=st.booleans(),
    families=st.integers(1, 3),
    segment_tokens=st.sampled_from([16, 40]),
    share=st.sampled_from([0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_aborts_of_requests_sharing_prefixes_match_the_block_by_block_reference(
        n, profile, max_seqs, budget, kv_blocks, chunked, families, segment_tokens, share, seed):
    """Requests sharing prefix segments aborted before random steps (holding shared segments, or waiting with
    what their preemption left cached): the same trace in both engines, and once idle no reference held."""
    rng, spec, inputs, outputs, prefixes = _prefix_workload(profile, n, max_seqs, budget, kv_blocks, chunked,
                                                            families, segment_tokens, seed)
    scheduled = np.rint(np.sort(rng.uniform(0, 0.02, n)) * 1e9).astype(np.int64)
    workload = (scheduled, inputs, outputs, spec, BLOCK * kv_blocks, np.zeros(n, np.int64),
                DeliverySpec(stream_interval=2, detokenize_per_token=2e-5))
    abort_steps = draw_abort_steps(rng, share, *workload, prefixes=prefixes)
    assert_aborts_match(*workload, abort_steps, prefixes=prefixes)


@pytest.mark.parametrize("profile", ["vllm-v1", *PROFILES])
@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 30),
    turns=st.integers(1, 4),
    max_seqs=st.sampled_from([1, 4, 64]),
    budget=st.sampled_from([64, 100, 2048]),
    kv_blocks=st.integers(30, 300),
    chunked=st.booleans(),
    think_s=st.sampled_from([0.0, 1e-3, 0.02]),
    seed=st.integers(0, 2**16),
)
def test_sessions_match_the_block_by_block_reference(profile, n, turns, max_seqs, budget, kv_blocks, chunked,
                                                     think_s, seed):
    # Multi-turn sessions (workload.generate.sessions): each turn is sent its think time after the
    # one before finishes, and finds the previous prompt and answer, cached when that turn finished.
    settings_, longest = _profile(profile, chunked, budget, kv_blocks)
    rng = np.random.default_rng(seed)
    # A whole session (every message and answer) fits in a step's budget and in the cache.
    per_turn = max(2, longest // (2 * turns))
    requests = sessions(SessionSpec(turns=turns, think_time=think_s), np.sort(rng.uniform(0, 0.05, n)),
                        rng.integers(1, per_turn, n), rng.integers(1, per_turn, n), rng)
    think_ns = np.where(requests.sessions.turn > 0, np.rint(requests.sessions.think_s * 1e9), -1).astype(np.int64)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=BLOCK,
                      **settings_)
    args = (np.rint(requests.arrival_s * 1e9).astype(np.int64), requests.input_tokens, requests.output_tokens,
            FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5))
    delivery = DeliverySpec(stream_interval=2, detokenize_per_token=2e-5)
    fast = run_engine(*args, LastMile(delivery), spec, BLOCK * kv_blocks, prefixes=requests.prefixes,
                      think_ns=think_ns)
    slow = reference_engine(*args, LastMile(delivery), spec, BLOCK * kv_blocks, prefixes=requests.prefixes,
                            think_ns=think_ns)
    assert_same_trace(fast, slow)


def test_the_reference_comparison_sees_hits_evictions_and_preemptions():
    # A cache of 40 blocks, prompts of 320 tokens (20 blocks) from two families: hits and
    # preemptions happen, and both engines agree on each.
    n = 24
    inputs, outputs = np.full(n, 320), np.full(n, 40)
    prefixes = chain([[(i % 2, k) for k in range(5)] for i in range(n)], [300] * n, 64)
    spec = EngineSpec(max_num_seqs=4, max_num_batched_tokens=512, block_size=BLOCK)
    args = (np.arange(n, dtype=np.int64) * 5_000_000, inputs, outputs, FixedCosts())
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * 40, prefixes=prefixes)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * 40, prefixes=prefixes)
    assert_same_trace(fast, slow)
    assert fast.preemptions > 0
    hits = fast.prefix_hit_tokens
    assert (hits[2:] > 0).all() and hits.max() == 288  # 18 whole blocks of the 300 shared tokens


def test_the_session_comparison_sees_answers_found_evicted_and_preempted():
    # Four 3-turn sessions, messages of 100 tokens, answers of 60: turn 2 can find turn 1's prompt
    # and answer (159 tokens: 9 whole blocks, 144), turn 3 both turns (319: 304). With 1,000 blocks
    # every turn finds them; with 80, evictions and a preemption cut some hits short, and both
    # engines agree on each. (vLLM 0.18.0, which admits a prompt whose first chunk fits: from 0.19.0 a turn
    # waits for its whole prompt's blocks, and the 80 hold these turns without a preemption.)
    n = 12
    requests = sessions(SessionSpec(turns=3, think_time=0.001), np.arange(n) * 0.002, np.full(n, 100),
                        np.full(n, 60), np.random.default_rng(0))
    think_ns = np.where(requests.sessions.turn > 0, np.rint(requests.sessions.think_s * 1e9), -1).astype(np.int64)
    spec = EngineSpec(max_num_seqs=4, max_num_batched_tokens=512, block_size=BLOCK, version="0.18.0")
    args = (np.rint(requests.arrival_s * 1e9).astype(np.int64), requests.input_tokens, requests.output_tokens,
            FixedCosts())
    hits = {}
    for blocks in (80, 1000):
        fast = run_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * blocks, prefixes=requests.prefixes,
                          think_ns=think_ns)
        slow = reference_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * blocks, prefixes=requests.prefixes,
                                think_ns=think_ns)
        assert_same_trace(fast, slow)
        hits[blocks] = fast.prefix_hit_tokens.tolist()
        if blocks == 80:
            assert fast.preemptions > 0
    assert hits[1000] == [0, 144, 304] * 4
    assert hits[80] == [0, 144, 304, 0, 144, 144, 0, 144, 0, 0, 144, 0]


def test_a_shared_prefix_is_computed_once_then_found_in_whole_blocks():
    # One request after another, each 1,000 shared tokens + 100 of its own: the first computes it
    # all; the others find floor(1000 / 16) = 62 blocks (992 tokens) and compute the rest.
    n = 5
    inputs, outputs = np.full(n, 1100), np.full(n, 2)
    prefixes = chain([["system"]] * n, [1000] * n, 1000)
    spec = EngineSpec(block_size=BLOCK)
    costs = FixedCosts(base_s=1e-3, per_token_s=1e-6)
    trace = run_engine(np.zeros(n, np.int64), inputs, outputs, costs, LastMile(NO_NETWORK), spec, 10**6,
                       max_concurrency=1, prefixes=prefixes)
    assert trace.prefix_hit_tokens.tolist() == [0] + [992] * (n - 1)
    # Each request's prefill step processes its uncached tokens only.
    prefill_tokens = trace.step_tokens[::2]
    assert prefill_tokens.tolist() == [1100] + [108] * (n - 1)
    off = run_engine(np.zeros(n, np.int64), inputs, outputs, costs, LastMile(NO_NETWORK),
                     EngineSpec(block_size=BLOCK, prefix_caching=False), 10**6, max_concurrency=1, prefixes=prefixes)
    assert off.prefix_hit_tokens.tolist() == [0] * n
    assert off.step_tokens[::2].tolist() == [1100] * n


def test_the_last_prompt_token_is_always_computed():
    # A prompt made only of a cached prefix still computes its last block: the segment holding the
    # last token is found up to the block before it (31 of its 32 blocks), as vLLM finds
    # (num_tokens - 1) // block_size blocks.
    inputs, outputs = np.array([512, 512]), np.array([1, 1])
    prefixes = chain([["a"], ["a"]], [512, 512], 512)
    trace = run_engine(np.zeros(2, np.int64), inputs, outputs, FixedCosts(), LastMile(NO_NETWORK),
                       EngineSpec(block_size=BLOCK), 10**6, max_concurrency=1, prefixes=prefixes)
    assert trace.prefix_hit_tokens.tolist() == [0, 496]
    assert trace.step_tokens.tolist() == [512, 16]


@pytest.mark.parametrize("prompt, hit", [
    (1023, 1008),  # segment ends at blocks 32 and 63; the last token is in block 63: both whole
    (1024, 1008),  # segments end at blocks 32 and 64: the second is found up to block 63
    (1025, 1024),  # the last token is in block 64, past both segments
    (2048, 2032),  # four segments, the fourth found up to block 127
])
def test_a_prompt_named_whole_by_its_segments_is_found_up_to_its_last_block(prompt, hit):
    # Two identical prompts named by 512-token segments (as a Mooncake trace names them): the second
    # finds floor((prompt - 1) / 16) blocks, as vLLM's get_computed_blocks does, not a segment fewer.
    segments = -(-prompt // 512)
    prefixes = chain([[("doc", k) for k in range(segments)]] * 2, [prompt, prompt])
    args = (np.array([0, 10**9]), np.array([prompt, prompt]), np.array([2, 2]),
            FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5))
    spec = EngineSpec(block_size=BLOCK)
    fast = run_engine(*args, LastMile(DeliverySpec()), spec, BLOCK * 10_000, prefixes=prefixes)
    slow = reference_engine(*args, LastMile(DeliverySpec()), spec, BLOCK * 10_000, prefixes=prefixes)
    assert_same_trace(fast, slow)
    assert fast.prefix_hit_tokens.tolist() == [0, hit]
    assert fast.step_tokens.tolist() == [prompt, 1, prompt - hit, 1]  # each prefill, then its one decode


@pytest.mark.parametrize("profile", ["vllm-v1", *PROFILES])
@pytest.mark.parametrize("kv_blocks", [70, 100, 300])
def test_prompts_found_up_to_their_last_block_match_the_block_by_block_reference(profile, kv_blocks):
    # Prompts of whole blocks named whole by their segments, from two families, in a cache that
    # evicts and preempts (70, 100 blocks) or not (300): a found segment cut at the request's last
    # block is held whole while the request runs, and both engines agree on the blocks that frees.
    settings_, _ = _profile(profile, True, 2048, kv_blocks)
    n = 16
    inputs, outputs = np.where(np.arange(n) % 3, 512, 1024), np.full(n, 40)
    prefixes = chain([[(i % 2, k) for k in range(p // 256)] for i, p in enumerate(inputs.tolist())],
                     inputs.tolist(), 256)
    spec = EngineSpec(max_num_seqs=4, max_num_batched_tokens=2048, block_size=BLOCK, prefix_caching=True,
                      **settings_)
    args = (np.arange(n, dtype=np.int64) * 5_000_000, inputs, outputs, FixedCosts())
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * kv_blocks, prefixes=prefixes)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, BLOCK * kv_blocks, prefixes=prefixes)
    assert_same_trace(fast, slow)
    assert (fast.prefix_hit_tokens % 256 == 240).any()  # some segment was found cut


def test_an_evicted_prefix_is_computed_again():
    # A cache of 80 blocks: prefix A (64 blocks) is cached, then prefix B's request needs 64 + 2
    # blocks, which takes A's (least recently freed first); A's next request misses.
    inputs, outputs = np.array([1040, 1040, 1040]), np.array([1, 1, 1])
    prefixes = chain([["A"], ["B"], ["A"]], [1024] * 3, 1024)
    trace = run_engine(np.zeros(3, np.int64), inputs, outputs, FixedCosts(), LastMile(NO_NETWORK),
                       EngineSpec(block_size=BLOCK), BLOCK * 80, max_concurrency=1, prefixes=prefixes)
    assert trace.prefix_hit_tokens.tolist() == [0, 0, 0]
    roomy = run_engine(np.zeros(3, np.int64), inputs, outputs, FixedCosts(), LastMile(NO_NETWORK),
                       EngineSpec(block_size=BLOCK), BLOCK * 200, max_concurrency=1, prefixes=prefixes)
    assert roomy.prefix_hit_tokens.tolist() == [0, 0, 1024]


@pytest.mark.parametrize("scheduler, prefix_caching, recomputed", [
    ("vllm-v1", True, 0),         # every token it had computed: 6 whole blocks, 96 tokens, found again
    ("trtllm", True, 96),         # nothing kept
    ("vllm-v1", False, 96),
])
def test_a_preempted_request_finds_what_its_engine_left_cached(scheduler, prefix_caching, recomputed):
    # Two requests of 64 prompt tokens and 40 output tokens in 13 blocks of 16. When each has 96 tokens in
    # its cache the next decode needs a 14th block: B, the newest, is preempted with 96 tokens computed, and
    # is admitted again once A finishes. Without preemption the steps run 128 prompt tokens and 2 x 39
    # decodes; B recomputes what its engine did not leave cached.
    admission = {"kv_admission": "on_demand"} if scheduler == "trtllm" else {}
    spec = EngineSpec(scheduler=scheduler, max_num_batched_tokens=256, max_num_seqs=8, block_size=BLOCK,
                      prefix_caching=prefix_caching, **admission)
    trace = run_engine(np.zeros(2, np.int64), np.array([64, 64]), np.array([40, 40]), FixedCosts(),
                       LastMile(NO_NETWORK), spec, BLOCK * 13)
    assert trace.times_preempted.tolist() == [0, 1]
    assert int(trace.step_tokens.sum()) == 128 + 2 * 39 + recomputed


@pytest.mark.parametrize("prefix_caching, recomputed", [(True, 37), (False, 101)])
def test_sglang_keeps_a_retracted_requests_last_prefill_cached(prefix_caching, recomputed):
    # SGLang admits a request only if its prompt and whole output fit beside the running requests' outputs to
    # come at its new_token_ratio, so two admitted together never outgrow the cache, and after a refusal it
    # admits none until a request leaves. B (64 prompt tokens, 40 out) comes at 10.5 ms, when A (64, 60 out)
    # has decoded about ten and its rest counts at the ratio: in 14 blocks of 16 the two outgrow the cache and
    # B, with the fewest tokens made, is retracted with 101 computed. It keeps its prompt's 64 tokens (its last
    # prefill's) and recomputes the 37 it decoded; without prefix caching all 101. (Its last token's batch
    # decodes it once more in 0.5.21: Profile.runs_finished_batch.)
    spec = EngineSpec(scheduler="prefill-first", max_num_batched_tokens=256, max_num_seqs=8, block_size=BLOCK,
                      prefix_caching=prefix_caching, version="0.5.21")
    trace = run_engine(np.array([0, 10_500_000]), np.array([64, 64]), np.array([60, 40]), FixedCosts(),
                       LastMile(NO_NETWORK), spec, BLOCK * 14)
    assert trace.times_preempted.tolist() == [0, 1]
    assert int(trace.step_tokens.sum()) == 128 + 59 + 39 + recomputed + 1


def test_a_long_prompt_preempted_mid_prefill_keeps_its_chunks_and_waits():
    # vLLM V1, 12 blocks of 16, a budget of 64 tokens: A (32 tokens, 40 out) decodes while B's 160-token
    # prompt is prefilled in chunks of 63. After two chunks A needs a block: B, in progress, is preempted
    # with 126 tokens computed. With prefix caching its 7 whole blocks stay cached, it waits without
    # computing while A decodes alone, and then computes only the 48 tokens left. Without it, B is admitted
    # again every other step, computes 126 tokens and is preempted again, and A's decodes share those steps.
    # (V1 without its async scheduling, as before 0.14.0: B joins the step after it arrives; as 0.18.0 admits
    # a prompt whose first chunk fits)
    spec = EngineSpec(max_num_batched_tokens=64, max_num_seqs=8, block_size=BLOCK, host_overlap=False,
                      version="0.18.0")
    args = (np.array([0, 500_000]), np.array([32, 160]), np.array([40, 2]), FixedCosts(), LastMile(NO_NETWORK))
    kept = run_engine(*args, spec, BLOCK * 12)
    assert kept.preemptions == 1
    assert kept.step_tokens.tolist() == [32, 64, 64] + [1] * 37 + [48, 1]
    thrashing = run_engine(*args, spec.model_copy(update={"prefix_caching": False}), BLOCK * 12)
    assert thrashing.preemptions == 14
    assert thrashing.step_tokens.tolist()[:7] == [32, 64, 64, 1, 64, 64, 1]
    # From 0.19.0 B waits until its 10 blocks are free: A holds 3 of the 12 when B asks, 5 at last (72 tokens), so B
    # runs once A is done, whole chunks with nothing preempted, with prefix caching or without.
    for caching in (True, False):
        whole = run_engine(*args, spec.model_copy(update={"version": "0.19.0", "prefix_caching": caching}),
                           BLOCK * 12)
        assert whole.preemptions == 0
        assert whole.step_tokens.tolist() == [32] + [1] * 39 + [64, 64, 32, 1]


def test_each_engine_caches_prefixes_by_default_as_it_ships():
    # vLLM V0's --enable-prefix-caching defaulted to off; V1's prefix caching, SGLang's radix cache and
    # TensorRT-LLM's block reuse are on unless turned off.
    assert not EngineSpec(scheduler="vllm-v0").prefix_caching
    assert all(EngineSpec(scheduler=name).prefix_caching for name in ("vllm-v1", "prefill-first", "trtllm"))
    assert EngineSpec(scheduler="vllm-v0", prefix_caching=True).prefix_caching


def test_prompts_the_server_holds_before_the_run_are_found_from_the_first_request():
    # Requests 0 and 1 were sent by an earlier run (prefixes.cached_prompts): each finds its prompt but
    # the last token in whole blocks, floor(1039 / 16) = 64 blocks (1,024 tokens), and computes 16;
    # request 2 computes its 1,040. Without prefix caching the server holds nothing.
    inputs, outputs = np.full(3, 1040), np.ones(3, np.int64)
    prefixes = cached_prompts(inputs, np.arange(3) < 2)
    trace = run_engine(np.zeros(3, np.int64), inputs, outputs, FixedCosts(), LastMile(NO_NETWORK),
                       EngineSpec(block_size=BLOCK), BLOCK * 200, max_concurrency=1, prefixes=prefixes)
    assert trace.prefix_hit_tokens.tolist() == [1024, 1024, 0]
    assert trace.step_tokens.tolist() == [16, 16, 1040]
    off = run_engine(np.zeros(3, np.int64), inputs, outputs, FixedCosts(), LastMile(NO_NETWORK),
                     EngineSpec(block_size=BLOCK, prefix_caching=False), BLOCK * 200, max_concurrency=1,
                     prefixes=prefixes)
    assert off.prefix_hit_tokens.tolist() == [0, 0, 0]


def test_a_warm_cache_holds_the_most_recent_segments_that_fit_behind_the_never_used_blocks():
    # 100 free blocks, segments 7 (60 blocks) then 8 (30): both held, behind 10 never-used blocks; the
    # engine taking 40 blocks evicts 7, the least recently used, and keeps 8.
    cache = PrefixCache(BLOCK, 100, [(7, 60), (8, 30)])
    assert list(cache.queue.values()) == [[-1, 10], [7, 60], [8, 30]] and cache.queued == 100
    cache._sync(60)
    assert list(cache.entries) == [8]
    # 70 free blocks hold 8 (30), the more recent, and not 7 (60 more)
    assert list(PrefixCache(BLOCK, 70, [(7, 60), (8, 30)]).entries) == [8]


def test_a_live_router_refuses_a_warm_cache():
    inputs = np.full(2, 100)
    warm = cached_prompts(inputs, np.array([True, False]))
    with pytest.raises(ValueError, match="warm prefix cache"):
        run_cluster(np.zeros(2, np.int64), inputs, np.ones(2, np.int64), warm, FixedCosts(),
                    [LastMile(NO_NETWORK)] * 2, EngineSpec(block_size=BLOCK), 10**6, "least_outstanding")


def test_a_cluster_routed_up_front_holds_each_replica_s_warm_prompts_as_replicas_run_apart():
    """Routed up front (`assigned`: pipeline batches in flight are stepped on one clock), each replica's
    cache holds the warm prompts of the requests it serves, as it does simulated on its own."""
    rng = np.random.default_rng(5)
    n = 12
    inputs, outputs = rng.integers(40, 200, n), rng.integers(1, 20, n)
    scheduled = np.sort(rng.integers(0, 200_000_000, n))
    warm = cached_prompts(inputs, np.arange(n) < 6)
    spec, assigned = EngineSpec(block_size=BLOCK), np.arange(n) % 2
    _, traces, _ = run_cluster(scheduled, inputs, outputs, warm, FixedCosts(), [LastMile(NO_NETWORK)] * 2, spec,
                               10**6, "round_robin", assigned=assigned)
    for r in range(2):
        rows = np.flatnonzero(assigned == r)
        alone = run_engine(scheduled[rows], inputs[rows], outputs[rows], FixedCosts(), LastMile(NO_NETWORK), spec,
                           10**6, prefixes=warm.take(rows))
        assert np.array_equal(alone.prefix_hit_tokens, traces[r].prefix_hit_tokens)
        assert alone.prefix_hit_tokens[:3].sum() > 0  # the warm ones hit
        assert np.array_equal(alone.step_start_ns, traces[r].step_start_ns)
