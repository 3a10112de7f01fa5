"""Disaggregated serving: prefill replicas make each request's KV cache, the KV crosses the fabric to a
decode replica, which streams every token to the client."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenpath.delivery.lastmile import LastMile
from tokenpath.engine.costs import GroupStepCosts
from tokenpath.engine.loop import EngineTrace, run_engine
from tokenpath.prefixes import Prefixes
from tokenpath.sim.deployment import Deployment
from tokenpath.sim.run import Run
from tokenpath.sim.scenario import Scenario
from tokenpath.sim.served import Served, client_side, merge_parts
from tokenpath.sim.summary import LogHistogram
from tokenpath.workload import Requests


class _Proxy:
    """The host side of a decode engine in disaggregated serving: requests come from the prefill
    engines (their KV transfer is traffic), so there is no client upload and no front end on the way
    in; the rest is the last mile's."""

    queues_requests = False

    def __init__(self, last_mile: LastMile) -> None:
        self.last_mile = last_mile
        self.stream_interval = last_mile.stream_interval

    def upload_ns(self, input_tokens: int) -> int:
        return 0

    def requests(self, arrival_ns: list[int], input_tokens: list[int]) -> list[tuple[int, int, int]]:
        return [(at_ns, 0, 0) for at_ns in arrival_ns]

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int, int, int]:
        return self.last_mile.on_step(gpu_end_ns, emitted, events)

    def busy_ns(self) -> dict[str, int]:
        return self.last_mile.busy_ns()

    def last_event_arrival_ns(self, leave_ns: int, output_tokens: int) -> int:
        return self.last_mile.last_event_arrival_ns(leave_ns, output_tokens)


