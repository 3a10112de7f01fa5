"""Prompts held for a tokenizer batch before they are tokenized (engine/tokenizer_batching.py): which
releases, how the front end's batches form (delivery/frontend.py), and what a request waits, checked
against batches worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.delivery.frontend import FrontEnd, Layout
from tokenpath.engine.profiles import PROFILES
from tokenpath.engine.tokenizer_batching import no_tokenizer_batch_wait, vllm_tokenizer_batch_wait_s


@pytest.mark.parametrize(("release", "wait_s"), [
    ("0.9.2", 0.0),               # before vLLM pull request 19334
    ("0.10.0", 0.002), ("v0.11.0", 0.002), ("0.17.1", 0.002), ("0.23.0", 0.002),
    ("0.24.0", 0.0),              # pull request 45759 removed it
    (None, 0.0),                  # unstated: the newest release
    ("not stated", 0.0),
])
def test_vllm_batches_prompts_from_0_10_until_0_24(release, wait_s):
    assert vllm_tokenizer_batch_wait_s(release) == wait_s


def test_each_profile_follows_its_engine():
    assert {name: p.tokenizer_batch_wait_s for name, p in PROFILES.items()} == {
        "vllm-v1": vllm_tokenizer_batch_wait_s, "vllm-v0": vllm_tokenizer_batch_wait_s,
        "prefill-first": no_tokenizer_batch_wait, "trtllm": no_tokenizer_batch_wait}
    assert no_tokenizer_batch_wait("0.11.0") == 0.0


def _delivery(overrides: dict):
    return load_scenario("typical", overrides).resolved_delivery()


def test_a_scenario_takes_its_releases_wait_unless_it_states_one():
    vllm = {"engine.scheduler": "vllm-v1", "engine.version": "0.11.0"}
    assert (_delivery(vllm).tokenizer_batch_wait, _delivery(vllm).tokenizer_batch_max) == (0.002, 32)
    assert _delivery({"engine.scheduler": "prefill-first", "engine.version": "0.11.0"}).tokenizer_batch_wait == 0.0
    # SGLang with --enable-dynamic-batch-tokenizer: its 2 ms and 32 prompts stated
    sglang = _delivery({"engine.scheduler": "prefill-first", "delivery.tokenizer_batch_wait": "2 ms"})
    assert (sglang.tokenizer_batch_wait, sglang.tokenizer_batch_max) == (0.002, 32)
    stated = _delivery({**vllm, "delivery.tokenizer_batch_wait": "0.5 ms", "delivery.tokenizer_batch_max": 4})
    assert (stated.tokenizer_batch_wait, stated.tokenizer_batch_max) == (0.5e-3, 4)


def test_a_prompt_alone_waits_out_its_batch_while_the_cpu_does_other_work():
    # 1 ms to parse, 0.5 ms to tokenize: the batch opens when the parse ends (1 ms) and closes at 3 ms, so the
    # engine has the request at 3.5 ms, 2 ms of it waiting. The CPU is free from 1.5 ms: a step's tokens ready
    # at 1.6 ms run at once.
    front = FrontEnd(Layout("api-server"), tokenizer_batch_wait_s=2e-3, tokenizer_batch_max=32)
    assert front.requests([0], 1e-3, [0.5e-3])[0] == (3_500_000, 2_000_000, 1_500_000)
    assert front.tokens(1_600_000, 0.1e-3, 1) == (1_700_000, 0, 100_000)
    # A request arriving at 1.7 ms is parsed by 2.7 ms, inside that batch: handed on with the first at 3.5 ms (the
    # batch closes at 3 ms, its 0.5 ms of tokenizing after the close); one parsed after 3 ms opens the next batch.
    assert front.requests([1_700_000], 1e-3, [0.5e-3])[0][0] == 3_500_000
    assert front.requests([3_300_000], 1e-3, [0.5e-3])[0][0] == 3_300_000 + 1_000_000 + 2_000_000 + 500_000


def test_a_full_batch_sends_the_next_prompt_to_a_batch_of_its_own():
    front = FrontEnd(Layout("api-server"), tokenizer_batch_wait_s=2e-3, tokenizer_batch_max=2)
    handed = [front.requests([at_ns], 0.5e-3, [0.0])[0][0] for at_ns in (0, 100_000, 200_000)]
    # parsed by 0.5, 1.0 and 1.5 ms: the first two close at 2.5 ms, the third opens a batch closing at 3.5 ms
    assert handed == [2_500_000, 2_500_000, 3_500_000]


def test_in_a_burst_the_wait_hides_behind_the_parsing():
    # Three requests at once, 1 ms each to parse, 2 ms each to tokenize: parsed by 1, 2 and 3 ms, all in the
    # batch that closes at 3 ms, which the CPU reaches only then: the same hand-offs as without batching.
    def handed(wait_s: float) -> list[int]:
        front = FrontEnd(Layout("api-server"), tokenizer_batch_wait_s=wait_s, tokenizer_batch_max=32)
        return [done_ns for done_ns, _, _ in front.requests([0, 0, 0], 1e-3, [2e-3] * 3)]

    assert handed(2e-3) == handed(0.0) == [5_000_000, 7_000_000, 9_000_000]


@settings(max_examples=60, deadline=None)
@given(arrivals=st.lists(st.lists(st.integers(0, 10**7), min_size=1, max_size=4), min_size=1, max_size=12),
       first_ns=st.integers(0, 10**6), then_ns=st.integers(0, 10**6), wait_ns=st.integers(1, 5 * 10**6),
       most=st.integers(1, 40))
def test_the_wait_delays_a_hand_off_by_at_most_itself_and_never_takes_the_cpu(arrivals, first_ns, then_ns,
                                                                              wait_ns, most):
    """Against the same requests without batching: each request's work and the process's busy time are
    unchanged, and it reaches the engine no earlier and at most one wait later."""
    batched = FrontEnd(Layout("api-server"), tokenizer_batch_wait_s=wait_ns / 1e9, tokenizer_batch_max=most)
    plain = FrontEnd(Layout("api-server"))
    start = 0
    for group in arrivals:  # each call is one moment of the engine loop, its requests in arrival order
        group = sorted(start + at_ns for at_ns in group)
        start = group[-1]
        with_wait = batched.requests(group, first_ns / 1e9, [then_ns / 1e9] * len(group))
        without = plain.requests(group, first_ns / 1e9, [then_ns / 1e9] * len(group))
        for (done_ns, queue_ns, work_ns), (plain_done_ns, _, plain_work_ns), at_ns in zip(with_wait, without, group):
            assert work_ns == plain_work_ns
            assert plain_done_ns <= done_ns <= plain_done_ns + wait_ns
            assert done_ns == at_ns + queue_ns + work_ns
    assert batched.api_busy_ns == plain.api_busy_ns


def test_a_request_at_light_load_reaches_the_engine_one_wait_later():
    """vLLM 0.11.0 with requests a second apart: a request's way in is 2 ms longer with its batch wait, and
    the result's front-end queue carries it (all but the odd request, whose steps' tokens then share the
    front end's CPU at other times)."""
    def run(wait: str):
        return simulate(load_scenario("typical", {
            "engine.scheduler": "vllm-v1", "engine.version": "0.11.0", "delivery.tokenizer_batch_wait": wait,
            "workload.num_requests": 40, "workload.arrival.rate": 1.0})).run

    waiting, plain = run("2 ms"), run("0 s")
    longer_ns = waiting.upload_ns - plain.upload_ns
    assert np.mean(longer_ns == 2_000_000) >= 0.9 and np.all(np.abs(longer_ns - 2_000_000) < 100_000)
    assert np.mean(waiting.frontend_queue_ns - plain.frontend_queue_ns == 2_000_000) >= 0.9


def test_a_release_that_batches_is_offered_one_that_does_not():
    from tokenpath.whatif.catalog import catalog

    lever = "prompts tokenized without a batch wait (vLLM 0.24.0 on)"
    batching = {item.name: item for item in catalog(load_scenario("typical", {"engine.version": "0.11.0"}), {}, None)}
    assert batching[lever].overrides == {"delivery.tokenizer_batch_wait": "0 s"}
    assert lever not in {item.name for item in catalog(load_scenario("typical", {}), {}, None)}
