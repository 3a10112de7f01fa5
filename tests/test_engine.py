"""The engine loop against closed-form answers, with step costs we choose."""

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import reference_engine as reference_module
from engine_state import replica_leftovers
from reference_engine import reference_engine
from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.engine.loop import _trace as trace_of
from tokenpath.engine.loop import run_engine
from tokenpath.engine.replica import Replica
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.speculative import Speculation, SpeculativeSpec
from tokenpath.engine.trace_rows import Rows

NO_NETWORK = DeliverySpec(
    network_rtt=0, host_link_latency=0, detokenize_per_token=0, frame_per_event=0,
    event_overhead_bytes=0, bytes_per_token=0, request_overhead_bytes=0,
    frontend_per_request=0, chat_template_per_request=0, tokenize_per_token=0,
)


class FixedCosts:
    """Every step costs `base_s` plus `per_token_s` per token processed and `per_sequence_s` per sequence
    sampled, plus `scheduler_s` when it calls the scheduler; traffic a fixed share."""

    speculation = None  # no speculative decoding
    draft_s = None
    attention_ranks = 1

    def __init__(self, base_s=1e-3, per_token_s=0.0, traffic_s=0.0, scheduler_s=0.0, per_sequence_s=0.0):
        self.base_s, self.per_token_s, self._traffic_s, self.scheduler_s = base_s, per_token_s, traffic_s, scheduler_s
        self.per_sequence_s = per_sequence_s

    def compute_s(self, num_tokens, num_logits, attn_pairs, kv_read_tokens, chunk_context_tokens, scheduled,
                  traffic_s, ahead_s, prompt_on_busiest=None, sequences=None):
        sampled = num_logits if sequences is None else sequences
        return (self.base_s + self.per_token_s * num_tokens + self.per_sequence_s * sampled
                + (self.scheduler_s if scheduled else 0.0))

    def host_busy_s(self, num_tokens, num_logits, scheduled, sequences=None):
        return self.scheduler_s if scheduled else 0.0

    def traffic_s(self, num_tokens, decode_only):
        return self._traffic_s


def engine(inputs, outputs, arrivals_s=None, spec=EngineSpec(), costs=None, delivery=NO_NETWORK,
           kv_tokens=10**9, max_concurrency=None):
    inputs, outputs = np.array(inputs), np.array(outputs)
    arrivals = (np.zeros(len(inputs), np.int64) if arrivals_s is None
                else np.rint(np.array(arrivals_s) * 1e9).astype(np.int64))
    return run_engine(arrivals, inputs, outputs, costs or FixedCosts(), LastMile(delivery), spec, kv_tokens,
                      max_concurrency)


def both_engines(args, delivery, spec, kv_tokens, concurrency, cached):
    """The replica's trace and the reference engine's of the same run, checked to be the same."""
    fast = run_engine(*args, LastMile(delivery), spec, kv_tokens, concurrency, cached_tokens=cached)
    slow = reference_engine(*args, LastMile(delivery), spec, kv_tokens, concurrency, cached_tokens=cached)
    assert_same_trace(fast, slow)
    return fast, slow


def test_single_request_takes_one_prefill_step_then_one_step_per_token():
    trace = engine([100], [5])
    # prefill step emits token 1, four decode steps emit the rest: five 1 ms steps
    assert len(trace.step_start_ns) == 5
    assert trace.last_step_end_ns[0] == 5_000_000
    assert trace.compute_ns[0] == 5_000_000
    assert list(trace.token_steps()) == [0, 1, 2, 3, 4]
    assert list(trace.step_tokens) == [100, 1, 1, 1, 1]


def test_chunked_prefill_splits_a_long_prompt_over_the_token_budget():
    trace = engine([250], [2], spec=EngineSpec(max_num_seqs=8, max_num_batched_tokens=100))
    assert list(trace.step_tokens) == [100, 100, 50, 1]
    assert list(trace.token_steps()) == [2, 3]  # the first token comes with the last prefill chunk
    # Each chunk's context is the prompt computed before it; the decode step has no prompt chunk.
    assert list(trace.step_chunk_context_tokens) == [0, 100, 200, 0]
    assert list(trace.step_kv_read_tokens) == [100, 200, 250, 251]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False)
    trace = engine([60, 60], [3, 3], spec=spec)
    # the second prompt does not fit beside the first; it joins the next step with one decode
    assert list(trace.step_tokens[:2]) == [60, 61]


def test_without_chunked_prefill_sglang_runs_a_prompt_longer_than_the_budget_alone_as_its_steps_first():
    # SGLang's PrefillAdder admits the step's first prompt above its input cap whole (schedule_policy.py,
    # "Without chunking, allow the first request even above the input cap"); the others wait for room.
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False,
                      host_overlap=False)
    trace = engine([250, 60, 30], [2, 2, 2], spec=spec)
    assert list(trace.step_tokens[:3]) == [250, 90, 3]  # alone; then the two that fit; then their decodes
    assert not EngineSpec(scheduler="prefill-first", chunked_prefill=False).step_bounds_prompts
    assert EngineSpec(scheduler="vllm-v0", chunked_prefill=False).step_bounds_prompts  # V0 ignores such prompts


def test_without_chunked_prefill_sglang_takes_a_later_prompt_only_below_the_budget_left():
    # SGLang's PrefillAdder stops at a prompt after the step's first whose tokens reach the input cap left
    # (`input_tokens >= rem_input_tokens`, schedule_policy.py): 100 tokens a step hold two 50-token prompts
    # under vLLM V0, one under SGLang.
    limits = dict(max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False)
    sglang = engine([50, 50, 50], [2, 2, 2], spec=EngineSpec(scheduler="prefill-first", host_overlap=False, **limits))
    assert list(sglang.step_tokens) == [50, 50, 50, 3]
    assert list(sglang.first_step_start_ns) == [0, 1_000_000, 2_000_000]
    v0 = engine([50, 50, 50], [2, 2, 2], spec=EngineSpec(scheduler="vllm-v0", **limits))
    assert list(v0.step_tokens) == [100, 50, 3]


def test_without_chunked_prefill_a_request_no_step_holds_is_an_error_not_a_wait_forever():
    spec = EngineSpec(scheduler="trtllm", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False,
                      host_overlap=False)
    with pytest.raises(ValueError, match=r"needs 250 tokens in one step .* \(100\)"):
        engine([250, 60], [2, 2], spec=spec)


def test_max_num_seqs_limits_the_batch():
    trace = engine([10] * 5, [4] * 5, spec=EngineSpec(max_num_seqs=2))
    assert trace.step_seqs.max() == 2
    assert len(trace.token_steps()) == 20


@pytest.mark.parametrize("scheduler", ["vllm-v1", "trtllm"])
def test_an_overlapped_scheduler_frees_a_finished_requests_slot_for_the_batch_after_next(scheduler):
    """Two sequences at most, three requests. The first finishes in step 2; an overlapped scheduler has
    formed step 3's batch before it takes in step 2's outputs (vLLM V1's async scheduling, TensorRT-LLM's
    overlap executor), so its slot holds until step 4, where the third request starts."""
    def run(overlap):
        spec = EngineSpec(scheduler=scheduler, max_num_seqs=2, max_num_batched_tokens=100, host_overlap=overlap)
        return engine([10, 10, 10], [3, 6, 3], spec=spec)

    plain, lagged = run(False), run(True)
    assert plain.token_steps(0, 1).tolist() == lagged.token_steps(0, 1).tolist() == [0, 1, 2]
    assert plain.token_steps(2, 3).tolist() == [3, 4, 5]
    assert lagged.token_steps(2, 3).tolist() == [4, 5, 6]
    assert (len(plain.step_start_ns), len(lagged.step_start_ns)) == (6, 7)
    assert lagged.step_seqs.tolist() == [2, 2, 2, 1, 2, 2, 1]


def test_requests_wait_for_their_arrival():
    trace = engine([10, 10], [2, 2], arrivals_s=[0.0, 0.0105])
    # the engine idles from 2 ms until the second request arrives at 10.5 ms
    assert trace.step_start_ns[2] == 10_500_000
    assert trace.last_step_end_ns[1] == 12_500_000


def test_kv_cache_pressure_preempts_the_newest_and_still_finishes_everything():
    spec = EngineSpec(block_size=16, max_num_seqs=8)
    inputs, outputs = [64] * 6, [64] * 6
    trace = engine(inputs, outputs, spec=spec, kv_tokens=16 * 20)  # 20 blocks for 6 x 8 needed
    assert trace.preemptions > 0
    counts = np.diff(trace.token_offsets)
    assert list(counts) == outputs
    # every request's tokens come from strictly increasing steps
    for i in range(6):
        steps = trace.token_steps(i, i + 1)
        assert np.all(np.diff(steps) > 0)


def test_closed_loop_never_has_more_than_max_concurrency_outstanding():
    n, cap = 30, 4
    trace = engine([20] * n, list(range(1, n + 1)), spec=EngineSpec(), max_concurrency=cap)
    done = trace.last_step_end_ns  # no network: the client has the last byte when the step ends
    events = sorted([(t, 1) for t in trace.sent_ns] + [(t, -1) for t in done], key=lambda e: (e[0], e[1]))
    outstanding = peak = 0
    for _, delta in events:
        outstanding += delta
        peak = max(peak, outstanding)
    assert peak == cap
    assert (trace.sent_ns[cap:] > 0).all()


