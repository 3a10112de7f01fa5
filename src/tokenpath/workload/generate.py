"""Turn a `WorkloadSpec` into `Requests`."""

from __future__ import annotations

import numpy as np

from tokenpath.errors import UserError
from tokenpath.workload._files import sha256_file
from tokenpath.workload.arrivals import arrival_times_s
from tokenpath.workload.lengths import sample_lengths
from tokenpath.workload.requests import Requests, Sessions
from tokenpath.prefixes import SEGMENT_TOKENS, Prefixes
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, MAX_TURNS, SessionSpec, SharedPrefixSpec, WorkloadSpec
from tokenpath.workload.traces import read_trace


def generate(spec: WorkloadSpec, rng: np.random.Generator) -> Requests:
    """The requests `spec` describes. Draws input lengths, then output lengths, then arrivals from
    `rng`, always in that order, so one seed gives one result. With a trace, replays its first
    `num_requests` rows in time order and draws nothing."""
    n = spec.num_requests
    if spec.trace is not None:
        requests = read_trace(spec.trace.path, spec.trace.format, time_scale=spec.trace.time_scale)
        return requests if len(requests) <= n else requests.take(np.arange(n))
    input_tokens = sample_lengths(spec.input, n, rng, "workload.input")
    output_tokens = sample_lengths(spec.output, n, rng, "workload.output")
    arrival_s = arrival_times_s(spec.arrival, n, rng)
    if not arrival_s[-1] <= MAX_ARRIVAL_SPAN_S:
        days = arrival_s[-1] / 86400
        raise UserError(f"workload.arrival: {n:,} requests at {spec.arrival.rate:g} requests/s arrive over "
                        f"{days:,.0f} days; at most {MAX_ARRIVAL_SPAN_S / 86400:.0f} days are simulated: "
                        "raise the rate or lower num_requests")
    if spec.sessions is not None:
        return sessions(spec.sessions, arrival_s, input_tokens, output_tokens, rng)
    if spec.shared_prefix is None:
        return Requests(arrival_s, input_tokens, output_tokens)
    prefixes = shared_prefixes(spec.shared_prefix, n, rng)
    return Requests(arrival_s, input_tokens + prefixes.tokens, output_tokens, prefixes)


def shared_prefixes(spec: SharedPrefixSpec, n: int, rng: np.random.Generator) -> Prefixes:
    """Which of `spec.count` shared prompts each of n requests starts with (none for the rest), drawn
    after everything else so that adding a shared prefix leaves the other draws as they were."""
    carries = rng.random(n) < spec.fraction
    which = rng.integers(0, spec.count, n)
    segments = -(-spec.tokens // SEGMENT_TOKENS)
    counts = np.where(carries, segments, 0)
    starts = np.repeat(which[carries] * segments, segments)
    keys = starts + np.tile(np.arange(segments), int(carries.sum()))
    return Prefixes(keys.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    np.where(carries, spec.tokens, 0).astype(np.int64))


def sessions(spec: SessionSpec, start_s: np.ndarray, message_tokens: np.ndarray, answer_tokens: np.ndarray,
             rng: np.random.Generator) -> Requests:
    """Multi-turn sessions over n requests: session s starts at start_s[s]; its turns take the next rows,
    each with a new message and an answer of the drawn lengths. Turn counts, then think times, are
    drawn after everything else (n of each, the most that can be needed).

    Prefix identities: each turn's message and answer (less its last token, whose KV is never
    computed) is a segment of its own, so turn k's keys name the whole session so far; the next
    turn's prompt repeats it, and finds it cached."""
    n = len(message_tokens)
    if isinstance(spec.turns, int):
        turns = np.full(n, spec.turns, np.int64)
    else:
        turns = np.minimum(sample_lengths(spec.turns, n, rng, "workload.sessions.turns"), MAX_TURNS)
    if spec.think_distribution == "exponential":
        think_s = rng.exponential(spec.think_time, n)
    else:
        think_s = np.full(n, spec.think_time)
    ends = np.cumsum(turns)
    count = int(np.searchsorted(ends, n)) + 1  # sessions needed; the last may be cut short
    turns = turns[:count].copy()
    turns[-1] -= ends[count - 1] - n
    session = np.repeat(np.arange(count, dtype=np.int64), turns)
    first_row = np.repeat(np.cumsum(turns) - turns, turns)
    turn = np.arange(n, dtype=np.int64) - first_row
    think_s = np.where(turn > 0, think_s, 0.0)
    # Prompt = history (earlier messages and answers) + the new message.
    spent = np.cumsum(message_tokens + answer_tokens)
    history = spent - (message_tokens + answer_tokens) - (spent - (message_tokens + answer_tokens))[first_row]
    prompt = history + message_tokens
    # Row r's segments: key 2r for its message (ending at its prompt's end), 2r + 1 for its answer.
    keys: list[int] = []
    segment_ends: list[int] = []
    counts = np.empty(n, np.int64)
    own_keys: list[int] = []
    own_ends: list[int] = []
    prompts, answers, turns_list = prompt.tolist(), answer_tokens.tolist(), turn.tolist()
    for r in range(n):
        if turns_list[r] == 0:
            own_keys, own_ends = [], []
        own_keys.append(2 * r)
        own_ends.append(prompts[r])
        if answers[r] > 1:
            own_keys.append(2 * r + 1)
            own_ends.append(prompts[r] + answers[r] - 1)
        keys.extend(own_keys)
        segment_ends.extend(own_ends)
        counts[r] = len(own_keys)
    covered = prompt + answer_tokens - 1
    prefixes = Prefixes(np.array(keys, np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        covered.astype(np.int64), SEGMENT_TOKENS, np.array(segment_ends, np.int64))
    return Requests(start_s[session], prompt.astype(np.int64), answer_tokens, prefixes,
                    Sessions(session, turn, think_s.astype(np.float64)))


def fingerprint_inputs(spec: WorkloadSpec) -> dict[str, str]:
    """The sha256 (hex) of each file the workload reads, keyed by its path as written in the spec, so
    a scenario's fingerprint changes when a trace or lengths file does."""
    files: dict[str, str] = {}
    if spec.trace is not None:
        files[spec.trace.path] = "workload.trace file"
    else:
        counted = [("workload.input", spec.input), ("workload.output", spec.output)]
        if spec.sessions is not None and not isinstance(spec.sessions.turns, int):
            counted.append(("workload.sessions.turns", spec.sessions.turns))
        for field, lengths in counted:
            if lengths.kind == "empirical":
                files.setdefault(lengths.path, f"{field} lengths file")
    return {path: sha256_file(path, what) for path, what in files.items()}
