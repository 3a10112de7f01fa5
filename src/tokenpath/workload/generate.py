"""Turn a `WorkloadSpec` into `Requests`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from tokenpath.config.errors import UserError
from tokenpath.prefixes import SEGMENT_TOKENS, Prefixes
from tokenpath.workload._files import sha256_file
from tokenpath.workload.arrivals import arrival_times_s
from tokenpath.workload.lengths import sample_lengths, sample_pair_lengths
from tokenpath.workload.requests import Requests, Sessions
from tokenpath.workload.size import require_memory
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, MAX_TURNS, SessionSpec, SharedPrefixSpec, WorkloadSpec
from tokenpath.workload.traces import read_trace


def generate(spec: WorkloadSpec, rng: np.random.Generator,
             check: Callable[[Requests], None] | None = None) -> Requests:
    """The requests `spec` describes. Draws input lengths, then output lengths, then arrivals from
    `rng`, always in that order, so one seed gives one result. With a trace, replays its first
    `num_requests` rows in time order and draws nothing. Each message gets `chat_template_tokens` (a
    count: "auto" must be counted first, by the scenario), which draw nothing either.

    Before the prefix keys are built (sessions' keys grow with the square of their turns), `check`,
    where given, sees the requests drawn (without keys) and may refuse them, and the run's memory is
    estimated: one too large for this machine is a UserError naming the key to lower."""
    n = spec.num_requests
    if spec.trace is not None:
        requests = read_trace(spec.trace.path, spec.trace.format, time_scale=spec.trace.time_scale)
        requests = requests if len(requests) <= n else requests.take(np.arange(n))
        if spec.warmup_requests >= len(requests):  # (num_requests, checked against it, may be more than the rows)
            raise UserError(f"workload.warmup_requests: {spec.warmup_requests} leaves none of the trace's "
                            f"{len(requests)} requests to measure; lower warmup_requests or give a longer trace")
        _check(requests, check, 0 if requests.prefixes is None else len(requests.prefixes.keys))
        return requests
    template = _template_tokens(spec)
    input_tokens, output_tokens = sample_pair_lengths(spec.input, spec.output, n, rng)
    arrival_s = arrival_times_s(spec.arrival, n, rng)
    if not arrival_s[-1] <= MAX_ARRIVAL_SPAN_S:
        days = arrival_s[-1] / 86400
        raise UserError(f"workload.arrival: {n:,} requests at {spec.arrival.rate:g} requests/s arrive over "
                        f"{days:,.0f} days; at most {MAX_ARRIVAL_SPAN_S / 86400:.0f} days are simulated: "
                        "raise the rate or lower num_requests")
    if spec.sessions is not None:
        rows = session_rows(spec.sessions, arrival_s, input_tokens + template, output_tokens, rng)
        if template:  # each turn's prompt holds every message of its session so far, each with its template
            rows = replace(rows, template_tokens=template * (rows.sessions.turn + 1))
        _check(rows, check, session_segments(rows), "workload.sessions.turns", "each turn names every turn before it")
        return replace(rows, prefixes=session_prefixes(rows))
    templates = np.full(n, template, np.int64) if template else None
    if spec.shared_prefix is None:
        requests = Requests(arrival_s, input_tokens + template, output_tokens, template_tokens=templates)
        _check(requests, check)
        return requests
    shared = spec.shared_prefix
    carries, which = draw_shared_prefixes(shared, n, rng)
    requests = Requests(arrival_s, input_tokens + np.where(carries, shared.tokens, 0) + template, output_tokens,
                        template_tokens=templates)
    _check(requests, check, int(carries.sum()) * -(-shared.tokens // SEGMENT_TOKENS), "workload.shared_prefix.tokens",
           f"one per {SEGMENT_TOKENS} tokens of a shared prefix")
    return replace(requests, prefixes=shared_prefixes(shared, carries, which))


def _template_tokens(spec: WorkloadSpec) -> int:
    """The tokens the chat template adds to each message; "auto" depends on a tokenizer, which the
    scenario owns (it counts it in Scenario.resolved_workload)."""
    if spec.chat_template_tokens == "auto":
        raise ValueError("workload.chat_template_tokens is 'auto': count it first (Scenario.resolved_workload)")
    return spec.chat_template_tokens


def _check(drawn: Requests, check: Callable[[Requests], None] | None, segments: int = 0,
           segments_key: str | None = None, segments_are: str = "") -> None:
    """Refuse `drawn` (its `segments` prefix keys not built yet) when `check` does, or when its run
    would need more memory than is available (size.py)."""
    if check is not None:
        check(drawn)
    require_memory(len(drawn), int(drawn.output_tokens.sum()), segments, segments_key, segments_are)


def draw_shared_prefixes(spec: SharedPrefixSpec, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Whether each of n requests starts with a shared prompt, and which of `spec.count`, drawn after
    everything else so that adding a shared prefix leaves the other draws as they were."""
    return rng.random(n) < spec.fraction, rng.integers(0, spec.count, n)


def shared_prefixes(spec: SharedPrefixSpec, carries: np.ndarray, which: np.ndarray) -> Prefixes:
    """The keys of the shared prompts the requests that `carries` start with (`which` of them)."""
    segments = -(-spec.tokens // SEGMENT_TOKENS)
    counts = np.where(carries, segments, 0)
    starts = np.repeat(which[carries] * segments, segments)
    keys = starts + np.tile(np.arange(segments), int(carries.sum()))
    return Prefixes(keys.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    np.where(carries, spec.tokens, 0).astype(np.int64))


def sessions(spec: SessionSpec, start_s: np.ndarray, message_tokens: np.ndarray, answer_tokens: np.ndarray,
             rng: np.random.Generator) -> Requests:
    """Multi-turn sessions over n requests (`session_rows`), with their prefix keys."""
    rows = session_rows(spec, start_s, message_tokens, answer_tokens, rng)
    return replace(rows, prefixes=session_prefixes(rows))


def session_rows(spec: SessionSpec, start_s: np.ndarray, message_tokens: np.ndarray, answer_tokens: np.ndarray,
                 rng: np.random.Generator) -> Requests:
    """Multi-turn sessions over n requests, without prefix keys: session s starts at start_s[s]; its
    turns take the next rows, each with a new message and an answer of the drawn lengths, its prompt
    the history (earlier messages and answers) and the new message. Turn counts, then think times,
    are drawn after everything else (n of each, the most that can be needed)."""
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
    turn = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(turns) - turns, turns)
    think_s = np.where(turn > 0, think_s, 0.0)
    history = earlier_in_session(message_tokens + answer_tokens, turn)
    return Requests(start_s[session], (history + message_tokens).astype(np.int64), answer_tokens, None,
                    Sessions(session, turn, think_s.astype(np.float64)))


def earlier_in_session(values: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """For each row, the sum of `values` over the earlier turns of its session."""
    spent = np.cumsum(values)
    before = spent - values
    return before - before[np.arange(len(turn)) - turn]


def session_segments(rows: Requests) -> int:
    """How many prefix keys `session_prefixes(rows)` holds: each turn names every segment of its
    session so far."""
    own = 1 + (rows.output_tokens > 1)  # each turn adds its message, and its answer less the last token
    return int((earlier_in_session(own, rows.sessions.turn) + own).sum())


def session_prefixes(rows: Requests, head: Prefixes | None = None) -> Prefixes:
    """The prefix identities of `session_rows`: each turn's message and answer (less its last token,
    whose KV is never computed) is a segment of its own, so turn k's keys name the whole session so
    far; the next turn's prompt repeats it, and finds it cached. Row r's segments: key 2r for its
    message (ending at its prompt's end), 2r + 1 for its answer. `head` (one row per row; a first
    turn's is read): segments a session's prompts start with (a shared system prompt), kept in every
    turn; the session's own keys are then numbered after head's."""
    n = len(rows)
    keys: list[int] = []
    segment_ends: list[int] = []
    counts = np.empty(n, np.int64)
    own_keys: list[int] = []
    own_ends: list[int] = []
    prompts, answers, turns = rows.input_tokens.tolist(), rows.output_tokens.tolist(), rows.sessions.turn.tolist()
    base = 0 if head is None or not len(head.keys) else int(head.keys.max()) + 1
    for r in range(n):
        if turns[r] == 0:
            own_keys, own_ends = ([], []) if head is None else head.segments(r)
        if prompts[r] > (own_ends[-1] if own_ends else 0):  # (a head may cover the whole first prompt)
            own_keys.append(base + 2 * r)
            own_ends.append(prompts[r])
        if answers[r] > 1:
            own_keys.append(base + 2 * r + 1)
            own_ends.append(prompts[r] + answers[r] - 1)
        keys.extend(own_keys)
        segment_ends.extend(own_ends)
        counts[r] = len(own_keys)
    covered = rows.input_tokens + rows.output_tokens - 1
    return Prefixes(np.array(keys, np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    covered.astype(np.int64), SEGMENT_TOKENS, np.array(segment_ends, np.int64))


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
