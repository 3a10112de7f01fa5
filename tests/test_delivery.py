"""The last-mile model: SSE event grouping, host copy and detokenize costs, network times, visibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath import load_scenario, simulate
from tokenpath.bench.prompts import corpus_text
from tokenpath.config.assumptions import lookup
from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.frontend import Layout
from tokenpath.delivery.lastmile import LastMile, closes_event, event_sizes, first_visible_index
from tokenpath.delivery.sample_text import SAMPLES
from tokenpath.delivery.spec import INVISIBLE_TOKEN_FRACTION, DeliverySpec
from tokenpath.delivery.visibility import invisible_fraction
from tokenpath.sim.document import result_document

# Round numbers, so the costs can be worked out by hand: a copy costs 10 us + 1 ns per id (4 bytes at
# 4 GB/s), detokenizing 100 us per token, framing 10 us per event.
HAND = dict(host_link_latency=10e-6, host_link_bw=4e9, detokenize_per_token=100e-6, frame_per_event=10e-6)


def step(last_mile: LastMile, gpu_end_ns: int, token_index, output_tokens) -> tuple[int, int]:
    """(blocking_ns, leave_ns) of one engine step that sampled token `token_index[i]` of a sequence of
    `output_tokens[i]`, as the engine accounts it: the events it closes are counted with `closes_event`."""
    token_index, output_tokens = np.asarray(token_index, np.int64), np.asarray(output_tokens, np.int64)
    events = int(np.count_nonzero(closes_event(token_index, output_tokens, last_mile.stream_interval)))
    return last_mile.on_step(gpu_end_ns, len(token_index), events)[:2]


def reference_events(output_tokens: int, interval: int) -> list[list[int]]:
    """Token indices of each SSE event of one sequence: the first token alone, then groups of
    `interval`, the last group holding whatever is left."""
    rest = list(range(1, output_tokens))
    return [[0]] + [rest[i:i + interval] for i in range(0, len(rest), interval)]


def flat(lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, token index within its sequence, that sequence's length) for a flat token array."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    index = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    length = np.repeat(np.array(lengths, np.int64), lengths)
    return offsets, index, length


# Event grouping.

@settings(max_examples=200, deadline=None)
@given(output_tokens=st.integers(1, 200), interval=st.integers(1, 40))
def test_closes_event_and_event_sizes_match_a_brute_force_grouping(output_tokens, interval):
    events = reference_events(output_tokens, interval)
    assert sum(len(e) for e in events) == output_tokens
    closers = {event[-1] for event in events}
    index = np.arange(output_tokens)
    got = closes_event(index, np.full(output_tokens, output_tokens), interval)
    assert got.tolist() == [i in closers for i in range(output_tokens)]
    assert event_sizes(output_tokens, interval) == (len(events[0]), len(events[-1]))


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    interval=st.integers(1, 12),
    data=st.data(),
)
def test_client_times_group_tokens_into_events_like_the_reference(lengths, interval, data):
    offsets, _, _ = flat(lengths)
    gaps = data.draw(st.lists(st.integers(0, 10**7), min_size=int(offsets[-1]), max_size=int(offsets[-1])))
    leave_ns = np.cumsum(np.array(gaps, np.int64))  # non-decreasing
    last_mile = LastMile(DeliverySpec(stream_interval=interval))
    got = last_mile.client_times_ns(leave_ns, offsets)
    expected = np.empty_like(leave_ns)
    for request, n in enumerate(lengths):
        base = offsets[request]
        for event in reference_events(n, interval):
            arrival = leave_ns[base + event[-1]] + last_mile.event_network_ns(len(event))
            expected[base + np.array(event)] = arrival
    assert np.array_equal(got, expected)
    # Every token reaches the client after it left the server.
    assert (got >= leave_ns).all()


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=6),
    interval=st.integers(1, 16),
    data=st.data(),
)
def test_client_times_are_non_decreasing_within_a_sequence(lengths, interval, data):
    # Tokens of one sequence come from successive engine steps, at least 100 us apart; that is more
    # than the wire-time difference between a full event and a short last one (< 5 us here).
    offsets, _, _ = flat(lengths)
    total = int(offsets[-1])
    gaps = data.draw(st.lists(st.integers(100_000, 50_000_000), min_size=total, max_size=total))
    leave_ns = np.cumsum(np.array(gaps, np.int64))
    got = LastMile(DeliverySpec(stream_interval=interval)).client_times_ns(leave_ns, offsets)
    for request in range(len(lengths)):
        row = got[offsets[request]:offsets[request + 1]]
        assert (np.diff(row) >= 0).all()
    assert (got >= leave_ns).all()


def test_the_last_token_arrives_when_last_event_arrival_says():
    for interval in (1, 3, 4):
        last_mile = LastMile(DeliverySpec(stream_interval=interval))
        lengths = [1, 2, 5, 9, 12]
        offsets, _, _ = flat(lengths)
        leave_ns = np.arange(offsets[-1], dtype=np.int64) * 1_000_000
        client = last_mile.client_times_ns(leave_ns, offsets)
        for request, n in enumerate(lengths):
            last = offsets[request + 1] - 1
            assert client[last] == last_mile.last_event_arrival_ns(int(leave_ns[last]), n)


@pytest.mark.parametrize("interval", [1, 2, 4])
def test_simulated_tokens_arrive_in_order(interval):
    scenario = load_scenario("typical", {
        "workload.num_requests": 40, "workload.arrival.rate": 40.0, "delivery.stream_interval": interval,
        "delivery.detokenize": "detokenizer",
    })
    run = simulate(scenario).run
    offsets = run.token_offsets
    for i in range(len(run)):
        row = run.token_client_ns[offsets[i]:offsets[i + 1]]
        assert (np.diff(row) >= 0).all()
        assert row[-1] == run.sent_ns[i] + run.e2e_ns[i]


# Host work per engine step.

def test_a_step_detokenized_in_the_engine_blocks_for_the_copy_and_detokenizing_then_is_framed():
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="engine"))
    # Two sequences each emit their first token: copy 10 us + 2 ns and detokenize 2 x 100 us block the
    # engine; the API server then frames 2 events x 10 us.
    blocking, leave = step(last_mile, 1_000_000, np.array([0, 0]), np.array([5, 5]))
    assert blocking == 10_002 + 200_000
    assert leave == 1_000_000 + 10_002 + 200_000 + 20_000


def test_host_work_counts_one_frame_per_event_not_per_token():
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="engine", stream_interval=4))
    # Tokens 0 (first), 1 (inside an event), 4 (closes 1..4), 5 (inside), 6 (last of a 7-token sequence):
    # 5 tokens, 3 events.
    blocking, leave = step(last_mile, 0, np.array([0, 1, 4, 5, 6]), np.array([10, 10, 10, 10, 7]))
    assert blocking == 10_005 + 5 * 100_000
    assert leave == blocking + 3 * 10_000


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.lists(st.tuples(st.integers(1, 40), st.data()), min_size=1, max_size=12),
    interval=st.integers(1, 8),
)
def test_framing_matches_the_reference_event_count(tokens, interval):
    # Each emitting sequence: its length and which of its tokens this step sampled.
    lengths, indices = [], []
    for length, data in tokens:
        lengths.append(length)
        indices.append(data.draw(st.integers(0, length - 1)))
    closers = [any(index == event[-1] for event in reference_events(length, interval))
               for index, length in zip(indices, lengths)]
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="engine", stream_interval=interval))
    emitted = len(lengths)
    blocking, leave = step(last_mile, 5_000, np.array(indices), np.array(lengths))
    assert blocking == 10_000 + emitted + emitted * 100_000
    assert leave == 5_000 + blocking + sum(closers) * 10_000


def test_without_grouping_every_token_is_its_own_event():
    last_mile = LastMile(DeliverySpec(**HAND, stream_interval=1))
    assert last_mile.stream_interval == 1
    blocking = 10_003 + 3 * 100_000  # the copy and detokenizing, in the engine (the spec names no process)
    assert step(last_mile, 0, [0, 1, 7], [9, 9, 9]) == (blocking, blocking + 3 * 10_000)
    # Framing is charged per event: the same 3 tokens in one event cost two frames less; the API server
    # is busy until 3 frames after the first step, so the second waits for it.
    assert last_mile.on_step(0, 3, 1) == (blocking, blocking + 4 * 10_000, 3 * 10_000, 10_000)


def test_tokens_detokenized_in_the_api_server_queue_there_after_the_copy():
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="api-server"))
    # Step 1: copy 10_002 blocks the engine; the API server detokenizes and frames 2 x 110_000.
    assert last_mile.on_step(1_000_000, 2, 2) == (10_002, 1_230_002, 0, 220_000)
    # Step 2's ids are there at 1_110_002 but the process is busy until 1_230_002.
    assert last_mile.on_step(1_100_000, 2, 2) == (10_002, 1_450_002, 120_000, 220_000)


def test_a_detokenizer_process_and_the_api_server_are_a_tandem_queue():
    """detokenized_k = max(detokenized_(k-1), gpu_end_k + copy_k) + detokenize_k, then
    leave_k = max(leave_(k-1), detokenized_k) + frame_k; the step only waits for the copy."""
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="detokenizer"))
    # Step 1: two first tokens. copy 10_002; detokenized at 1_210_002; framed at 1_230_002.
    assert step(last_mile, 1_000_000, np.array([0, 0]), np.array([5, 5])) == (10_002, 1_230_002)
    # Step 2's ids are there at 1_110_002; the detokenizer is busy until 1_210_002 (done 1_410_002), and
    # the API server is free by then: leave 1_430_002.
    assert step(last_mile, 1_100_000, np.array([1, 1]), np.array([5, 5])) == (10_002, 1_430_002)
    # Step 3 ends at 2_000_000 after both went idle: copy 10_001, detokenize 100_000, frame 10_000.
    assert step(last_mile, 2_000_000, np.array([2]), np.array([3])) == (10_001, 2_010_001 + 110_000)
    assert last_mile.busy_ns() == {"API server": 50_000, "detokenizer": 500_000}


@pytest.mark.parametrize("where", ["detokenizer", "api-server", "engine"])
def test_the_api_server_takes_in_each_token_at_output_per_token_wherever_it_was_detokenized(where):
    # 3 tokens in 2 events: the API server's work beyond detokenizing is 3 x 7_000 + 2 x 10_000 ns.
    plain = LastMile(DeliverySpec(**HAND, detokenize=where)).on_step(1_000_000, 3, 2)
    taking_in = LastMile(DeliverySpec(**HAND, detokenize=where, output_per_token=7e-6)).on_step(1_000_000, 3, 2)
    assert taking_in[0] == plain[0]  # the engine's steps never wait for it
    assert taking_in[1] == plain[1] + 21_000 and taking_in[3] == plain[3] + 21_000


@pytest.mark.parametrize(("outputs_per_event", "detokenize_ns", "api_ns"), [
    # SGLang's scheduler and TensorRT-LLM's executor hand on a request's tokens as its event closes: the
    # detokenizer takes 2 events at 100 us, the API server 2 x 7 us beside 2 frames of 10 us.
    (True, 200_000, 34_000),
    # vLLM V1's engine core sends every token; its API server holds them back after its work on them.
    (False, 800_000, 76_000),
])
def test_an_engine_that_holds_tokens_to_its_stream_interval_hands_on_events(outputs_per_event, detokenize_ns,
                                                                            api_ns):
    spec = DeliverySpec(**HAND, stream_interval=4, output_per_token=7e-6)
    last_mile = LastMile(spec, Layout("detokenizer", outputs_per_event=outputs_per_event))
    last_mile.on_step(1_000_000, 8, 2)  # 8 tokens closing 2 events
    assert last_mile.busy_ns() == {"API server": api_ns, "detokenizer": detokenize_ns}


def test_sglang_s_detokenizer_works_once_an_event_at_a_stream_interval():
    # Ten 9-token answers, four tokens to an event: events of tokens {0}, {1-4}, {5-8}, 3 an answer. The
    # detokenizer process takes 30 events at 100 us (it took 90 tokens, 9 ms).
    simulation = simulate(load_scenario(None, {
        "engine.scheduler": "prefill-first", "model.name": "llama-3.1-8b", "deployment.chips": 1,
        "deployment.tp": 1, "workload.num_requests": 10, "workload.arrival.rate": 2.0,
        "workload.input": {"kind": "fixed", "value": 100}, "workload.output": {"kind": "fixed", "value": 9},
        "delivery": {"stream_interval": 4, "detokenize_per_token": "100 us"}}))
    assert simulation.traces[0].host_busy_ns["detokenizer"] == 30 * 100_000


def test_a_step_without_tokens_costs_nothing_and_leaves_the_processes_alone():
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="detokenizer"))
    assert step(last_mile, 1_000_000, np.array([0]), np.array([5])) == (10_001, 1_120_001)
    empty = np.empty(0, np.int64)
    assert step(last_mile, 1_050_000, empty, empty) == (0, 1_050_000)
    # The detokenizer is still busy until 1_110_001 with the first step's token.
    assert step(last_mile, 1_060_000, np.array([1]), np.array([5])) == (10_001, 1_110_001 + 110_000)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1_000, 5_000_000), st.integers(1, 20)),  # (device time of the step, tokens emitted)
        min_size=1, max_size=15,
    )
)
def test_detokenizer_leave_times_follow_the_recurrence_and_never_precede_the_copy(steps):
    last_mile = LastMile(DeliverySpec(**HAND, detokenize="detokenizer"))
    clock, detokenized, framed = 0, 0, 0
    previous_leave = -1
    for device_ns, emitted in steps:
        gpu_end = clock + device_ns
        index = np.zeros(emitted, np.int64)  # first tokens: one event each
        blocking, leave = step(last_mile, gpu_end, index, np.full(emitted, 3))
        copy = 10_000 + emitted
        detokenized = max(detokenized, gpu_end + copy) + emitted * 100_000
        framed = max(framed, detokenized) + emitted * 10_000
        assert (blocking, leave) == (copy, framed)
        assert leave >= gpu_end + blocking and leave > previous_leave
        previous_leave = leave
        clock = gpu_end + blocking


# Network closed forms.

def test_upload_is_half_a_round_trip_plus_the_request_bytes():
    last_mile = LastMile(DeliverySpec())  # 20 ms RTT, 12.5 MB/s, 400 B of overhead, 4 B per token
    # 400 + 4 x 1000 = 4400 bytes / 12.5e6 B/s = 352 us.
    assert last_mile.upload_ns(1000) == 10_000_000 + 352_000
    spec = DeliverySpec(network_rtt="35 ms", network_bw="100 Mb/s", request_overhead_bytes=0, bytes_per_token=2.5)
    assert LastMile(spec).upload_ns(5000) == 17_500_000 + 1_000_000  # 12_500 bytes at 12.5 MB/s


def test_event_network_time_is_half_a_round_trip_plus_the_event_bytes():
    last_mile = LastMile(DeliverySpec())
    # 230 + 4 = 234 bytes / 12.5e6 = 18.72 us; 230 + 16 = 246 bytes = 19.68 us.
    one = last_mile.event_network_ns(1)
    assert one == 10_018_720 and isinstance(one, int)
    many = last_mile.event_network_ns(np.array([1, 4, 0]))
    assert many.tolist() == [10_018_720, 10_019_680, 10_018_400]
    assert many.dtype == np.int64


def test_last_event_arrival_uses_the_size_of_the_last_event():
    last_mile = LastMile(DeliverySpec(stream_interval=4))
    for n, last_size in ((1, 1), (2, 1), (5, 4), (6, 1), (8, 3), (9, 4)):
        assert last_mile.last_event_arrival_ns(1_000, n) == 1_000 + last_mile.event_network_ns(last_size)


# Where the first visible character lands.

def test_no_invisible_tokens_means_the_first_token_is_visible():
    lengths = np.array([1, 5, 100, 3])
    got = first_visible_index(lengths, 0.0, np.random.default_rng(0))
    assert got.tolist() == [0, 0, 0, 0]
    assert got.dtype == np.int64


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=50),
    fraction=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**32 - 1),
)
def test_first_visible_index_lies_inside_the_sequence(lengths, fraction, seed):
    output = np.array(lengths, np.int64)
    got = first_visible_index(output, fraction, np.random.default_rng(seed))
    assert got.shape == output.shape
    assert (got >= 0).all() and (got < output).all()


@pytest.mark.parametrize("fraction", [0.058, 0.3, 0.5, 0.9])
def test_leading_invisible_run_is_geometric(fraction):
    # With long sequences nothing is clipped: the index counts the invisible tokens before the first
    # visible one, geometric with mean p / (1 - p) and variance p / (1 - p)^2. Tolerance: 5 standard
    # errors of the sample mean.
    n = 200_000
    got = first_visible_index(np.full(n, 10**6), fraction, np.random.default_rng(12345))
    mean = fraction / (1 - fraction)
    standard_error = np.sqrt(fraction) / (1 - fraction) / np.sqrt(n)
    assert abs(got.mean() - mean) < 5 * standard_error
    assert (got == 0).mean() == pytest.approx(1 - fraction, abs=0.005)


def test_a_sequence_that_never_shows_text_shows_it_at_its_last_token():
    got = first_visible_index(np.ones(1000, np.int64), 0.9, np.random.default_rng(1))
    assert (got == 0).all()
    got = first_visible_index(np.full(1000, 3), 0.9, np.random.default_rng(1))
    assert got.max() == 2 and (got == 2).mean() > 0.7  # P(at least 2 invisible) = 0.81


# The default share of invisible tokens is the workload's own text through the default tokenizer.

def test_the_default_invisible_fraction_is_measured_on_the_workload_corpus_with_the_default_tokenizer():
    det = Detokenizer.load()
    assert invisible_fraction(det, corpus_text()) == INVISIBLE_TOKEN_FRACTION == 15 / 4110
    # The registry's source, which scenario show prints beside it, quotes these.
    assert round(invisible_fraction(det, SAMPLES["chinese"]), 3) == 0.059
    assert round(invisible_fraction(det, SAMPLES["emoji"]), 2) == 0.45
    assert round(invisible_fraction(det, SAMPLES["code"]), 2) == 0.11
    source = lookup("invisible_token_fraction").source
    assert "4,110 Tekken tokens" in source and "5.9% of Chinese" in source and "45% of emoji" in source
    shown = load_scenario(None).to_toml()
    assert f"invisible_token_fraction = {15 / 4110!r}  # {source}\n" in shown


def test_a_token_of_white_space_alone_is_not_visible():
    # SentencePiece encodes "🎉 ok" as "▁", "🎉", "▁ok": after the prompt the dummy prefix "▁" shows a
    # space (the stream is primed, as engines do), which TTFV does not count as visible; the emoji and
    # " ok" are.
    det = Detokenizer.load("tokenizer.model.v1")
    ids = det.encode("🎉 ok")
    assert [det.library.id_to_piece(t) for t in ids][0] == "\u2581"
    assert invisible_fraction(det, "🎉 ok") == pytest.approx(1 / len(ids))
    assert invisible_fraction(Detokenizer.load(), "def f():\n    return 1\n") > 0  # the indent and line ends


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=200))
def test_ascii_text_without_white_space_has_no_invisible_tokens(text):
    assert invisible_fraction(Detokenizer.load(), text) == 0.0


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab 中文字😊👍🇫🇷é"), min_size=1, max_size=60))
def test_invisible_fraction_is_a_share_of_the_tokens(text):
    fraction = invisible_fraction(Detokenizer.load(), text)
    assert 0.0 <= fraction <= 1.0
    if text.strip():
        assert fraction < 1.0  # the token that completes a visible character shows it


def test_grouping_tokens_four_to_an_event_does_not_delay_the_first_visible_text_of_english_traffic():
    # With 5.8% of tokens taken for invisible, English traffic's p99 TTFV rose 42% at stream interval 4:
    # the first visible text waited for a group of four. 0.37% of its tokens are (white space alone).
    def ttfv_p99_s(interval: int) -> float:
        document, _ = result_document(simulate(load_scenario(None, {"workload.num_requests": 600,
                                                                    "delivery.stream_interval": interval})))
        return document["latency_s"]["ttfv"]["p99"]

    assert ttfv_p99_s(4) <= 1.01 * ttfv_p99_s(1)
