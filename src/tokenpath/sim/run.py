"""A run: per-request timings, simulated or measured, in one struct-of-arrays shape.

All times are integer nanoseconds relative to the run's start, so per-request sums are exact. Token
arrival times at the client are one flat array split by `token_offsets`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenpath.sim.continuity import DEFAULT as DEFAULT_CONTINUITY
from tokenpath.sim.continuity import ContinuitySpec


@dataclass(frozen=True)
class Run:
    source: str                  # "simulate" or "bench"
    scheduled_ns: np.ndarray     # when the workload meant to send each request
    sent_ns: np.ndarray          # when it was sent (later than scheduled under a concurrency cap)
    input_tokens: np.ndarray     # prompt tokens as the client counts them (no chat template's tokens)
    output_tokens: np.ndarray
    ttft_ns: np.ndarray          # sent -> the first event carrying a token reaches the client
    ttfv_ns: np.ndarray          # sent -> first visible character at the client
    e2e_ns: np.ndarray           # sent -> last byte at the client
    token_client_ns: np.ndarray | None  # per output token, arrival at the client (flat); None for
                                        # runs too large to keep, which carry itl_histogram instead,
                                        # and for simulate(token_times=False), which carries neither
    token_offsets: np.ndarray    # request i's tokens: token_client_ns[token_offsets[i]:token_offsets[i+1]]
    queue_ns: np.ndarray | None = None     # per-request attribution: these four (and application_ns) sum to e2e_ns
    compute_ns: np.ndarray | None = None
    traffic_ns: np.ndarray | None = None
    delivery_ns: np.ndarray | None = None
    # Simulated runs, per request, delivery_ns split (sim/served.delivery_detail): the network both
    # ways, waiting for the front end's processes, their work, and the engine's host time.
    network_ns: np.ndarray | None = None
    upload_ns: np.ndarray | None = None    # simulated: sent -> the engine has it (the network, the front end)
    frontend_queue_ns: np.ndarray | None = None
    frontend_work_ns: np.ndarray | None = None
    engine_host_ns: np.ndarray | None = None
    failed: np.ndarray | None = None       # measured runs: requests that did not complete
    last_token_ns: np.ndarray | None = None  # measured runs: sent -> the last token's event at the client
    itl_histogram: Any = None              # summary.LogHistogram of ITL when token times are not kept
    ttft_engine_ns: np.ndarray | None = None  # simulated runs: sent -> first token leaves the engine
    prefix_hit_tokens: np.ndarray | None = None  # simulated runs: prompt tokens found in the prefix cache
    # Simulated runs: prompt tokens as the engine took them, a chat template's included (of which the hits are)
    engine_input_tokens: np.ndarray | None = None
    # Simulated runs, per request: when its first engine step (its prefill) began and when the step
    # that made its last token ended (run-relative), how often it was preempted, and its engine.
    prefill_start_ns: np.ndarray | None = None
    engine_done_ns: np.ndarray | None = None
    preemptions: np.ndarray | None = None
    replica: np.ndarray | None = None
    stalls: np.ndarray | None = None       # per request, continuity.per_request: stalls after the first
    stall_ns: np.ndarray | None = None     # visible text, their summed length, and Andes' QoE; None
    qoe: np.ndarray | None = None          # where the summary computes them from token_client_ns
    continuity: ContinuitySpec = DEFAULT_CONTINUITY  # the stall threshold and reader they were judged by
    # With an [application] table (sim/application.py): per request, the stages' time on its critical path
    # (a fifth layer, so the five sum to e2e_ns), and that time per stage by name.
    application_ns: np.ndarray | None = None
    application_detail_ns: dict[str, np.ndarray] | None = None
    # Of application_ns, the part before the model call (from the user's send to the call; the rest is
    # after the model's last token), and when the model call was sent (run clock): sent_ns is the user's.
    application_before_ns: np.ndarray | None = None
    model_sent_ns: np.ndarray | None = None
    # With an agent loop (sim/agent.py): per request, its model calls and their output tokens, the last
    # call's (output_tokens) included; and by layer (queue, compute, traffic, delivery) the time of its
    # calls before the last, which model_sent_ns (the last call's send) follows.
    model_calls: np.ndarray | None = None
    model_call_output_tokens: np.ndarray | None = None
    earlier_calls_ns: dict[str, np.ndarray] | None = None
    # With an application, the rows are in the order of the model calls (an agent's first): per row, its
    # request's index in the workload (the user's send order); None where the rows are in that order.
    request_index: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sent_ns)

    @property
    def completed(self) -> np.ndarray:
        return np.ones(len(self), bool) if self.failed is None else ~self.failed

    def after(self, skipped: int) -> Run:
        """The run without its first `skipped` requests (a warm-up), the user's first sends: per-request rows
        and their tokens. With an application the rows are in the model calls' order and the warm-up is
        found by `request_index`. A run that kept no token times keeps its ITL histogram, which holds the
        measured requests' gaps alone (the simulation leaves its warm-up out of it: sim/simulate.py, `_warmup_rows`)."""
        if skipped <= 0:
            return self
        if self.request_index is None:
            rows: slice | np.ndarray = slice(skipped, None)
            first = int(self.token_offsets[skipped])
            tokens = None if self.token_client_ns is None else self.token_client_ns[first:]
            offsets = self.token_offsets[skipped:] - first
        else:
            rows = np.flatnonzero(self.request_index >= skipped)
            tokens = None if self.token_client_ns is None else self.token_client_ns[token_rows(self.token_offsets,
                                                                                               rows)]
            counts = self.token_offsets[rows + 1] - self.token_offsets[rows]
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        fields = {}
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray) and name not in ("token_client_ns", "token_offsets"):
                fields[name] = value[rows]
        for name in ("application_detail_ns", "earlier_calls_ns"):
            if getattr(self, name) is not None:
                fields[name] = {key: v[rows] for key, v in getattr(self, name).items()}
        return replace(self, **fields, token_client_ns=tokens, token_offsets=offsets)

    def stream_ns(self) -> np.ndarray:
        """Per request, sent -> the model's last token at the client: as measured (the bytes after it, a
        usage chunk and [DONE], left out), or E2E less the application's stages after the model (those
        hold no token of the stream)."""
        if self.last_token_ns is not None:
            return self.last_token_ns
        if self.application_ns is None:
            return self.e2e_ns
        return self.e2e_ns - (self.application_ns - self.application_before_ns)

    def tpot_ns(self) -> np.ndarray:
        """Per request, the stream's time per output token after the first: (last token - first token) /
        (output tokens - 1), with E2E's last token the stream's; NaN for a request of one token."""
        multi = self.output_tokens > 1
        per_token = np.full(len(self), np.nan)
        per_token[multi] = (self.stream_ns()[multi] - self.ttft_ns[multi]) / (self.output_tokens[multi] - 1)
        return per_token

    def itl_ns(self) -> np.ndarray:
        """Gaps between successive text arrivals at the client, over all completed requests."""
        if self.token_client_ns is None:
            raise ValueError("this run kept no per-token times (too many tokens to keep, or simulated with "
                             "token_times=False); its ITL statistics, if kept, are in itl_histogram")
        return itl_gaps_ns(self.token_client_ns, self.token_offsets, self.failed)


