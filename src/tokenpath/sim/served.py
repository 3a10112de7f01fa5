"""From what the server did to what the client saw: each request's token times through the last
mile, its TTFT, TTFV, E2E and continuity, and its time split exactly into queue, compute, traffic and
delivery; then the replicas' rows merged back into one Run in workload order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.loop import EngineTrace
from tokenpath.sim import continuity
from tokenpath.sim.run import Run, itl_gaps_ns
from tokenpath.sim.summary import LogHistogram
from tokenpath.workload import Requests

# Token times are built this many at a time, so memory stays bounded however long the run, and each
# pass over a chunk's arrays (2 MB each) finds them in the CPU's caches: 2M tokens at a time took the
# offline rows' client side (validate) nine times as long, most of it faulting in fresh pages.
CHUNK_TOKENS = 262_144


@dataclass(frozen=True)
class Served:
    """What the server side did for a set of requests: per request (input order) the time it was sent
    and its summed compute, traffic and delivery (upload and host blocking) time, the end of the step
    that made its last token, and when each token left the server (`leave_ns(lo, hi)`: the flat token
    times of requests lo..hi-1)."""

    sent_ns: np.ndarray
    compute_ns: np.ndarray
    traffic_ns: np.ndarray
    delivery_ns: np.ndarray
    last_step_end_ns: np.ndarray
    token_offsets: np.ndarray
    leave_ns: Callable[[int, int], np.ndarray]
    first_step_start_ns: np.ndarray | None = None  # when each request's first step (its prefill) began
    times_preempted: np.ndarray | None = None
    # Of the delivery time: the upload across the network, and the time waiting for and working in the
    # front end's processes (the request's, and its last tokens'); None where not split.
    network_in_ns: np.ndarray | None = None
    front_queue_ns: np.ndarray | None = None
    front_work_ns: np.ndarray | None = None
    upload_ns: np.ndarray | None = None  # sent -> the engine has it: the network and the front end

    @staticmethod
    def of(trace: EngineTrace) -> Served:
        return Served(trace.sent_ns, trace.compute_ns, trace.traffic_ns, trace.delivery_ns, trace.last_step_end_ns,
                      trace.token_offsets, lambda lo, hi: trace.step_leave_ns[trace.token_steps(lo, hi)],
                      trace.first_step_start_ns, trace.times_preempted, trace.network_in_ns, trace.front_queue_ns,
                      trace.front_work_ns, trace.upload_ns)


def client_side(trace: Served, requests: Requests, scheduled_ns: np.ndarray, last_mile: LastMile,
                 visible: np.ndarray, keep_tokens: bool, itl: LogHistogram | None, warmup: np.ndarray,
                 flow_spec: continuity.ContinuitySpec | None = continuity.DEFAULT,
                 user_sent_ns: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-request client-side timings of one replica, with exact attribution.

    With `keep_tokens` the result holds every token's arrival at the client ("token_client_ns");
    otherwise ITL gaps go into `itl` where given (None: neither, for a caller that reads per-request
    figures only), but those of the requests `warmup` marks (the summary leaves the warm-up out, as
    `Run.after` does with kept token times). `flow_spec`: the reader each request's stalls and QoE are
    judged by (continuity.py); None: not judged (a caller that reads only latencies and throughput).
    `user_sent_ns`: when the user sent each request, where that is before the model call (an
    application's stages run first): QoE's reader starts waiting then.
    """
    n = len(requests)
    offsets = trace.token_offsets
    first_leave, last_leave, ttft, ttfv, last_client = (np.empty(n, np.int64) for _ in range(5))
    if flow_spec is not None:
        stalls, stall_ns, qoe = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    chunks: list[np.ndarray] = []  # each chunk's token arrivals, with keep_tokens
    lo = 0
    while lo < n:
        hi = min(n, max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + CHUNK_TOKENS, side="right")) - 1))
        local = offsets[lo:hi + 1] - offsets[lo]
        leave_ns = trace.leave_ns(lo, hi)
        client_ns = last_mile.client_times_ns(leave_ns, local)
        first = local[:-1]
        first_leave[lo:hi] = leave_ns[first]
        last_leave[lo:hi] = leave_ns[local[1:] - 1]
        ttft[lo:hi] = client_ns[first]
        ttfv[lo:hi] = client_ns[first + visible[lo:hi]]
        last_client[lo:hi] = client_ns[local[1:] - 1]
        if flow_spec is not None:
            origin_ns = (trace.sent_ns if user_sent_ns is None else user_sent_ns)[lo:hi]
            flow = continuity.per_request(client_ns, local, origin_ns, ttfv[lo:hi], flow_spec)
            stalls[lo:hi], stall_ns[lo:hi], qoe[lo:hi] = flow["stalls"], flow["stall_ns"], flow["qoe"]
        if keep_tokens:
            chunks.append(client_ns)
        elif itl is not None:
            itl.add(itl_gaps_ns(client_ns, local, warmup[lo:hi]))
        lo = hi
    e2e = last_client - trace.sent_ns
    delivery = trace.delivery_ns + (last_client - trace.last_step_end_ns)
    queue = e2e - trace.compute_ns - trace.traffic_ns - delivery
    if (queue < 0).any():
        raise AssertionError("attribution exceeds end-to-end time: the engine's accounting is broken")
    part = {
        "scheduled_ns": scheduled_ns,
        "sent_ns": trace.sent_ns,
        "input_tokens": requests.client_input_tokens,  # as the client counts them: no chat template's tokens
        "output_tokens": requests.output_tokens,
        "ttft_ns": ttft - trace.sent_ns,
        "ttft_engine_ns": first_leave - trace.sent_ns,
        "ttfv_ns": ttfv - trace.sent_ns,
        "e2e_ns": e2e,
        "queue_ns": queue,
        "compute_ns": trace.compute_ns,
        "traffic_ns": trace.traffic_ns,
        "delivery_ns": delivery,
        "engine_done_ns": trace.last_step_end_ns,
    }
    if flow_spec is not None:
        part |= {"stalls": stalls, "stall_ns": stall_ns, "qoe": qoe}
    if trace.upload_ns is not None:
        part["upload_ns"] = trace.upload_ns
    if trace.network_in_ns is not None:
        part |= delivery_detail(delivery, trace.network_in_ns + (last_client - last_leave), trace.front_queue_ns,
                                trace.front_work_ns)
    if trace.first_step_start_ns is not None:
        part["prefill_start_ns"] = trace.first_step_start_ns
    if trace.times_preempted is not None:
        part["preemptions"] = trace.times_preempted
    if keep_tokens:
        part["token_client_ns"] = chunks[0] if len(chunks) == 1 else np.concatenate([np.empty(0, np.int64), *chunks])
    return part