def test_detokenizing_in_the_engine_lengthens_steps_and_in_a_process_of_its_own_does_not():
    slow_host = dict(NO_NETWORK.model_dump(), detokenize_per_token=1e-3)
    inline = engine([10], [4], delivery=DeliverySpec(**{**slow_host, "detokenize": "engine"}))
    overlapped = engine([10], [4], delivery=DeliverySpec(**{**slow_host, "detokenize": "detokenizer"}))
    assert inline.last_step_end_ns[0] == 8_000_000  # 4 steps of 1 ms device + 1 ms host
    assert overlapped.last_step_end_ns[0] == 4_000_000
    # its own process: the detokenizer still needs 1 ms per token, so the last token leaves at 5 ms
    assert overlapped.step_leave_ns[-1] == 5_000_000


@pytest.mark.parametrize("seed", range(5))
def test_per_request_accounts_never_exceed_the_time_in_the_system(seed):
    rng = np.random.default_rng(seed)
    n = 40
    inputs = rng.integers(1, 400, n)
    outputs = rng.integers(1, 60, n)
    arrivals = np.sort(rng.uniform(0, 0.05, n))
    costs = FixedCosts(base_s=2e-4, per_token_s=1e-6, traffic_s=1e-4)
    trace = engine(inputs, outputs, arrivals, spec=EngineSpec(max_num_seqs=8, max_num_batched_tokens=256),
                   costs=costs, kv_tokens=16 * 60)
    in_system = trace.last_step_end_ns - trace.arrival_ns
    accounted = trace.compute_ns + trace.traffic_ns + trace.delivery_ns
    assert (accounted <= in_system).all()
    assert (trace.compute_ns > 0).all() and (trace.traffic_ns > 0).all()


# The most output tokens the reference comparisons draw for a request: a longer answer adds decode steps to
# both engines, not cases (the caches drawn, 12 blocks and up with up to 60 requests, still run short with
# answers this long, and preempt).
MOST_OUTPUT_TOKENS = 256


def draw_outputs(rng, n, room):
    """n output lengths from 1 to the `room` a request's prompt leaves it, at most MOST_OUTPUT_TOKENS."""
    return rng.integers(1, max(2, min(room, MOST_OUTPUT_TOKENS + 1)), n)


def random_lengths(rng, n, budget, block, kv_blocks, chunked):
    """Prompt and output lengths that always fit: a whole request within the KV cache, and without
    chunked prefill a prompt within one step's budget."""
    longest = min(budget, block * kv_blocks) if not chunked else block * kv_blocks
    inputs = rng.integers(1, max(2, longest // 2), n)
    return inputs, draw_outputs(rng, n, longest - inputs.max())


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    interval=st.integers(1, 4),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 256, 2048]),
    kv_blocks=st.integers(30, 400),
    chunked=st.booleans(),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    detokenize=st.sampled_from(["engine", "api-server", "detokenizer"]),
    prefilled=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_engine_matches_the_straightforward_reference_exactly(
        n, interval, max_seqs, budget, kv_blocks, chunked, concurrency, detokenize, prefilled, seed):
    rng = np.random.default_rng(seed)
    block = 16
    inputs, outputs = random_lengths(rng, n, budget, block, kv_blocks, chunked)
    arrivals = np.sort(rng.uniform(0, 0.05, n))
    costs = FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5, scheduler_s=1e-4)
    delivery = DeliverySpec(stream_interval=interval, detokenize=detokenize, detokenize_per_token=2e-5)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs),
                      chunked_prefill=chunked, block_size=block)
    scheduled = np.rint(arrivals * 1e9).astype(np.int64)
    args = (scheduled, inputs, outputs, costs)
    # Prefilled requests (a decode engine's): part of each prompt's KV arrives with it.
    cached = rng.integers(0, inputs) if prefilled else None
    fast = run_engine(*args, LastMile(delivery), spec, block * kv_blocks, concurrency, cached_tokens=cached)
    slow = reference_engine(*args, LastMile(delivery), spec, block * kv_blocks, concurrency, cached_tokens=cached)
    for field in fast.__dataclass_fields__:
        if field != "spans":  # the same tokens, merged into longer runs by the fast engine
            assert np.array_equal(getattr(fast, field), getattr(slow, field)), field
    assert np.array_equal(fast.token_steps(), slow.token_steps())


def test_preemption_is_exercised_by_the_reference_comparison():
    spec = EngineSpec(block_size=16, max_num_seqs=8)
    inputs, outputs = np.array([64] * 6), np.array([64] * 6)
    args = (np.zeros(6, np.int64), inputs, outputs, FixedCosts())
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, 16 * 20)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, 16 * 20)
    assert fast.preemptions == slow.preemptions > 0
    assert np.array_equal(fast.token_steps(), slow.token_steps())


def test_rows_moved_into_numpy_blocks_mid_run_give_the_same_trace(monkeypatch):
    # Step and span rows are buffered as Python ints and flushed into numpy blocks; a run long
    # enough to flush many times must match one that never does, field by field.
    rng = np.random.default_rng(3)
    n = 80
    args = (np.sort(rng.integers(0, 50_000_000, n)), rng.integers(1, 300, n), rng.integers(1, 60, n),
            FixedCosts(base_s=3e-4, per_token_s=2e-6))
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=128)
    whole = run_engine(*args, LastMile(NO_NETWORK), spec, 16 * 60)
    monkeypatch.setattr(Rows, "FLUSH_VALUES", 7)
    flushed = run_engine(*args, LastMile(NO_NETWORK), spec, 16 * 60)
    assert len(whole.step_start_ns) > 50 and whole.preemptions > 0
    for field in whole.__dataclass_fields__:
        assert np.array_equal(getattr(whole, field), getattr(flushed, field)), field


def test_a_replica_that_does_not_keep_its_rows_serves_the_same_steps_in_bounded_memory(monkeypatch):
    """A live server steps for as long as it runs and never reads its rows back: with keep_rows=False
    each flush drops them, and the steps it takes are the same."""
    monkeypatch.setattr(Rows, "FLUSH_VALUES", 64)
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=128)

    def serve(keep_rows):
        replica = Replica(FixedCosts(base_s=3e-4, per_token_s=2e-6), LastMile(NO_NETWORK), spec, 10**6,
                          record_emitters=True, keep_rows=keep_rows)
        for i in range(40):
            replica.submit(100 + i, 30, arrival_ns=i * 1_000_000)
        emitted, finished = [], []
        while not replica.idle:
            finished += replica.step()
            emitted.append(sorted(replica.rows.emitters))
        return replica, emitted, finished

    kept, emitted_kept, finished_kept = serve(True)
    dropped, emitted, finished = serve(False)
    assert (emitted, finished, dropped.now) == (emitted_kept, finished_kept, kept.now)
    assert dropped.num_steps > 100 and len(kept.rows.steps()["start_ns"]) == kept.num_steps
    rows = (dropped.rows.step_rows, dropped.rows.span_rows, dropped.rows.silent_rows, dropped.rows.tick_rows)
    assert all(not r.blocks and len(r.buffer) < 64 + 3 * 8 * 8 for r in rows)
    with pytest.raises(RuntimeError, match="keep_rows=False"):
        dropped.rows.steps()


def test_a_replica_says_when_its_next_step_starts_and_how_full_its_kv_cache_is():
    """What a router reads of each replica on a shared clock, asked of the replica itself."""
    spec = EngineSpec(max_num_seqs=8, max_num_batched_tokens=128, block_size=16)
    replica = Replica(FixedCosts(base_s=1e-3), LastMile(NO_NETWORK), spec, 16 * 100)
    assert (replica.next_step_ns(), replica.kv_used()) == (None, 0)  # nothing to do
    replica.submit(40, 3, arrival_ns=5_000_000)
    replica.submit(10, 2, arrival_ns=20_000_000)
    seen = [(replica.next_step_ns(), replica.kv_used())]
    while not replica.idle:
        replica.step()
        seen.append((replica.now, replica.next_step_ns(), round(replica.kv_used(), 9)))
    # idle, it steps when the next request arrives; busy, at once; a prompt of 40 tokens holds 3 of
    # the 100 blocks, one of 10 tokens holds 1
    assert seen == [(5_000_000, 0), (6_000_000, 6_000_000, 0.03), (7_000_000, 7_000_000, 0.03),
                    (8_000_000, 20_000_000, 0), (21_000_000, 21_000_000, 0.01), (22_000_000, None, 0)]


def state_of(replica, i):
    """Where request i is in the fast engine, between steps (finished: with its last token, if under multi-step
    still in its window)."""
    if replica.generated[i] >= replica.out[i]:
        return "finished"
    if i in replica.decoding:
        return "decoding"
    if any(prefill.request == i for prefill in replica.prefills):
        return "prefilling"
    if i in replica.waiting:
        return "preempted" if replica.generated[i] else "waiting"
    return "arriving"