def simulate_disaggregated(scenario: Scenario, deployment: Deployment, requests: Requests, scheduled_ns: np.ndarray,
                           visible: np.ndarray, keep_tokens: bool, itl: LogHistogram | None, warmup: np.ndarray,
                           progress: Callable[[int], None] | None, user_sent_ns: np.ndarray | None = None,
                           continuity: bool = True) -> tuple[Run, list[EngineTrace], np.ndarray]:
    """Prefill replicas make each request's KV cache; the KV crosses the fabric to a decode replica, which
    makes every token the client sees, the first included.

    In both engines the client's stream comes from the decode server, the first token once the KV has
    arrived: vLLM's disaggregated proxy sends the prompt to a prefill server with max_tokens = 1, drops
    that answer, and streams the decode server's, whose scheduler recomputes the prompt's last token and
    samples the first one itself (vllm/v1/core/sched/scheduler.py, a remote prefill's
    num_computed_tokens less one; examples/.../disagg_proxy); SGLang's decode server streams the token
    the prefill server sampled once the transfer is done (sglang/srt/disaggregation/decode.py). Modelled
    as vLLM does it: the decode replica takes the prompt with all but its last token cached and makes
    every output token, so SGLang's first token waits one decode step more than its code has it. A
    request's first token and its TTFT therefore include the KV transfer and the decode replica's queue.
    The prefill replica frees its KV when its step ends (the engines hold it until the transfer is done),
    and the proxy's hop and the decode server's own front-end pass are not modelled.

    Requests go round-robin to the prefill replicas, and round-robin again to the decode replicas. The
    KV transfer, waiting for its links included, is traffic. Returns the run, the engines' traces and how
    long each replica's links were busy with KV caches. `warmup`, `user_sent_ns`: as for served.client_side;
    `continuity`: as for simulate.simulate.
    """
    n = len(requests)
    prefills = scenario.deployment.prefill_replicas
    decodes = deployment.replicas - prefills
    delivery, engine, costs = scenario.resolved_delivery(), deployment.engine, deployment.costs
    inputs, outputs = requests.input_tokens, requests.output_tokens
    traces: list[EngineTrace] = []

    # Prefill: every request for the token that ends its prompt step (dropped: the client's come from decode).
    sent, compute, traffic, host_ns, prefill_start, preempted, hits = (np.zeros(n, np.int64) for _ in range(7))
    # Of the delivery time: the upload (the network and the front end on the way in, at the prefill
    # replica) and the decode replica's front-end time for the request's tokens.
    network_in, upload, front_queue, front_work = (np.zeros(n, np.int64) for _ in range(4))
    first_end = np.zeros(n, np.int64)
    for p in range(prefills):
        rows = np.arange(p, n, prefills)
        if len(rows) == 0:
            continue
        prefixes = None if requests.prefixes is None else requests.prefixes.take(rows)
        trace = run_engine(scheduled_ns[rows], inputs[rows], np.ones(len(rows), np.int64), costs,
                           LastMile(delivery, deployment.front_end), engine, deployment.kv_capacity_tokens,
                           prefixes=prefixes)
        traces.append(trace)
        sent[rows], compute[rows], traffic[rows] = trace.sent_ns, trace.compute_ns, trace.traffic_ns
        host_ns[rows] = trace.delivery_ns
        network_in[rows], upload[rows] = trace.network_in_ns, trace.upload_ns
        token_step = trace.token_steps()  # (the front end's time for the dropped token is not the request's)
        front_queue[rows] = trace.front_queue_ns - trace.step_front_queue_ns[token_step]
        front_work[rows] = trace.front_work_ns - trace.step_front_work_ns[token_step]
        prefill_start[rows], preempted[rows] = trace.first_step_start_ns, trace.times_preempted
        hits[rows] = trace.prefix_hit_tokens  # (the prefill replicas look prompts up; decode takes them whole)
        first_end[rows] = trace.last_step_end_ns

    # KV transfer, then decode of every output token.
    prefill_of = np.arange(n) % prefills
    decode_of = prefills + np.arange(n) % decodes
    lanes = scenario.deployment.tp if scenario.deployment.attention_dp else 1  # (a rank's link each: kv_transfers)
    held = None
    if requests.prefixes is not None and engine.prefix_caching:
        held = DecodeHeld(requests.prefixes, inputs, engine.block_size)
    decode_arrival, link_busy_ns = kv_transfers(first_end, inputs, prefill_of, decode_of, costs, deployment.replicas,
                                                lanes, held)
    transfer = decode_arrival - first_end
    last_end = np.zeros(n, np.int64)
    offsets = np.concatenate([[0], np.cumsum(outputs)]).astype(np.int64)
    leave_all = np.empty(offsets[-1], np.int64)
    for d in range(prefills, deployment.replicas):
        rows = np.flatnonzero(decode_of == d)
        if len(rows) == 0:
            continue
        rows = rows[np.argsort(decode_arrival[rows], kind="stable")]
        trace = run_engine(decode_arrival[rows], inputs[rows], outputs[rows], costs,
                           _Proxy(LastMile(delivery, deployment.front_end)), engine, deployment.kv_capacity_tokens,
                           progress=progress, cached_tokens=inputs[rows] - 1,
                           prefixes=None if requests.prefixes is None else requests.prefixes.take(rows))
        traces.append(trace)
        compute[rows] += trace.compute_ns
        traffic[rows] += trace.traffic_ns
        host_ns[rows] += trace.delivery_ns
        front_queue[rows] += trace.front_queue_ns
        front_work[rows] += trace.front_work_ns
        preempted[rows] += trace.times_preempted
        last_end[rows] = trace.last_step_end_ns
        leave = trace.step_leave_ns[trace.token_steps()]
        local = trace.token_offsets
        for k, i in enumerate(rows):  # place each request's tokens at its own offset
            leave_all[offsets[i]:offsets[i + 1]] = leave[local[k]:local[k + 1]]
    traffic += transfer

    served = Served(sent, compute, traffic, host_ns, last_end, offsets,
                    lambda lo, hi: leave_all[offsets[lo]:offsets[hi]], prefill_start, preempted, network_in,
                    front_queue, front_work, upload)
    part = client_side(served, requests, scheduled_ns, LastMile(delivery, deployment.front_end), visible, keep_tokens,
                       itl, warmup, scenario.continuity.spec() if continuity else None, user_sent_ns)
    part["replica"] = decode_of  # the replica that made its tokens
    part["prefix_hit_tokens"], part["engine_input_tokens"] = hits, requests.input_tokens
    return merge_parts([part], [np.arange(n)], n, itl), traces, link_busy_ns