def delivery_detail(delivery_ns: np.ndarray, network_ns: np.ndarray, front_queue_ns: np.ndarray,
                    front_work_ns: np.ndarray) -> dict[str, np.ndarray]:
    """Each request's delivery time split: the network both ways, waiting for the front end's processes,
    their work, and the rest, the engine's host time (the ids' copy, detokenizing in the engine's own
    process, a multi-step window's end)."""
    engine_host = delivery_ns - network_ns - front_queue_ns - front_work_ns
    if (engine_host < 0).any():
        raise AssertionError("the delivery detail exceeds the delivery time: the front end's accounting is broken")
    return {"network_ns": network_ns, "frontend_queue_ns": front_queue_ns, "frontend_work_ns": front_work_ns,
            "engine_host_ns": engine_host}


def merge_parts(parts: list[dict[str, np.ndarray]], owners: list[np.ndarray], n: int, itl: LogHistogram | None) -> Run:
    """Put replica rows back in workload order and rebuild the flat token array."""
    fields: dict[str, np.ndarray] = {}
    for key in parts[0]:
        if key == "token_client_ns":
            continue
        merged = np.empty(n, dtype=parts[0][key].dtype)
        for part, rows in zip(parts, owners):
            merged[rows] = part[key]
        fields[key] = merged
    offsets = np.concatenate([[0], np.cumsum(fields["output_tokens"])]).astype(np.int64)
    if "token_client_ns" not in parts[0]:  # (not kept: the ITL histogram, where given, stands in for them)
        return Run(source="simulate", token_client_ns=None, token_offsets=offsets, itl_histogram=itl, **fields)
    if len(parts) == 1 and _in_order(owners[0], n):  # one replica's rows as they were: its tokens as they lie
        return Run(source="simulate", token_offsets=offsets, token_client_ns=parts[0]["token_client_ns"], **fields)
    tokens = np.empty(offsets[-1], np.int64)
    for part, rows in zip(parts, owners):
        lengths = part["output_tokens"]
        local_starts = np.cumsum(lengths) - lengths
        shift = np.repeat(offsets[rows] - local_starts, lengths)
        tokens[shift + np.arange(len(shift))] = part["token_client_ns"]
    return Run(source="simulate", token_offsets=offsets, token_client_ns=tokens, **fields)


def _in_order(rows: np.ndarray, n: int) -> bool:
    """Whether `rows` is 0, 1, ..., n-1."""
    return len(rows) == n and (n == 0 or (rows[0] == 0 and bool((np.diff(rows) == 1).all())))