def run_with_aborts(scheduled_ns, inputs, outputs, costs, host, spec, kv_capacity_tokens, cached, aborts, states=None,
                    prefixes=None):
    """run_engine's open loop, calling `Replica.abort` for the requests due just before each step
    (noting each one's state in `states`); once idle, the replica holds nothing any request left. (A step
    call that also runs SGLang's finished batch, Profile.runs_finished_batch, runs two steps: the aborts
    due before the second are made after it, which changes nothing, since that batch runs sequences already
    finished, and a request not yet taken in is withdrawn alike on either side of it.)"""
    replica = Replica(costs, host, spec, kv_capacity_tokens)
    upload = np.array([host.upload_ns(int(p)) for p in inputs], dtype=np.int64)
    replica.submit_all(inputs, outputs, scheduled_ns + upload, upload, cached, prefixes)
    returned = []
    most_steps = 2 * int(inputs.sum() + outputs.sum()) + 1000  # an engine that stops making progress fails
    next_step = 0  # the first step whose aborts are still to be made
    while not replica.idle:
        assert replica.num_steps < most_steps
        due = [i for step in range(next_step, replica.num_steps + 1) for i in aborts.get(step, ())]
        next_step = replica.num_steps + 1
        if states is not None:
            states += [state_of(replica, i) for i in due]
        returned += [replica.abort(i) for i in due]
        if not replica.idle:
            replica.step()
    assert replica_leftovers(replica) == []  # every block, slot and reference came back
    return trace_of(replica, scheduled_ns.tolist(), list(replica.out), kv_capacity_tokens), returned


ABORT_COSTS = FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5)


def draw_abort_steps(rng, share, scheduled, inputs, outputs, spec, kv_tokens, cached, delivery, costs=ABORT_COSTS,
                     prefixes=None):
    """For each request, with probability `share`, a step to abort it before (-1: never), drawn over
    the steps the same workload takes without aborts."""
    args = (scheduled, inputs, outputs, costs, LastMile(delivery), spec, kv_tokens, cached, {})
    steps = len(run_with_aborts(*args, prefixes=prefixes)[0].step_start_ns)
    return np.where(rng.random(len(inputs)) < share, rng.integers(0, steps + 2, len(inputs)), -1)


def assert_aborts_match(scheduled, inputs, outputs, spec, kv_tokens, cached, delivery, abort_steps, costs=ABORT_COSTS,
                        prefixes=None):
    """Abort request i just before step abort_steps[i] (-1: never) in both engines and compare the
    traces and what each abort returned; the states the aborted requests were in."""
    args = (scheduled, inputs, outputs, costs)
    aborts: dict[int, list[int]] = {}
    for i, step in enumerate(abort_steps):
        if step >= 0:
            aborts.setdefault(step, []).append(i)
    states: list[str] = []
    fast, fast_returned = run_with_aborts(*args, LastMile(delivery), spec, kv_tokens, cached, aborts, states, prefixes)
    slow_returned: list[bool] = []
    slow = reference_engine(*args, LastMile(delivery), spec, kv_tokens, cached_tokens=cached, aborts=aborts,
                            abort_results=slow_returned, prefixes=prefixes)
    assert_same_trace(fast, slow)
    assert fast_returned == slow_returned == [state != "finished" for state in states]
    return states


def test_aborting_the_last_running_request_frees_what_an_overlapped_scheduler_has_not_taken_in():
    """An overlapped scheduler takes in a finished request's outputs (its slot and KV blocks) once it has formed
    the next batch. If the next event is an abort that leaves nothing to run, they are taken in at once, as
    after a step that leaves nothing: the idle engine holds no blocks, and its next batch has every slot."""
    spec = EngineSpec(max_num_seqs=2, max_num_batched_tokens=64, block_size=16)
    replica = Replica(FixedCosts(base_s=1e-3), LastMile(NO_NETWORK), spec, 16 * 10)
    assert replica.finish_lag
    replica.submit(20, 1, arrival_ns=0)  # its one token comes with its prompt: it finishes in the first step
    replica.submit(40, 50, arrival_ns=0)
    replica.submit(10, 2, arrival_ns=50_000_000)
    replica.submit(10, 2, arrival_ns=50_000_000)
    assert replica.step() == [0]
    # request 0's outputs are not taken in yet: its 2 blocks are held
    assert ([u[0] for u in replica.unseen], replica.free_blocks, list(replica.decoding)) == ([0], 5, [1])
    assert replica.abort(1)
    assert (replica.unseen, replica.free_blocks, replica.kv_used()) == ([], 10, 0.0)  # (were: 8 free, 0.2 used)
    replica.step()  # at 50 ms both prompts run (with request 0's slot still held, only the first did)
    assert (replica.now, list(replica.decoding), replica.free_blocks) == (51_000_000, [2, 3], 8)
    while not replica.idle:
        replica.step()
    assert replica.free_blocks == 10
    assert replica.rows.steps()["start_ns"].tolist() == [0, 50_000_000, 51_000_000]


def test_an_abort_inside_a_multi_step_window_gives_back_the_windows_blocks_and_ends_a_window_it_empties():
    """Multi-step: a decode window takes each sequence's KV blocks for all its steps at once. A request aborted
    after the window's first step gives those back too, not only its context's; and a window left with no
    sequence ends, so that a request arriving later is prefilled at once, not after the window's empty steps."""
    spec = EngineSpec(scheduler="vllm-v0", chunked_prefill=False, num_scheduler_steps=4, block_size=4, max_num_seqs=8,
                      max_num_batched_tokens=64)
    replica = Replica(FixedCosts(base_s=1e-3), LastMile(NO_NETWORK), spec, 4 * 10)
    replica.submit(7, 9, arrival_ns=0)
    replica.submit(8, 3, arrival_ns=20_000_000)
    replica.step()  # its prompt: 7 tokens in 2 blocks, and its first token
    replica.step()  # the window's first step, which took a third block for the context's tokens 8 to 11
    assert (replica.window_left, replica.free_blocks, list(replica.decoding)) == (3, 7, [0])
    assert replica.abort(0)
    assert (replica.window_left, replica.free_blocks) == (0, 10)  # (were: 3 steps left, and 9 blocks: one lost)
    while not replica.idle:
        replica.step()
    steps = replica.rows.steps()
    # the later request's prompt runs when it arrives (was: at 23 ms, after three empty steps of 0 tokens)
    assert steps["start_ns"].tolist() == [0, 1_000_000, 20_000_000, 21_000_000, 22_000_000, 23_000_000, 24_000_000]
    assert steps["tokens"].tolist() == [7, 1, 8, 1, 1, 1, 1]
    assert replica.free_blocks == 10


@pytest.mark.parametrize("scheduler, version, preempted", [("vllm-v1", "0.18.0", True), ("vllm-v1", None, False),
                                                          ("vllm-v0", None, False)])
def test_a_prompt_waits_for_its_whole_kv_where_the_release_admits_only_that(scheduler, version, preempted):
    """Two 600-token prompts (200 outputs) in a cache of 64 blocks of 16, chunks of 256: the second's first
    chunk fits beside the first, its whole prompt (38 blocks) does not. vLLM 0.18.0 admits it and the two
    preempt each other over and over; from 0.19.0 (scheduler_reserve_full_isl), and in V0 (its block manager
    sizes the whole prompt), it waits for the first to finish, nothing preempted."""
    spec = EngineSpec(scheduler=scheduler, version=version, max_num_seqs=8, max_num_batched_tokens=256,
                      host_overlap=False, prefix_caching=False, block_size=16)
    trace = engine([600, 600], [200, 200], arrivals_s=[0, 0.0005], spec=spec, kv_tokens=1024,
                   costs=FixedCosts(base_s=1e-3, per_token_s=2e-5))
    assert (trace.preemptions > 10) is preempted
    if not preempted:
        assert trace.preemptions == 0 and trace.first_step_start_ns[1] == trace.last_step_end_ns[0]
        assert int(trace.step_tokens.sum()) == 2 * (600 + 199)  # nothing computed twice


def test_aborts_in_every_state_match_the_reference():
    rng = np.random.default_rng(348)  # a draw that aborts requests in each of the six states
    n, block = 12, 16
    inputs, outputs = rng.integers(1, 300, n), rng.integers(1, 80, n)
    scheduled = np.rint(np.sort(rng.uniform(0, 0.02, n)) * 1e9).astype(np.int64)
    # vLLM 0.18.0 admits a prompt whose first chunk fits, so prompts are preempted mid-prefill too (from 0.19.0
    # the whole prompt must fit: engine/profiles.py's VLLM_WHOLE_PROMPT_ADMISSION_SINCE; ABORT_PROFILES draw it)
    spec = EngineSpec(max_num_seqs=4, max_num_batched_tokens=64, chunked_prefill=True, block_size=block,
                      version="0.18.0")
    workload = (scheduled, inputs, outputs, spec, block * 24, np.zeros(n, np.int64), NO_NETWORK)
    abort_steps = draw_abort_steps(rng, 1.0, *workload)
    states = assert_aborts_match(*workload, abort_steps)
    assert set(states) == {"arriving", "waiting", "prefilling", "decoding", "preempted", "finished"}


# Every profile serve runs, with and without the settings that change what an abort finds: an overlapped
# scheduler (finished requests it has not taken in), multi-step windows, prefix caching (what a preempted request
# left cached), mixed chunks.
ABORT_PROFILES = [{}, {"host_overlap": False}, {"prefix_caching": False}, {"scheduler": "vllm-v0"},
                  {"scheduler": "vllm-v0", "chunked_prefill": False, "num_scheduler_steps": 3},
                  {"scheduler": "prefill-first"}, {"scheduler": "prefill-first", "host_overlap": False},
                  {"scheduler": "prefill-first", "num_scheduler_steps": 3},
                  {"scheduler": "prefill-first", "mixed_chunk": True, "chunked_prefill": True},
                  {"scheduler": "trtllm"}, {"scheduler": "trtllm", "kv_admission": "on_demand"}]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    interval=st.integers(1, 3),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 256]),
    kv_blocks=st.integers(30, 200),
    chunked=st.booleans(),
    prefilled=st.booleans(),
    share=st.sampled_from([0.2, 0.5, 1.0]),
    profile=st.sampled_from(ABORT_PROFILES),
    seed=st.integers(0, 2**16),
)
# The last running request is aborted the step after another finished: an overlapped scheduler must take in
# that one's outputs (its KV blocks) then, with nothing left to run, or they stay held while it idles.
@example(n=30, interval=1, max_seqs=8, budget=64, kv_blocks=31, chunked=True, prefilled=True, share=1.0,
         profile={}, seed=105)