class DecodeHeld:
    """The prompt segments (prefixes.py) each decode replica holds and since when, so that a request's
    transfer carries only the blocks its decode replica lacks when it starts: vLLM's decode instance looks
    the request up in its own prefix cache and reads only the blocks it did not find (NixlConnector:
    "Partial prefix cache hit: just read uncomputed blocks"), and caches those it receives. A segment,
    once arrived, is taken as held from then on (the decode engine's own cache, which evicts, decides what
    it finds when it admits the request)."""

    def __init__(self, prefixes: Prefixes, prompt_tokens: np.ndarray, block_tokens: int) -> None:
        self.prefixes, self.prompt, self.block = prefixes, prompt_tokens, block_tokens
        self.since: dict[tuple[int, int], int] = {}  # (replica, segment key) -> when it arrived there

    def lacking(self, i: int, replica: int, at_ns: int) -> int:
        """The prompt tokens of request i its decode `replica` does not hold at `at_ns`: past the whole blocks
        of its leading segments there, the last prompt token's block always sent (the decode replica's
        first step computes that token)."""
        held = 0
        for key, end in zip(*self.prefixes.segments(i)):
            arrived = self.since.get((replica, key))
            if arrived is None or arrived > at_ns:
                break
            held = end
        prompt = int(self.prompt[i])
        return prompt - min(held, prompt - 1) // self.block * self.block

    def arrived(self, i: int, replica: int, at_ns: int) -> None:
        """Request i's prompt segments reached `replica` at `at_ns` (those it held already stay as they were)."""
        for key, end in zip(*self.prefixes.segments(i)):
            if end <= self.prompt[i]:
                self.since.setdefault((replica, key), at_ns)


def kv_transfers(ready_ns: np.ndarray, prompt_tokens: np.ndarray, src: np.ndarray, dst: np.ndarray,
                 costs: GroupStepCosts, replicas: int, lanes: int = 1,
                 held: DecodeHeld | None = None) -> tuple[np.ndarray, np.ndarray]:
    """When each request's KV cache has reached its decode replica, and how long each replica's links
    were busy moving KV caches (a lane's share of them each, over `lanes`).

    Transfers start when the prefill is done, in that order, and queue first come first served for
    the sending replica's links and the receiving replica's: one transfer at a time leaves a prefill
    replica and one arrives at a decode replica, its chips' rank pairs all sending their share. Under
    attention data-parallel a request's KV cache is on one rank's chip, whose scheduler sends it over that
    chip's own link (SGLang's prefill ranks each run their own transfers): a replica has `lanes` (its tp)
    links that move one cache each at a time, a transfer taking the lane that frees first on both ends.
    Links further inside the network are not shared between transfers of different replica pairs. With
    `held`, a transfer carries only the prompt tokens its decode replica lacks (DecodeHeld).
    """
    done = np.empty(len(ready_ns), np.int64)
    busy_ns = np.zeros(replicas, np.int64)
    free_ns = [[0] * lanes for _ in range(replicas)]  # when each replica's lanes are next free
    for i in np.argsort(ready_ns, kind="stable").tolist():
        s, d = int(src[i]), int(dst[i])
        lane = min(range(lanes), key=lambda k: max(free_ns[s][k], free_ns[d][k]))
        start = max(int(ready_ns[i]), free_ns[s][lane], free_ns[d][lane])
        tokens = int(prompt_tokens[i]) if held is None else held.lacking(i, d, start)
        took_ns = round(costs.kv_transfer_s(tokens, s, d) * 1e9)
        done[i] = free_ns[s][lane] = free_ns[d][lane] = start + took_ns
        if held is not None:
            held.arrived(i, d, done[i])
        busy_ns[s] += took_ns
        busy_ns[d] += took_ns
    return done, busy_ns // lanes
