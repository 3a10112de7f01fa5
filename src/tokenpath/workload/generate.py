"""Turn a `WorkloadSpec` into `Requests`."""

from __future__ import annotations

import numpy as np

from tokenpath.errors import UserError
from tokenpath.workload._files import sha256_file
from tokenpath.workload.arrivals import arrival_times_s
from tokenpath.workload.lengths import sample_lengths
from tokenpath.workload.requests import Requests
from tokenpath.prefixes import SEGMENT_TOKENS, Prefixes
from tokenpath.workload.spec import MAX_ARRIVAL_SPAN_S, SharedPrefixSpec, WorkloadSpec
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


def fingerprint_inputs(spec: WorkloadSpec) -> dict[str, str]:
    """The sha256 (hex) of each file the workload reads, keyed by its path as written in the spec, so
    a scenario's fingerprint changes when a trace or lengths file does."""
    files: dict[str, str] = {}
    if spec.trace is not None:
        files[spec.trace.path] = "workload.trace file"
    else:
        for field, lengths in (("workload.input", spec.input), ("workload.output", spec.output)):
            if lengths.kind == "empirical":
                files.setdefault(lengths.path, f"{field} lengths file")
    return {path: sha256_file(path, what) for path, what in files.items()}