# Multi-step: a request aborted inside a window gives back the blocks the window took for it, and a window it
# leaves empty ends (test_an_abort_inside_a_multi_step_window_...); one that has made its last token inside the
# open window has finished, its abort a no-op, and leaves with the window.
@example(n=6, interval=1, max_seqs=8, budget=64, kv_blocks=30, chunked=False, prefilled=False, share=1.0,
         profile=ABORT_PROFILES[4], seed=0)
@example(n=6, interval=1, max_seqs=8, budget=64, kv_blocks=30, chunked=False, prefilled=False, share=1.0,
         profile=ABORT_PROFILES[7], seed=1)
def test_random_aborts_give_the_same_trace_in_both_engines(
        n, interval, max_seqs, budget, kv_blocks, chunked, prefilled, share, profile, seed):
    # Requests aborted before random steps (arriving, queued, prefilling, decoding, preempted or done):
    # both engines keep the tokens made, free the same blocks and run the rest identically.
    rng = np.random.default_rng(seed)
    block = 16
    settings_ = {"chunked_prefill": chunked, **profile}
    inputs, outputs = random_lengths(rng, n, budget, block, kv_blocks, settings_["chunked_prefill"])
    scheduled = np.rint(np.sort(rng.uniform(0, 0.02, n)) * 1e9).astype(np.int64)
    cached = rng.integers(0, inputs) if prefilled else np.zeros(n, np.int64)
    delivery = DeliverySpec(stream_interval=interval, detokenize_per_token=2e-5)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=block,
                      **settings_)
    workload = (scheduled, inputs, outputs, spec, block * kv_blocks, cached, delivery)
    assert_aborts_match(*workload, draw_abort_steps(rng, share, *workload))


# -- scheduler profiles ------------------------------------------------------------------------------

def assert_same_trace(fast, slow, ignore=()):
    """Every field of two traces equal but those in `ignore`; spans compared as the step of each token (the
    fast engine merges them into runs of decode ticks)."""
    for field in fast.__dataclass_fields__:
        if field not in ("spans", "tick_steps", *ignore):
            assert np.array_equal(getattr(fast, field), getattr(slow, field)), field
    assert np.array_equal(fast.token_steps(), slow.token_steps())


PROFILES = {
    "prefill-first": dict(scheduler="prefill-first"),
    "prefill-first, mixed chunks": dict(scheduler="prefill-first", mixed_chunk=True, chunked_prefill=True),
    "prefill-first, multi-step": dict(scheduler="prefill-first", num_scheduler_steps=None),  # steps drawn below
    "vllm-v0": dict(scheduler="vllm-v0"),
    "vllm-v0, multi-step": dict(scheduler="vllm-v0", chunked_prefill=False, num_scheduler_steps=None),
    "trtllm, reserve": dict(scheduler="trtllm", kv_admission="reserve"),
    "trtllm, on demand": dict(scheduler="trtllm", kv_admission="on_demand"),
}


@pytest.mark.parametrize("profile", PROFILES)
@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 40),
    interval=st.integers(1, 4),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 100, 256, 2048]),
    kv_blocks=st.integers(30, 400),
    chunked=st.booleans(),
    window=st.integers(2, 5),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    detokenize=st.sampled_from(["engine", "api-server", "detokenizer"]),
    prefilled=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_profile_matches_its_straightforward_reference_exactly(
        profile, n, interval, max_seqs, budget, kv_blocks, chunked, window, concurrency, detokenize, prefilled, seed):
    settings_ = {"chunked_prefill": chunked, **PROFILES[profile]}
    if "num_scheduler_steps" in settings_:
        settings_["num_scheduler_steps"] = window
    chunked = settings_["chunked_prefill"]
    rng = np.random.default_rng(seed)
    block = 16
    # Requests up to 1,500 tokens (fewer steps than the vllm-v1 test's): the cache still runs short.
    longest = min(budget, block * kv_blocks) if not chunked else min(1500, block * kv_blocks)
    inputs = rng.integers(1, max(2, longest // 2), n)
    outputs = draw_outputs(rng, n, longest - inputs.max())
    arrivals = np.sort(rng.uniform(0, 0.05, n))
    costs = FixedCosts(base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5, scheduler_s=1e-4)
    delivery = DeliverySpec(stream_interval=interval, detokenize=detokenize, detokenize_per_token=2e-5)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=block,
                      **settings_)
    args = (np.rint(arrivals * 1e9).astype(np.int64), inputs, outputs, costs)
    cached = rng.integers(0, inputs) if prefilled else None
    fast, _ = both_engines(args, delivery, spec, block * kv_blocks, concurrency, cached)
    if spec.kv_admission == "reserve":
        assert fast.preemptions == 0


def reference_traces(args, spec, kv_tokens):
    """The reference's trace, the trace it gives taking every step by its general rules (no decode-only
    stretch), and how many of the first's steps its stretches took."""
    stretch_steps = []
    decode_run = reference_module._Replica.decode_run

    def counted(replica):
        stretch_steps.append(decode_run(replica))
        return stretch_steps[-1]

    with patch.object(reference_module._Replica, "decode_run", counted):
        shortcut = reference_engine(*args, LastMile(NO_NETWORK), spec, kv_tokens)
    with patch.object(reference_module._Replica, "decode_run", lambda replica: 0):
        general = reference_engine(*args, LastMile(NO_NETWORK), spec, kv_tokens)
    return shortcut, general, sum(stretch_steps)


@pytest.mark.parametrize("profile", ["vllm-v1", *(name for name in PROFILES if "multi-step" not in name)])
@settings(max_examples=5, deadline=None)
@given(n=st.integers(2, 16), max_seqs=st.sampled_from([2, 8, 64]), budget=st.sampled_from([64, 256]),
       kv_blocks=st.integers(12, 40), chunked=st.booleans(), seed=st.integers(0, 2**16))
def test_the_references_decode_stretches_give_its_general_steps_trace(profile, n, max_seqs, budget, kv_blocks,
                                                                       chunked, seed):
    # A stretch runs while the queue's head cannot be admitted (reference_engine.py's head_waits): a cache
    # that holds a few requests keeps a queue waiting on KV blocks through most of these runs. (Multi-step
    # windows take no stretch: those profiles are not drawn.)
    settings_ = {"chunked_prefill": chunked, **PROFILES.get(profile, {})}
    rng = np.random.default_rng(seed)
    inputs, outputs = random_lengths(rng, n, budget, 16, kv_blocks, settings_["chunked_prefill"])
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=16,
                      **settings_)
    args = (np.sort(rng.integers(0, 20_000_000, n)), inputs, outputs, FixedCosts(base_s=3e-4, per_token_s=2e-6))
    shortcut, general, _ = reference_traces(args, spec, 16 * kv_blocks)
    assert_same_trace(shortcut, general)


def test_a_queue_waiting_on_the_cache_runs_in_decode_stretches():
    # Two requests of 300 + 100 tokens fill a 50-block cache; the third waits for one to finish, and the
    # steps until then are a stretch in which every running sequence only decodes.
    args = (np.zeros(3, np.int64), np.array([300, 300, 300]), np.array([100, 100, 100]), FixedCosts())
    shortcut, general, stretched = reference_traces(args, EngineSpec(block_size=16, max_num_seqs=8), 16 * 50)
    assert shortcut.preemptions == 0
    assert stretched >= 95
    assert_same_trace(shortcut, general)


@pytest.mark.parametrize("profile", ["prefill-first", "prefill-first, multi-step", "trtllm, on demand"])
def test_preemption_is_exercised_by_each_profile_comparison(profile):
    settings_ = {**PROFILES[profile]}
    if "num_scheduler_steps" in settings_:
        settings_["num_scheduler_steps"] = 3
    spec = EngineSpec(block_size=16, max_num_seqs=8, **settings_)
    inputs, outputs, kv_tokens = np.array([64] * 6), np.array([64] * 6), 16 * 20
    if spec.scheduler == "prefill-first":
        # SGLang's headroom admits the first two, and the third once the first has left and its ratio has
        # decayed; it over-admits only then, the outputs longer than their clipped estimates (new_token_ratio.py).
        inputs, outputs, kv_tokens = np.array([16, 16, 16]), np.array([700, 5000, 5000]), 16 * 400
    args = (np.zeros(len(inputs), np.int64), inputs, outputs, FixedCosts())
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, kv_tokens)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, kv_tokens)
    assert fast.preemptions == slow.preemptions > 0
    assert_same_trace(fast, slow)



def test_a_sequence_recomputed_at_once_finishes_once():
    # prefill-first's batches (vLLM V0's, which admits without SGLang's headroom), 4 blocks of 16
    # tokens. In the first decode step both sequences need a block: B, the newest, is preempted, A
    # samples its last token and frees its blocks, and B's recompute is the next step's prefill. The
    # decode clock stopped there, so B is due to finish at the same tick as before its preemption, and
    # must finish once. (Without prefix caching, V0's default, B recomputes all 49 tokens.)
    spec = EngineSpec(scheduler="vllm-v0", chunked_prefill=False, block_size=16, max_num_seqs=8,
                      max_num_batched_tokens=256)
    args = (np.zeros(2, np.int64), np.array([16, 48]), np.array([2, 10]), FixedCosts())
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, 64)
    assert fast.preemptions == 1
    assert list(fast.step_tokens) == [64, 1, 49] + [1] * 8
    assert list(fast.token_steps(1, 2)) == [0] + list(range(2, 11))
    assert_same_trace(fast, reference_engine(*args, LastMile(NO_NETWORK), spec, 64))