def itl_per_token_ns(run: Run) -> np.ndarray:
    """ITL as SGLang's bench_serving counts it (python/sglang/bench_serving.py: a chunk of k tokens adds
    its gap since the chunk before, divided by k, k times): per token after the first event, over the
    completed requests. One token an event, as without speculative decoding or a stream interval,
    gives the gaps of `Run.itl_ns`."""
    if run.token_client_ns is None:
        raise ValueError("this run kept no per-token times (too many tokens to keep)")
    times_ns, offsets, samples = run.token_client_ns, run.token_offsets, []
    for r in np.flatnonzero(run.completed):
        times = times_ns[offsets[r]:offsets[r + 1]]
        starts = np.flatnonzero(np.diff(times)) + 1  # each event's first token, after the first event
        if len(starts):
            sizes = np.diff(np.append(starts, len(times)))
            samples.append(np.repeat((times[starts] - times[starts - 1]) / sizes, sizes))
    return np.concatenate(samples) if samples else np.zeros(0)


def itl_gaps_ns(token_client_ns: np.ndarray, token_offsets: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
    """Gaps between successive text arrivals of each request (flat token times split by offsets), but
    those of the requests `skip` marks (failed ones, a warm-up).

    Tokens that arrive in the same event are one arrival, so zero gaps inside an event drop out.
    """
    gaps = np.diff(token_client_ns)
    first_of_request = token_offsets[1:-1] - 1  # the gap that crosses into the next request
    keep = np.ones(len(gaps), bool)
    keep[first_of_request[(first_of_request >= 0) & (first_of_request < len(gaps))]] = False
    if skip is not None:
        owner = np.repeat(np.arange(len(token_offsets) - 1), np.diff(token_offsets))[1:]
        keep &= ~skip[owner]
    gaps = gaps[keep]
    return gaps[gaps > 0]


def token_rows(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The flat positions of the tokens of `rows` (requests split by `offsets`), row after row."""
    counts = offsets[rows + 1] - offsets[rows]
    return np.repeat(offsets[rows] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
