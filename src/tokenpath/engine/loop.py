"""Run one engine replica over a whole workload: the client side (when each request is sent, and
the closed loop of a concurrency cap) around `Replica`, and the trace it leaves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tokenpath.engine.protocols import Host, StepCosts
from tokenpath.engine.replica import Replica
from tokenpath.engine.side_work import SideJobs, SideWork
from tokenpath.engine.spec import EngineSpec
from tokenpath.prefixes import Prefixes


class Client(Host, Protocol):
    """What the driver needs beyond the engine's own view of the delivery path."""

    def upload_ns(self, input_tokens: int) -> int: ...
    def last_event_arrival_ns(self, leave_ns: int, output_tokens: int) -> int: ...


@dataclass(frozen=True)
class EngineTrace:
    """What one engine replica did. Per-request rows follow the input order; per-step rows time order."""

    sent_ns: np.ndarray          # when the client sent each request
    arrival_ns: np.ndarray       # when it reached the server
    compute_ns: np.ndarray       # summed compute time of the steps each request took part in
    traffic_ns: np.ndarray       # summed traffic time of those steps
    delivery_ns: np.ndarray      # upload plus the host time that blocked those steps
    last_step_end_ns: np.ndarray  # end of the step that produced each request's last token
    spans: np.ndarray            # (request, first tick, tokens) rows, sorted: where each token came from
    tick_steps: np.ndarray | None  # the step of each tick (None: ticks are steps; see engine.replica)
    token_offsets: np.ndarray    # request i's tokens are [token_offsets[i], token_offsets[i+1]) of the flat order
    step_start_ns: np.ndarray
    step_compute_ns: np.ndarray
    step_traffic_ns: np.ndarray
    step_blocking_ns: np.ndarray
    step_leave_ns: np.ndarray    # when each step's tokens leave the server
    step_tokens: np.ndarray      # tokens processed (prefill + decode)
    step_seqs: np.ndarray        # sequences taking part
    step_attn_pairs: np.ndarray  # sum over sequences of query tokens x attended positions
    step_kv_read_tokens: np.ndarray
    step_chunk_context_tokens: np.ndarray  # sum over prompt chunks of the positions cached before each
    step_logits: np.ndarray      # sequences that sampled a token
    step_front_queue_ns: np.ndarray  # how long each step's tokens waited for the front end's processes
    step_front_work_ns: np.ndarray   # and their work there
    step_scheduled: np.ndarray   # 1 where the step called the scheduler (0: inside a multi-step window)
    step_ahead_ns: np.ndarray    # how long before the step started its host began launching its kernels
    kv_capacity_tokens: int
    preemptions: int
    prefix_hit_tokens: np.ndarray  # per request: prompt tokens found in the prefix cache at its first admission
    first_step_start_ns: np.ndarray | None = None  # per request: start of the first step it took part in, or -1
    times_preempted: np.ndarray | None = None      # per request: how often it lost its KV cache
    # Per request, of its delivery time: waiting for the front end's processes, and their work, for the
    # request on its way in and for its last tokens on their way out.
    front_queue_ns: np.ndarray | None = None
    front_work_ns: np.ndarray | None = None
    upload_ns: np.ndarray | None = None      # per request: sent -> the engine has it (network, front end)
    network_in_ns: np.ndarray | None = None  # of which across the client's network
    host_busy_ns: dict[str, int] | None = None  # the host's serial resources' busy time (Host.busy_ns)

    def token_steps(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """The step that produced each output token of requests [first, stop), flat, request-major."""
        requests = self.spans[:, 0]
        stop = len(self.token_offsets) - 1 if stop is None else stop
        rows = self.spans[np.searchsorted(requests, first):np.searchsorted(requests, stop)]
        starts, counts = rows[:, 1], rows[:, 2]
        ticks = np.repeat(starts - (np.cumsum(counts) - counts), counts)  # each span's first tick, less its place
        ticks += np.arange(len(ticks))
        return ticks if self.tick_steps is None else self.tick_steps[ticks]


def run_engine(
    scheduled_ns: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    costs: StepCosts,
    client: Client,
    spec: EngineSpec,
    kv_capacity_tokens: int,
    max_concurrency: int | None = None,
    progress: Callable[[int], None] | None = None,
    cached_tokens: np.ndarray | None = None,
    prefixes: Prefixes | None = None,
    think_ns: np.ndarray | None = None,
    side: SideJobs | None = None,
) -> EngineTrace:
    """Simulate one engine replica serving the given requests (rows sorted by scheduled time).

    Open loop: each request is sent at its scheduled time. With `max_concurrency`, at most that many
    are outstanding: the next one is sent when a slot frees (the client has a last byte) or at its
    scheduled time, whichever is later. `cached_tokens`: prompt tokens whose KV arrives with each
    request. `think_ns` (multi-turn sessions; open loop only): a row with a value >= 0 is the next turn
    of the row before it, sent that long after the previous answer's last byte reaches the client.
    `side` (open loop only): each request's job on the replica's GPU before it is sent
    (engine/side_work.py); a request is sent when `side.release_ns` says, once its job is done.
    """
    n = len(scheduled_ns)
    if cached_tokens is None:
        cached_tokens = np.zeros(n, np.int64)
    prompt, cached, out = input_tokens.tolist(), cached_tokens.tolist(), output_tokens.tolist()
    scheduled = scheduled_ns.tolist()
    sent = [0] * n
    replica = Replica(costs, client, spec, kv_capacity_tokens)
    if prefixes is not None:
        replica.hold_warm(prefixes)

    def send(i: int, at_ns: int) -> None:
        upload_ns = client.upload_ns(prompt[i])
        sent[i] = at_ns
        prefix = None if prefixes is None else prefixes.segments(i)
        replica.submit(prompt[i], out[i], at_ns + upload_ns, upload_ns, cached[i], prefix)

    if side is not None:
        if max_concurrency is not None or think_ns is not None:
            raise ValueError("side work holds requests back itself: no concurrency cap, no sessions")
        return _run_side(input_tokens, output_tokens, cached_tokens, prefixes, SideWork(side), replica, client,
                         progress, kv_capacity_tokens)
    if think_ns is not None:
        if max_concurrency is not None:
            raise ValueError("sessions are closed loops of their own: no concurrency cap")
        return _run_sessions(scheduled_ns, input_tokens, output_tokens, cached_tokens, prefixes, think_ns,
                             replica, client, progress, kv_capacity_tokens)
    if max_concurrency is None:  # open loop: every request is sent at its scheduled time
        upload = _uploads(client, input_tokens)
        sent = scheduled
        replica.submit_all(input_tokens, output_tokens, scheduled_ns + upload, upload, cached_tokens, prefixes)
        next_to_send = n
    else:
        for i in range(min(n, max_concurrency)):
            send(i, scheduled[i])
        next_to_send = min(n, max_concurrency)
    done = 0
    while done < n:
        if replica.decode_run():  # (steps that finish nothing and see no request come)
            continue
        finished = replica.step()
        if finished:
            done += len(finished)
            leave_ns = replica.last_leave_ns
            for f in finished:
                if next_to_send < n:
                    freed_ns = client.last_event_arrival_ns(leave_ns, out[f])
                    send(next_to_send, max(scheduled[next_to_send], freed_ns))
                    next_to_send += 1
            if progress is not None:
                progress(len(finished))
    return _trace(replica, sent, out, kv_capacity_tokens)


def _run_sessions(scheduled_ns: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                  cached_tokens: np.ndarray, prefixes: Prefixes | None, think_ns: np.ndarray, replica: Replica,
                  client: Client, progress: Callable[[int], None] | None, kv_capacity_tokens: int) -> EngineTrace:
    """Sessions' first turns go at their scheduled times; each later turn is held until the turn before
    it finishes at the client, then sent after its think time: O(1) per finished request."""
    n = len(scheduled_ns)
    upload = _uploads(client, input_tokens)
    held = think_ns >= 0
    replica.submit_all(input_tokens, output_tokens, scheduled_ns + upload, upload, cached_tokens, prefixes, held)
    sent = scheduled_ns.tolist()
    out, think, uploads = output_tokens.tolist(), think_ns.tolist(), upload.tolist()
    think.append(-1)  # nothing follows the last row
    done = 0
    while done < n:
        if replica.decode_run():
            continue
        finished = replica.step()
        if finished:
            done += len(finished)
            for f in finished:
                wait_ns = think[f + 1]
                if wait_ns >= 0:
                    at_ns = client.last_event_arrival_ns(replica.last_leave_ns, out[f]) + wait_ns
                    sent[f + 1] = at_ns
                    replica.send(f + 1, at_ns + uploads[f + 1], uploads[f + 1])
            if progress is not None:
                progress(len(finished))
    return _trace(replica, sent, out, kv_capacity_tokens)


def _run_side(input_tokens: np.ndarray, output_tokens: np.ndarray, cached_tokens: np.ndarray,
              prefixes: Prefixes | None, side: SideWork, replica: Replica, client: Client,
              progress: Callable[[int], None] | None, kv_capacity_tokens: int) -> EngineTrace:
    """Every request is held until its job on the GPU is done, then sent when `release_ns` says."""
    n = len(input_tokens)
    upload = _uploads(client, input_tokens)
    replica.submit_all(input_tokens, output_tokens, upload, upload, cached_tokens, prefixes, np.ones(n, bool))
    sent, uploads, release = [0] * n, upload.tolist(), side.jobs.release_ns
    done = 0
    while done < n:
        finished, jobs, done_ns = side.advance(replica)
        for row in jobs:
            sent[row] = at_ns = release(row, done_ns)
            replica.send(row, at_ns + uploads[row], uploads[row])
        if finished:
            done += len(finished)
            if progress is not None:
                progress(len(finished))
    return _trace(replica, sent, output_tokens.tolist(), kv_capacity_tokens)


def _uploads(client: Client, input_tokens: np.ndarray) -> np.ndarray:
    """Each request's upload time: once per distinct prompt length."""
    lengths, which = np.unique(input_tokens, return_inverse=True)
    return np.array([client.upload_ns(p) for p in lengths.tolist()], dtype=np.int64)[which]


def _trace(replica: Replica, sent: list[int], out: list[int], kv_capacity_tokens: int) -> EngineTrace:
    rows, requests = replica.rows, replica.requests
    steps, spans, tick_steps = rows.steps(), rows.spans(), rows.tick_steps()
    hits = np.zeros(len(sent), np.int64)
    if replica.prefix is not None and replica.prefix.hit_tokens:
        found = replica.prefix.hit_tokens
        hits[np.fromiter(found.keys(), np.int64, len(found))] = np.fromiter(found.values(), np.int64, len(found))
    return EngineTrace(
        sent_ns=np.array(sent, dtype=np.int64),
        arrival_ns=np.array(requests.arrival, dtype=np.int64),
        **rows.accounts(steps, spans, tick_steps, requests.upload, requests.times_preempted, requests.front_queue,
                        requests.front_work),
        spans=spans,
        tick_steps=tick_steps,
        token_offsets=np.concatenate([[0], np.cumsum(out)]).astype(np.int64),
        **{f"step_{name}": values for name, values in steps.items()},
        kv_capacity_tokens=kv_capacity_tokens,
        preemptions=replica.preemptions,
        prefix_hit_tokens=hits,
        host_busy_ns=replica.host.busy_ns(),
    )