def test_prefill_first_pauses_decoding_for_a_newcomers_prefill():
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False,
                      host_overlap=False)
    # A decodes; B arrives during A's third step and is prefilled in a step of its own.
    trace = engine([10, 50], [5, 2], arrivals_s=[0.0, 0.0025], spec=spec)
    assert list(trace.step_tokens) == [10, 1, 1, 50, 2, 1]
    assert list(trace.step_seqs) == [1, 1, 1, 1, 2, 1]
    assert list(trace.token_steps(0, 1)) == [0, 1, 2, 4, 5]  # A's gap spans B's prefill step
    assert list(trace.token_steps(1, 2)) == [3, 4]
    # A took part in 5 of the 6 one-millisecond steps: the prefill step is queue for it.
    assert trace.compute_ns[0] == 5_000_000 and trace.last_step_end_ns[0] == 6_000_000
    mixed = engine([10, 50], [5, 2], arrivals_s=[0.0, 0.0025],  # vllm-v1 without its async scheduling (< 0.14.0)
                   spec=EngineSpec(max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False,
                                   host_overlap=False))
    assert list(mixed.step_tokens) == [10, 1, 1, 51, 2]  # vllm-v1: B's prompt rides with A's decode
    assert mixed.compute_ns[0] == 5_000_000 and mixed.last_step_end_ns[0] == 5_000_000


def test_an_overlapped_scheduler_admits_a_newcomer_one_step_later():
    # As above, with the host overlapped (SGLang's and TensorRT-LLM's default): the batch of A's fourth
    # step was formed when its third started, before B arrived, so B's prefill waits one more step. (SGLang
    # 0.5.21, the last release that runs the batch it formed for finished sequences, below.)
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False,
                      version="0.5.21")
    trace = engine([10, 50], [5, 2], arrivals_s=[0.0, 0.0025], spec=spec)
    # (the last step: the batch formed while A and B's last tokens were made decodes them once more, below)
    assert list(trace.step_tokens) == [10, 1, 1, 1, 50, 2, 2]
    assert list(trace.token_steps(1, 2)) == [4, 5]  # B arrived at 2.5 ms; its prefill runs from 4 ms
    # An idle engine forms its batch when a request arrives: B alone is prefilled at once, once the batch
    # that decodes A's finished sequence once more has run.
    alone = engine([10, 50], [1, 2], arrivals_s=[0.0, 0.0025], spec=spec)
    assert list(alone.step_start_ns) == [0, 1_000_000, 2_500_000, 3_500_000, 4_500_000]


@pytest.mark.parametrize(("arrival_ms", "sglang_prefill_ms", "sglang_steps"), [
    (1.5, 3.0, 5),  # came before the batch after A's last step was formed (at 2 ms): that batch is B's prompt
    (2.5, 4.0, 6),  # came while A's last step ran: formed after it, behind the batch A still runs in
    (3.5, 4.0, 6),  # came while that batch ran
    (4.5, 4.5, 6),  # came to an idle engine
])
def test_sglang_runs_the_batch_it_formed_for_finished_sequences_before_a_newcomer(
        arrival_ms, sglang_prefill_ms, sglang_steps):
    """SGLang's overlapped loop launches the batch after a step before it takes that step's outputs in, so
    the sequences that finished in the step decode once more in it, their tokens dropped, and a request
    received meanwhile joins the batch after it (Profile.runs_finished_batch), up to 0.5.21. TensorRT-LLM, and
    SGLang from 0.5.22, leave a request that has made its last token out of the next batch: its newcomer
    starts as it arrives."""
    limits = dict(max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False)
    arrivals = [0.0, arrival_ms / 1e3]
    # A: its prompt at 0-1 ms and two decodes, its last token at 3 ms; B: a prompt and one token
    sglang = engine([10, 50], [3, 1], arrivals_s=arrivals,
                    spec=EngineSpec(scheduler="prefill-first", version="0.5.21", **limits))
    assert sglang.step_start_ns[sglang.token_steps(1, 2)[0]] == sglang_prefill_ms * 1e6
    assert len(sglang.step_start_ns) == sglang_steps  # B's finished sequence decodes once more too
    if sglang_steps == 6:
        assert sglang.step_start_ns[3] == 3_000_000 and sglang.step_tokens[3] == 1  # A's extra decode
    assert sglang.compute_ns.tolist() == [3_000_000, 1_000_000]  # no request is charged for a dropped decode
    for spec in (EngineSpec(scheduler="trtllm", **limits), EngineSpec(scheduler="prefill-first", **limits)):
        newer = engine([10, 50], [3, 1], arrivals_s=arrivals, spec=spec)
        assert newer.step_start_ns[newer.token_steps(1, 2)[0]] == max(arrival_ms, 3.0) * 1e6
        assert len(newer.step_start_ns) == 4


def test_prefill_first_runs_a_chunked_prompt_back_to_back():
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=True,
                      host_overlap=False)
    trace = engine([10, 250], [6, 2], arrivals_s=[0.0, 0.0015], spec=spec)
    assert list(trace.step_tokens) == [10, 1, 100, 100, 50, 2, 1, 1, 1]
    assert list(trace.token_steps(0, 1)) == [0, 1, 5, 6, 7, 8]
    assert list(trace.token_steps(1, 2)) == [4, 5]
    assert trace.compute_ns[1] == 4_000_000  # B's three chunks and its decode


def test_prefill_first_with_mixed_chunks_forms_the_batches_of_vllm_v1():
    rng = np.random.default_rng(7)
    n = 60
    args = ([int(x) for x in rng.integers(1, 400, n)], [int(x) for x in rng.integers(1, 80, n)],
            np.sort(rng.uniform(0, 0.03, n)))
    limits = dict(max_num_seqs=16, max_num_batched_tokens=128)
    # A cache with room: SGLang's admission headroom (new_token_ratio.py), which vLLM lacks, never binds.
    mixed = engine(*args, spec=EngineSpec(scheduler="prefill-first", mixed_chunk=True, version="0.5.21", **limits),
                   kv_tokens=10**9)
    v1 = engine(*args, spec=EngineSpec(**limits), kv_tokens=10**9)
    # Its overlapped loop (0.5.21) runs a batch more at the end, the sequences that finished last decoding once
    # more (Profile.runs_finished_batch): the same steps before it. (Only the overlapped host launches a step
    # ahead, which these costs do not read.)
    steps = [field for field in mixed.__dataclass_fields__ if field.startswith("step_") and field != "step_ahead_ns"]
    assert_same_trace(mixed, v1, ignore=("step_ahead_ns", *steps))
    assert len(mixed.step_start_ns) == len(v1.step_start_ns) + 1
    for field in steps:
        assert np.array_equal(getattr(mixed, field)[:-1], getattr(v1, field)), field


@pytest.mark.parametrize(("chunked", "same_as", "kv_tokens"), [
    (False, dict(scheduler="prefill-first", host_overlap=False), 10**9),  # SGLang's headroom never binds
    (True, dict(scheduler="vllm-v1", host_overlap=False), 16 * 80)])  # V1 before its async scheduling
def test_vllm_v0_forms_the_batches_of_prefill_first_or_with_chunked_prefill_of_vllm_v1(chunked, same_as, kv_tokens):
    """V0's _schedule_default runs prompts in steps of their own; _schedule_chunked_prefill mixes them with
    the decodes. Its host is never overlapped, so the batches match prefill-first's without the overlap
    (where the cache has room: V0 has no admission headroom)."""
    rng = np.random.default_rng(11)
    n = 60
    args = ([int(x) for x in rng.integers(1, 120, n)], [int(x) for x in rng.integers(1, 80, n)],
            np.sort(rng.uniform(0, 0.03, n)))
    # (prefix caching as V0's default has it, off: else a preempted request finds what it computed)
    # 16-token blocks for both (vLLM V1's until 0.34.0)
    # (without chunked prefill a step holds the longest request whole, its recompute: vLLM refuses a smaller one)
    limits = dict(max_num_seqs=16, max_num_batched_tokens=128 if chunked else 200, chunked_prefill=chunked,
                  prefix_caching=False, block_size=16)
    v0 = engine(*args, spec=EngineSpec(scheduler="vllm-v0", **limits), kv_tokens=kv_tokens)
    other = engine(*args, spec=EngineSpec(**same_as, **limits), kv_tokens=kv_tokens)
    assert v0.preemptions > 0 or kv_tokens == 10**9
    assert EngineSpec(scheduler="vllm-v0", **limits).prefills_alone == (not chunked)
    assert_same_trace(v0, other)


def test_sglangs_headroom_keeps_an_overloaded_cache_from_thrashing():
    """Without headroom (vLLM V0's batches) 40 requests of 800 tokens each, on a cache of 3,200, are
    admitted as their prompts fit, run out of blocks and are preempted and recomputed over and over;
    SGLang's new_token_ratio admits three (the fourth's 800 tokens do not fit below the 800 left) and,
    refused, admits none until a request leaves: batches of three that never retract."""
    inputs, outputs = [200] * 40, [600] * 40
    limits = dict(max_num_seqs=64, max_num_batched_tokens=8192, chunked_prefill=False)
    sglang = engine(inputs, outputs, spec=EngineSpec(scheduler="prefill-first", host_overlap=False, **limits),
                    kv_tokens=16 * 200)
    v0 = engine(inputs, outputs, spec=EngineSpec(scheduler="vllm-v0", **limits), kv_tokens=16 * 200)
    assert v0.preemptions > 0 == sglang.preemptions
    once = 40 * (200 + 600 - 1)  # every token computed once
    assert int(sglang.step_tokens.sum()) == once < 1.5 * once < int(v0.step_tokens.sum())
    assert sglang.step_seqs.max() == 3 < v0.step_seqs.max()


def test_sglang_puts_a_retracted_request_behind_the_waiting_ones():
    """SGLang appends a retracted request to its waiting queue (scheduler.py, _add_request_to_queue), which
    first come first served does not sort. A 42-token cache, 1 ms steps: request 0 (6 + 20 tokens) from
    2 ms; at 5 ms request 1 (3 + 19) fits beside it and request 2 (4 + 25) does not. At 21 ms the cache is
    full and request 1 (16 tokens made, against 18) is retracted, behind request 2. When request 0 ends at
    23 ms request 2 runs, request 1 (19 tokens to recompute, 3 to make) not beside it, so it runs after 2
    ends at 48 ms (at the front of the queue: request 1 at 23 ms, ending at 26 ms, and request 2 after)."""
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=1000, block_size=1,
                      host_overlap=False)
    trace = engine([6, 3, 4], [20, 19, 25], arrivals_s=[0.002, 0.005, 0.005], spec=spec, kv_tokens=42)
    assert list(trace.times_preempted) == [0, 1, 0]
    assert list(trace.first_step_start_ns) == [2_000_000, 5_000_000, 23_000_000]
    assert list(trace.last_step_end_ns) == [23_000_000, 51_000_000, 48_000_000]  # (at the front: 26 and 51 ms)


def test_the_new_token_ratio_decays_resets_on_retraction_and_when_idle():
    from tokenpath.engine.new_token_ratio import (
        CLIP_MAX_NEW_TOKENS_ESTIMATION,
        INIT_NEW_TOKEN_RATIO,
        NewTokenRatio,
        new_request_tokens,
    )

    ratio = NewTokenRatio()
    assert ratio.value == INIT_NEW_TOKEN_RATIO == 0.7
    for _ in range(300):
        ratio.decoded()
    assert ratio.value == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    for _ in range(400):
        ratio.decoded()
    assert ratio.value == pytest.approx(0.098)  # SGLang's floor: 0.14 of the initial ratio
    ratio.retracted(decoded_tokens=300, max_new_tokens=1000, running=5)  # (300 + 20 x 5) / (1000 + 1)
    assert ratio.value == pytest.approx(400 / 1001)
    ratio.retracted(decoded_tokens=990, max_new_tokens=1000, running=5)
    assert ratio.value == 1.0
    ratio.idle()
    assert ratio.value == 0.7
    assert ratio.spare_tokens(1000, 500) == pytest.approx(650)
    assert new_request_tokens(100, 10_000, 10**6) == 100 + CLIP_MAX_NEW_TOKENS_ESTIMATION
    assert new_request_tokens(100, 10_000, 1000) == 999  # one that alone fits an empty cache is admitted


def test_sglang_admits_none_after_a_refusal_until_a_request_leaves():
    """A NO_TOKEN from SGLang's PrefillAdder sets running_batch.batch_is_full, and no prefill is tried until
    a request leaves the running batch (scheduler.py). A 40-token cache, 1 ms steps: request 1 (8 + 18
    tokens) does not fit at 0 ms beside request 0 (2 + 17: 21 tokens left); at 1 ms it would (38 free less
    0.7 x 16 to come), but it waits until request 0 ends at 17 ms (trying every step: it ran at 1 ms, both
    overran the cache and request 1 was retracted)."""
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=1000, block_size=1,
                      host_overlap=False)
    trace = engine([2, 8], [17, 18], spec=spec, kv_tokens=40)
    assert trace.preemptions == 0
    assert list(trace.first_step_start_ns) == [0, 17_000_000]
    assert list(trace.last_step_end_ns) == [17_000_000, 35_000_000]


def test_sglang_retracts_the_request_with_the_fewest_tokens_made_then_the_longest_prompt():
    """SGLang's retract_decode retracts first the running request with the fewest output tokens, then the
    longest prompt (schedule_batch.py), not the newest. A 53-token cache, 1 ms steps: request 0 (2 + 32
    tokens) pauses while request 1 (1 + 28, from 1 ms) runs its prompt, so both have made 26 tokens when
    the cache is full at step 27. Request 0, the longer prompt, is retracted; request 1 ends at 29 ms, and
    request 0, recomputed (28 tokens) once it is done, at 35 ms (retracting the newest: 33 and 35 ms)."""
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=1000, block_size=1,
                      host_overlap=False)
    trace = engine([2, 1], [32, 28], arrivals_s=[0, 0.001], spec=spec, kv_tokens=53)
    assert list(trace.times_preempted) == [1, 0]
    assert list(trace.last_step_end_ns) == [35_000_000, 29_000_000]


def test_sglangs_headroom_clips_each_running_requests_outputs_to_come():
    """SGLang reserves new_token_ratio x min(outputs to come, 4,096) for each running request
    (PrefillAdder._get_running_request_total_token_offset). A 9,100-token cache: request 0 (10 + 9,000)
    made its first token at step 0; at step 1 the cache has 9,090 free, less 0.7 x 4,096 = 2,867.2, so
    request 1 (3,000 + 10: 3,010 to fit) runs at once and ends at 11 ms (unclipped, 0.7 x 8,999 = 6,299.3
    left 2,790.7 and it waited until 27 ms)."""
    spec = EngineSpec(scheduler="prefill-first", max_num_seqs=8, max_num_batched_tokens=4096, block_size=1,
                      host_overlap=False)
    trace = engine([10, 3000], [9000, 10], arrivals_s=[0, 0.0005], spec=spec, kv_tokens=9100)
    assert list(trace.first_step_start_ns) == [0, 1_000_000]
    assert list(trace.last_step_end_ns) == [9_001_000_000, 11_000_000]
    assert trace.preemptions == 0


def test_the_clipped_outputs_to_come_follow_starts_pauses_and_leaves():
    from array import array

    from tokenpath.engine.running import Decoding

    out, generated = array("q", [12, 3, 9, 20]), [0, 0, 0, 0]
    decoding = Decoding(4, 1, out, generated, [], clip_tokens=5)

    def by_hand(tick):
        return sum(min(last - tick + 1, 5) for _, _, last, _ in decoding.states.values())

    decoding.start(0, 0, 10)  # 12 to come: its last tick 11
    decoding.start(1, 0, 10)  # 3: last tick 2
    assert decoding.clipped_to_come(0) == 5 + 3 == by_hand(0)
    decoding.start(2, 2, 10)  # 9 from tick 2: last tick 10
    assert decoding.clipped_to_come(2) == 5 + 1 + 5 == by_hand(2)
    decoding.stop(1, 3)
    assert decoding.clipped_to_come(7) == 5 + 4 == by_hand(7)
    decoding.pause(0, 8, 3)  # no token in ticks 8 to 10: 4 still to come at tick 11
    decoding.stop(2, 9)
    decoding.start(3, 11, 10)  # 20 to come: last tick 30
    assert decoding.clipped_to_come(11) == 4 + 5 == by_hand(11)
    decoding.pause(3, 12, 4)  # 19 to come at tick 16, while it is held above the clip
    decoding.stop(0, 4)
    assert decoding.clipped_to_come(16) == 5 == by_hand(16)
    assert decoding.clipped_to_come(31) == 4 == by_hand(31)
    assert not decoding.long_last


def test_attention_dp_scales_sglangs_new_token_ratio_by_its_conservativeness():
    from tokenpath.engine.new_token_ratio import ATTENTION_DP_CONSERVATIVENESS, NewTokenRatio

    ratio = NewTokenRatio(ATTENTION_DP_CONSERVATIVENESS)  # SGLang: --schedule-conservativeness x 0.3
    assert ratio.value == pytest.approx(0.21)
    for _ in range(600):
        ratio.decoded()
    assert ratio.value == pytest.approx(0.0294)  # 0.14 of the initial ratio
    ratio.idle()
    assert ratio.value == pytest.approx(0.21)
    # The replica takes it from its costs' attention ranks, with SGLang's headroom on.
    for ranks, initial in ((1, 0.7), (4, 0.21)):
        costs = FixedCosts()
        costs.attention_ranks = ranks
        replica = Replica(costs, LastMile(NO_NETWORK), EngineSpec(scheduler="prefill-first"), 10**6)
        assert replica.ratio.value == pytest.approx(initial)


def test_trtllm_reserve_waits_for_the_whole_kv_cache_and_never_preempts():
    # 10 blocks of 16 tokens; each request needs ceil((32 + 64) / 16) = 6 blocks to finish.
    reserve = engine([32, 32], [64, 64], spec=EngineSpec(scheduler="trtllm", block_size=16), kv_tokens=160)
    assert reserve.preemptions == 0
    assert reserve.token_steps(0, 1)[-1] == 63
    assert reserve.token_steps(1, 2)[0] == 64  # B starts once A has given back its reservation
    assert reserve.step_seqs.max() == 1
    # Taking blocks on demand, both start at once and the cache runs out on the way.
    on_demand = engine([32, 32], [64, 64], spec=EngineSpec(scheduler="trtllm", kv_admission="on_demand",
                                                          block_size=16), kv_tokens=160)
    assert on_demand.token_steps(1, 2)[0] == 0
    assert on_demand.preemptions > 0


def test_trtllm_cuts_prompt_chunks_to_whole_blocks():
    limits = dict(max_num_seqs=8, max_num_batched_tokens=100, block_size=16)
    trtllm = engine([250], [2], spec=EngineSpec(scheduler="trtllm", kv_admission="on_demand", chunked_prefill=True,
                                                 **limits))
    assert list(trtllm.step_tokens) == [96, 96, 58, 1]
    assert list(engine([250], [2], spec=EngineSpec(**limits)).step_tokens) == [100, 100, 50, 1]


def test_trtllm_without_chunking_batches_as_vllm_v1_does():
    rng = np.random.default_rng(11)
    n = 50
    args = ([int(x) for x in rng.integers(1, 120, n)], [int(x) for x in rng.integers(1, 60, n)],
            np.sort(rng.uniform(0, 0.02, n)))
    # (without prefix caching: a preempted vLLM request would find the blocks it computed, a TensorRT-LLM one not)
    # (16-token blocks for both: vLLM V1's until 0.34.0)
    limits = dict(max_num_seqs=8, max_num_batched_tokens=256, chunked_prefill=False, prefix_caching=False,
                  block_size=16)
    trtllm = engine(*args, spec=EngineSpec(scheduler="trtllm", kv_admission="on_demand", host_overlap=False, **limits),
                    kv_tokens=16 * 40)
    v1 = engine(*args, spec=EngineSpec(host_overlap=False, **limits), kv_tokens=16 * 40)  # before 0.14.0's async
    assert v1.preemptions > 0
    assert_same_trace(trtllm, v1)


def test_multi_step_tokens_leave_in_groups_of_k():
    spec = EngineSpec(scheduler="prefill-first", num_scheduler_steps=4, chunked_prefill=False,
                      max_num_seqs=8, max_num_batched_tokens=100)
    trace = engine([10], [9], spec=spec)
    leave_ms = trace.step_leave_ns[trace.token_steps()] / 1e6
    assert list(leave_ms) == [1, 5, 5, 5, 5, 9, 9, 9, 9]  # the prefill's token, then two windows of 4


def test_multi_step_holds_newcomers_and_finished_sequences_until_the_window_ends():
    spec = EngineSpec(scheduler="prefill-first", num_scheduler_steps=4, chunked_prefill=False,
                      max_num_seqs=8, max_num_batched_tokens=100)
    # B arrives during A's first window: it is prefilled when the window ends. In the second window
    # both sample their last tokens early (B at step 6, A at step 7) and stay in the batch to its end.
    trace = engine([10, 20], [7, 2], arrivals_s=[0.0, 0.0015], spec=spec)
    assert list(trace.step_tokens) == [10, 1, 1, 1, 1, 20, 2, 2, 2, 2]
    assert list(trace.step_logits) == [1, 1, 1, 1, 1, 1, 2, 2, 2, 2]
    assert list(trace.token_steps(0, 1)) == [0, 1, 2, 3, 4, 6, 7]
    assert list(trace.token_steps(1, 2)) == [5, 6]
    assert list(trace.step_leave_ns / 1e6) == [1, 5, 5, 5, 5, 6, 10, 10, 10, 10]
    assert list(trace.last_step_end_ns) == [8_000_000, 7_000_000]
    assert list(trace.compute_ns) == [7_000_000, 2_000_000]  # not charged for the steps after their last token
    # A closed loop sends the next request when the window has ended, not when the last token was made.
    closed = engine([10, 10], [3, 1], spec=spec, max_concurrency=1)
    assert closed.sent_ns[1] == 5_000_000  # A's last token came at 3 ms, its window ended at 5 ms


@pytest.mark.parametrize("settings_, fragments", [
    (dict(scheduler="fifo"), ["scheduler", "'vllm-v1', 'vllm-v0', 'prefill-first' or 'trtllm'"]),
    (dict(scheduler="vllm-v0", num_scheduler_steps=4), ["num_scheduler_steps", "chunked prefill has none"]),
    (dict(mixed_chunk=True), ["mixed_chunk", "prefill-first"]),
    (dict(scheduler="prefill-first", mixed_chunk=True, chunked_prefill=False), ["mixed_chunk", "chunked_prefill"]),
    (dict(kv_admission="reserve"), ["kv_admission", "trtllm"]),
    (dict(scheduler="trtllm", kv_admission="later"), ["kv_admission", "'reserve' or 'on_demand'"]),
    (dict(num_scheduler_steps=4), ["num_scheduler_steps", "vLLM V1 has none"]),
    (dict(scheduler="trtllm", num_scheduler_steps=4), ["num_scheduler_steps", "TensorRT-LLM has none"]),
    (dict(scheduler="prefill-first", num_scheduler_steps=0), ["num_scheduler_steps", "greater than or equal to 1"]),
])
def test_profile_settings_that_do_not_fit_are_one_line_errors(settings_, fragments):
    from tokenpath.config.errors import UserError
    from tokenpath.sim.scenario import build_scenario

    with pytest.raises(UserError) as error:
        build_scenario({"engine": settings_}, "mine.toml")
    message = str(error.value)
    assert "\n" not in message and "engine" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_trtllm_reserves_by_default_and_the_others_take_blocks_on_demand():
    assert EngineSpec(scheduler="trtllm").kv_admission == "reserve"
    assert EngineSpec(scheduler="prefill-first").kv_admission == "on_demand"
    assert EngineSpec().kv_admission == "on_demand"


# -- speculative decoding ----------------------------------------------------------------------------

class SpeculativeCosts(FixedCosts):
    """FixedCosts with speculative decoding: `drafts` a step, each accepted with `acceptance`; `drafter`:
    none (False), one whose time depends on every part of the step's shape it is given (True), or a
    fixed time a step in seconds (a number)."""

    def __init__(self, drafts, acceptance, seed=0, drafter=False, **costs):
        super().__init__(**costs)
        self.speculation = Speculation(drafts, acceptance, seed)
        if drafter is True:
            self.draft_s = self._draft_s
        else:
            self.draft_s = (lambda *step: drafter) if drafter else None

    @staticmethod
    def _draft_s(num_tokens, sequences, attn_pairs, kv_read_tokens, chunk_context_tokens):
        return (1e-5 + 1e-8 * num_tokens + 3e-6 * sequences + 1e-11 * attn_pairs + 2e-10 * kv_read_tokens
                + 5e-10 * chunk_context_tokens)


def test_the_reference_runs_verify_steps_of_drafts_plus_one_tokens():
    # k = 3 drafts, all accepted: the prompt's token, then two verify steps of 4 tokens, then the last
    # token alone in a step of 4 positions; each step charged once.
    costs = SpeculativeCosts(drafts=3, acceptance=1.0)
    args = (np.zeros(1, np.int64), np.array([100]), np.array([10]), costs)
    trace = reference_engine(*args, LastMile(NO_NETWORK), EngineSpec(), 10**9)
    assert list(trace.step_tokens) == [100, 4, 4, 4]
    assert list(trace.step_logits) == [1, 4, 4, 4]
    assert list(trace.token_steps()) == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert list(trace.step_attn_pairs[1:]) == [4 * 100 + 10, 4 * 104 + 10, 4 * 108 + 10]
    assert list(trace.step_kv_read_tokens[1:]) == [104, 108, 112]
    assert trace.compute_ns[0] == trace.last_step_end_ns[0] == 4_000_000
    assert_same_trace(run_engine(*args, LastMile(NO_NETWORK), EngineSpec(), 10**9), trace)


def test_a_verify_step_charges_its_host_per_sequence_not_per_draft():
    # k = 3 drafts, all accepted, 1 us a sequence sampled: a verify step of 4 tokens is one sequence's
    # host work (vLLM's update_from_output loops over requests), not four.
    costs = SpeculativeCosts(drafts=3, acceptance=1.0, per_sequence_s=1e-6)
    args = (np.zeros(1, np.int64), np.array([100]), np.array([10]), costs)
    fast = run_engine(*args, LastMile(NO_NETWORK), EngineSpec(), 10**9)
    assert list(fast.step_logits) == [1, 4, 4, 4]
    assert fast.compute_ns[0] == 4 * 1_001_000  # its four steps, each one sequence sampled (not 1 + 3 x 4)
    assert_same_trace(fast, reference_engine(*args, LastMile(NO_NETWORK), EngineSpec(), 10**9))


def test_speculative_preemptions_are_exercised_by_the_reference_comparison():
    # 20 blocks for 6 requests of 64 + 64 tokens: sequences are preempted, recomputed and finish part-way
    # through verify steps, in both engines alike.
    costs = SpeculativeCosts(drafts=3, acceptance=0.7, drafter=True)
    args = (np.zeros(6, np.int64), np.array([64] * 6), np.array([64] * 6), costs)
    spec = EngineSpec(block_size=16, max_num_seqs=8)
    fast = run_engine(*args, LastMile(NO_NETWORK), spec, 16 * 20)
    slow = reference_engine(*args, LastMile(NO_NETWORK), spec, 16 * 20)
    assert fast.preemptions == slow.preemptions > 0
    assert_same_trace(fast, slow)
    tokens = np.bincount(slow.token_steps(), minlength=len(slow.step_tokens))
    assert tokens.max() > slow.step_seqs.max()  # steps that gained several tokens a sequence


SPECULATIVE_PROFILES = {name: PROFILES.get(name, {}) for name in
                        ("vllm-v1", "prefill-first", "prefill-first, mixed chunks", "trtllm, reserve",
                         "trtllm, on demand")}


@pytest.mark.parametrize("profile", SPECULATIVE_PROFILES)
@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 30),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 100, 256, 2048]),
    kv_blocks=st.integers(30, 400),
    chunked=st.booleans(),
    short_prompts=st.booleans(),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    detokenize=st.sampled_from(["engine", "api-server", "detokenizer"]),
    prefilled=st.booleans(),
    drafts=st.integers(1, 7),
    acceptance=st.sampled_from([0.0, 0.4, 0.8, 1.0]),
    drafter=st.booleans(),
    seed=st.integers(0, 2**16),
)
# Short prompts completing together: the next step's decodes take more query tokens than the budget
# holds, and the prompt in progress then gets none.
@example(n=15, max_seqs=64, budget=64, kv_blocks=211, chunked=True, short_prompts=True, concurrency=None,
         detokenize="engine", prefilled=False, drafts=6, acceptance=1.0, drafter=False, seed=41058)
def test_speculative_decoding_matches_the_straightforward_reference_exactly(
        profile, n, max_seqs, budget, kv_blocks, chunked, short_prompts, concurrency, detokenize, prefilled, drafts,
        acceptance, drafter, seed):
    settings_ = {"chunked_prefill": chunked, **SPECULATIVE_PROFILES[profile]}
    chunked = settings_["chunked_prefill"]
    rng = np.random.default_rng(seed)
    block = 16
    # (a reserving engine holds a verify step's drafts past a request's end too)
    longest = (min(budget, block * kv_blocks) if not chunked else min(800, block * kv_blocks)) - drafts
    # Short prompts: many complete in one step, so the decodes' query tokens can outgrow the budget.
    inputs = rng.integers(1, 9 if short_prompts else max(2, longest // 2), n)
    outputs = draw_outputs(rng, n, longest - inputs.max())
    arrivals = np.sort(rng.uniform(0, 0.05, n))
    costs = SpeculativeCosts(drafts, acceptance, seed, drafter, base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5,
                             scheduler_s=1e-4)
    delivery = DeliverySpec(detokenize=detokenize, detokenize_per_token=2e-5)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=block,
                      **settings_)
    args = (np.rint(arrivals * 1e9).astype(np.int64), inputs, outputs, costs)
    cached = rng.integers(0, inputs) if prefilled else None
    both_engines(args, delivery, spec, block * kv_blocks, concurrency, cached)


@pytest.mark.parametrize("scheduler", ["vllm-v1", "prefill-first"])
@pytest.mark.parametrize("method", ["eagle", "ngram"])
@pytest.mark.parametrize("overlap", [False, True])
@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 30),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 100, 256, 2048]),
    kv_blocks=st.integers(12, 80),
    block=st.sampled_from([4, 16]),
    chunked=st.booleans(),
    concurrency=st.one_of(st.none(), st.integers(1, 8)),
    drafts=st.integers(1, 5),
    acceptance=st.sampled_from([0.0, 0.4, 0.8, 1.0]),
    seed=st.integers(0, 2**16),
)
# (SGLang's V2 worker: prompt steps between decode steps, the decodes keeping their tables, in a cache small
# enough to preempt.)
@example(n=20, max_seqs=8, budget=64, kv_blocks=50, block=4, chunked=True, concurrency=6, drafts=5, acceptance=0.8,
         seed=4069)
def test_held_drafts_slots_match_the_straightforward_reference_exactly(
        scheduler, method, overlap, n, max_seqs, budget, kv_blocks, block, chunked, concurrency, drafts, acceptance,
        seed):
    """vLLM V1 with a drafter named in its table holds every verify token's slot and the lookahead until a
    request ends, SGLang's V2 worker (overlapped, not n-gram) its committed tokens and two verify steps more
    (engine/draft_slots.py): the replica's aggregate account and the reference's per sequence agree,
    preemptions included (a small cache), and prompt steps between decode steps under SGLang."""
    rng = np.random.default_rng(seed)
    spec = EngineSpec(scheduler=scheduler, max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs),
                      block_size=block, chunked_prefill=chunked, host_overlap=overlap,
                      speculative=SpeculativeSpec(method=method, num_speculative_tokens=drafts))
    hold = spec.draft_hold()
    longest = (min(budget, block * kv_blocks) if not chunked else min(800, block * kv_blocks))
    longest -= (0 if hold is None else hold.beyond_last_token) + 2
    assume(longest >= 4)
    inputs = rng.integers(1, max(2, longest // 2), n)
    outputs = draw_outputs(rng, n, longest - inputs.max())
    arrivals = np.sort(rng.uniform(0, 0.05, n))
    costs = SpeculativeCosts(drafts, acceptance, seed, base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5,
                             scheduler_s=1e-4)
    args = (np.rint(arrivals * 1e9).astype(np.int64), inputs, outputs, costs)
    fast, slow = both_engines(args, NO_NETWORK, spec, block * kv_blocks, concurrency, None)
    assert fast.preemptions == slow.preemptions


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 30),
    max_seqs=st.sampled_from([1, 2, 8, 64]),
    budget=st.sampled_from([64, 256]),
    kv_blocks=st.integers(20, 120),
    chunked=st.booleans(),
    profile=st.sampled_from([{}, {"host_overlap": False}, {"scheduler": "prefill-first"}, {"scheduler": "trtllm"},
                             {"scheduler": "trtllm", "kv_admission": "on_demand"}, {"method": "eagle"},
                             {"method": "ngram", "host_overlap": False}]),
    drafts=st.integers(1, 4),
    acceptance=st.sampled_from([0.0, 0.5, 1.0]),
    share=st.sampled_from([0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
# SGLang, its last decoding request finished and the one waiting aborted: the finished batch still runs ...
@example(n=2, max_seqs=1, budget=256, kv_blocks=20, chunked=False, profile={"scheduler": "prefill-first"}, drafts=1,
         acceptance=1.0, share=0.3, seed=648)
# ... and an abort due just before that batch's step, of a request it finished, returns False in both engines
@example(n=3, max_seqs=1, budget=64, kv_blocks=20, chunked=False, profile={"scheduler": "prefill-first"}, drafts=1,
         acceptance=1.0, share=1.0, seed=648)
# ... and one due before the step after that batch, of a request still waiting, is made in both (the reference
# had dropped it, and ran the request)
@example(n=21, max_seqs=2, budget=64, kv_blocks=20, chunked=False, profile={"scheduler": "prefill-first"}, drafts=1,
         acceptance=1.0, share=1.0, seed=3603)
def test_random_aborts_under_speculative_decoding_give_the_same_trace_in_both_engines(
        n, max_seqs, budget, kv_blocks, chunked, profile, drafts, acceptance, share, seed):
    """Requests aborted before random steps while sequences verify drafts (finishing short of a step's advance,
    under vLLM V1 with a drafter in its table holding the drafts' slots): the same trace in both engines, and
    every block back once idle."""
    rng = np.random.default_rng(seed)
    block = 16
    settings_ = {key: value for key, value in profile.items() if key != "method"}
    if "method" in profile:
        settings_["speculative"] = SpeculativeSpec(method=profile["method"], num_speculative_tokens=drafts)
    spec = EngineSpec(max_num_seqs=max_seqs, max_num_batched_tokens=max(budget, max_seqs), block_size=block,
                      chunked_prefill=chunked, **settings_)
    hold = spec.draft_hold()
    room = (min(budget, block * kv_blocks) if not chunked else min(800, block * kv_blocks))
    room -= drafts + (0 if hold is None else hold.beyond_last_token + 2)
    inputs = rng.integers(1, max(2, room // 2), n)
    outputs = draw_outputs(rng, n, room - inputs.max())
    scheduled = np.rint(np.sort(rng.uniform(0, 0.02, n)) * 1e9).astype(np.int64)
    costs = SpeculativeCosts(drafts, acceptance, seed, base_s=3e-4, per_token_s=2e-6, traffic_s=5e-5)
    workload = (scheduled, inputs, outputs, spec, block * kv_blocks, np.zeros(n, np.int64), NO_NETWORK)
    assert_aborts_match(*workload, draw_abort_steps(rng, share, *workload, costs=costs), costs=costs)


@pytest.mark.parametrize("scheduler", ["vllm-v1", "vllm-v0", "prefill-first", "trtllm"])
def test_a_request_the_whole_cache_cannot_hold_is_refused_not_preempted_forever(scheduler):
    """8 blocks of 16 tokens: taking blocks as it grows, a 64-token prompt can produce 65 tokens (the last
    one's KV is never written) and not 66; reserving (TensorRT-LLM) it reserves the 65th too."""
    spec = EngineSpec(scheduler=scheduler, block_size=16)
    fits = 64 if spec.kv_admission == "reserve" else 65
    trace = engine([64], [fits], spec=spec, kv_tokens=8 * 16)
    assert len(trace.step_start_ns) == fits
    with pytest.raises(ValueError, match=f"a request of {64 + fits + 1} tokens needs more than the 8 KV blocks"):
        engine([64, 10], [fits + 1, 10], spec=spec, kv_tokens=8 * 16)
