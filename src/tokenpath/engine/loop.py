"""Continuous batching over time, as vLLM's V1 scheduler does it.

Each step: running sequences first, in admission order, each taking the tokens it still needs (one to
decode, the rest of its prompt when prefilling) from the step's token budget; then waiting sequences,
first come first served, while the step has room (sequences, tokens, KV-cache blocks). A prompt longer
than the remaining budget is prefilled in chunks across steps. When a growing sequence finds no free
KV block, the most recently admitted running sequences are preempted and will be recomputed: they lose
their cache and go back to the front of the queue, keeping the tokens already sent.

A step lasts its compute time plus its non-overlapped traffic time, then whatever the host blocks it
for (copying the sampled ids, and detokenizing when that runs inline). Time is integer nanoseconds,
so each request's time splits exactly into waiting, compute, traffic and delivery.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from tokenpath.engine.spec import EngineSpec


class StepCosts(Protocol):
    def compute_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float) -> float: ...
    def traffic_s(self, num_tokens: int) -> float: ...


class Host(Protocol):
    """What the engine needs from the delivery path (implemented by delivery.LastMile)."""

    needs_token_index: bool  # whether on_step needs each emitted token's index and its sequence's length

    def upload_ns(self, input_tokens: int) -> int: ...
    def on_step(self, gpu_end_ns: int, emitted: int, token_index: np.ndarray | None = None,
                output_tokens: np.ndarray | None = None) -> tuple[int, int]: ...
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
    token_step: np.ndarray       # per output token (flat, request-major): the step that produced it
    token_offsets: np.ndarray    # request i's tokens are token_step[token_offsets[i]:token_offsets[i+1]]
    step_start_ns: np.ndarray
    step_compute_ns: np.ndarray
    step_traffic_ns: np.ndarray
    step_blocking_ns: np.ndarray
    step_leave_ns: np.ndarray    # when each step's tokens leave the server
    step_tokens: np.ndarray      # tokens processed (prefill + decode)
    step_seqs: np.ndarray        # sequences taking part
    step_decode_seqs: np.ndarray  # of those, sequences decoding one token
    step_kv_read_tokens: np.ndarray
    step_attn_pairs: np.ndarray  # sum over sequences of query tokens x attended positions
    step_logits: np.ndarray      # sequences that sampled a token
    kv_capacity_tokens: int
    preemptions: int


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _Running:
    """The running sequences, in admission order, as arrays aligned with each other.

    Kept aligned (rather than gathered from per-request arrays every step) because the engine loop
    touches every running sequence every step; rows leave only when sequences finish or are preempted.
    """

    FIELDS = ("ids", "target", "computed", "blocks", "left", "sent", "compute", "traffic", "delivery")

    def __init__(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, np.empty(0, np.int64))

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, rows: dict[str, list[int]]) -> None:
        for name in self.FIELDS:
            setattr(self, name, np.concatenate([getattr(self, name), np.array(rows[name], np.int64)]))

    def keep(self, mask: np.ndarray) -> None:
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name)[mask])


def run_engine(
    scheduled_ns: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    costs: StepCosts,
    host: Host,
    spec: EngineSpec,
    kv_capacity_tokens: int,
    max_concurrency: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> EngineTrace:
    """Simulate one engine replica serving the given requests (rows sorted by scheduled time)."""
    n = len(scheduled_ns)
    prompt = np.asarray(input_tokens, dtype=np.int64)
    out = np.asarray(output_tokens, dtype=np.int64)
    block = spec.block_size
    free_blocks = kv_capacity_tokens // block
    budget_max = spec.max_num_batched_tokens

    # Per-request state while waiting (a preempted request keeps the tokens it has sent).
    generated = np.zeros(n, np.int64)
    acc_compute = np.zeros(n, np.int64)
    acc_traffic = np.zeros(n, np.int64)
    acc_delivery = np.zeros(n, np.int64)
    sent = np.full(n, -1, np.int64)
    arrival = np.full(n, -1, np.int64)
    last_end = np.zeros(n, np.int64)

    arrivals: list[tuple[int, int]] = []

    def send(i: int, at_ns: int) -> None:
        upload = host.upload_ns(int(prompt[i]))
        sent[i] = at_ns
        arrival[i] = at_ns + upload
        acc_delivery[i] += upload
        heapq.heappush(arrivals, (int(arrival[i]), i))

    first_wave = n if max_concurrency is None else min(n, max_concurrency)
    for i in range(first_wave):
        send(i, int(scheduled_ns[i]))
    next_to_send = first_wave

    def park(rows: np.ndarray, run: _Running) -> None:
        """Write running rows' accounts back to the per-request arrays."""
        ids = run.ids[rows]
        generated[ids] = out[ids] - run.left[rows]
        acc_compute[ids] = run.compute[rows]
        acc_traffic[ids] = run.traffic[rows]
        acc_delivery[ids] = run.delivery[rows]

    waiting: deque[int] = deque()
    run = _Running()
    steps: list[tuple[int, ...]] = []
    emitted: list[np.ndarray] = []
    now = 0
    done = 0
    preemptions = 0

    while done < n:
        while arrivals and arrivals[0][0] <= now:
            waiting.append(heapq.heappop(arrivals)[1])
        if not waiting and len(run) == 0:
            now = arrivals[0][0]
            continue

        # Running sequences first, in admission order, each taking what it needs from the budget.
        budget = budget_max
        need = run.target - run.computed
        total_need = int(need.sum())
        if total_need <= budget:
            num = need
        else:
            num = np.minimum(np.maximum(budget - (np.cumsum(need) - need), 0), need)
        grown_blocks = (run.computed + num + (block - 1)) // block
        extra = grown_blocks - run.blocks
        if int(extra.sum()) > free_blocks:
            # Keep the longest head whose growth fits in the free blocks plus those freed by
            # preempting everything behind it; the preempted lose their cache and wait at the front.
            held_behind = np.append(np.cumsum(run.blocks[::-1])[::-1][1:], 0)
            fits = np.cumsum(extra) <= free_blocks + held_behind
            keep = int(np.argmin(fits))
            victims = np.arange(keep, len(run))
            park(victims, run)
            free_blocks += int(run.blocks[keep:].sum())
            waiting.extendleft(run.ids[keep:][::-1].tolist())
            preemptions += len(victims)
            head = np.arange(len(run)) < keep
            run.keep(head)
            num, grown_blocks, extra = num[:keep], grown_blocks[:keep], extra[:keep]
        run.blocks = grown_blocks
        free_blocks -= int(extra.sum())
        budget -= int(num.sum())

        # Then waiting sequences, first come first served, while the step has room.
        admitted: dict[str, list[int]] = {name: [] for name in _Running.FIELDS} if waiting else {}
        admitted_num: list[int] = []
        room = spec.max_num_seqs - len(run)
        while waiting and len(admitted_num) < room and budget > 0:
            i = waiting[0]
            need_i = int(prompt[i] + generated[i])  # a waiting sequence has no cache
            if need_i > budget and not spec.chunked_prefill:
                break
            num_i = min(need_i, budget)
            blocks_i = -(-num_i // block)
            if blocks_i > free_blocks:
                break
            waiting.popleft()
            free_blocks -= blocks_i
            budget -= num_i
            row = (i, need_i, 0, blocks_i, int(out[i] - generated[i]), int(sent[i]),
                   int(acc_compute[i]), int(acc_traffic[i]), int(acc_delivery[i]))
            for name, value in zip(_Running.FIELDS, row):
                admitted[name].append(value)
            admitted_num.append(num_i)
        if admitted_num:
            run.append(admitted)
            num = np.concatenate([num, np.array(admitted_num, np.int64)])

        # The step: its cost from the batch actually formed.
        active = num > 0
        all_active = bool(active.all())
        q = num if all_active else num[active]
        p = run.computed if all_active else run.computed[active]
        emits = run.computed + num == run.target
        num_tokens = int(q.sum())
        attn_pairs = int(np.dot(q, p) + np.dot(q, q + 1) // 2)
        kv_read = int(p.sum()) + num_tokens
        emitters = run.ids[emits]
        compute_ns = _ns(costs.compute_s(num_tokens, len(emitters), attn_pairs, kv_read))
        traffic_ns = _ns(costs.traffic_s(num_tokens))
        gpu_end = now + compute_ns + traffic_ns
        if host.needs_token_index:
            blocking_ns, leave_ns = host.on_step(gpu_end, len(emitters), out[emitters] - run.left[emits], out[emitters])
        else:
            blocking_ns, leave_ns = host.on_step(gpu_end, len(emitters))
        end = gpu_end + blocking_ns

        if all_active:
            run.compute += compute_ns
            run.traffic += traffic_ns
            run.delivery += blocking_ns
        else:
            run.compute[active] += compute_ns
            run.traffic[active] += traffic_ns
            run.delivery[active] += blocking_ns
        run.computed += num
        run.target += emits
        run.left -= emits
        decode_seqs = int(np.count_nonzero(num == 1)) if num_tokens != len(num) else len(num)
        steps.append((now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens, len(q), decode_seqs, kv_read,
                      attn_pairs, len(emitters)))
        emitted.append(emitters)

        finished = run.left == 0
        if finished.any():
            rows = np.flatnonzero(finished)
            park(rows, run)
            ids = run.ids[rows]
            last_end[ids] = end
            free_blocks += int(run.blocks[rows].sum())
            run.keep(~finished)
            done += len(rows)
            for f in ids.tolist():
                if next_to_send < n:
                    freed_at = host.last_event_arrival_ns(leave_ns, int(out[f]))
                    send(next_to_send, max(int(scheduled_ns[next_to_send]), freed_at))
                    next_to_send += 1
            if progress is not None:
                progress(len(rows))
        now = end

    step_rows = np.array(steps, dtype=np.int64).reshape(-1, 11)
    emit_ids = np.concatenate(emitted) if emitted else np.empty(0, np.int64)
    emit_steps = np.repeat(np.arange(len(emitted)), [len(e) for e in emitted])
    order = np.argsort(emit_ids, kind="stable")
    return EngineTrace(
        sent_ns=sent,
        arrival_ns=arrival,
        compute_ns=acc_compute,
        traffic_ns=acc_traffic,
        delivery_ns=acc_delivery,
        last_step_end_ns=last_end,
        token_step=emit_steps[order],
        token_offsets=np.concatenate([[0], np.cumsum(out)]).astype(np.int64),
        step_start_ns=step_rows[:, 0],
        step_compute_ns=step_rows[:, 1],
        step_traffic_ns=step_rows[:, 2],
        step_blocking_ns=step_rows[:, 3],
        step_leave_ns=step_rows[:, 4],
        step_tokens=step_rows[:, 5],
        step_seqs=step_rows[:, 6],
        step_decode_seqs=step_rows[:, 7],
        step_kv_read_tokens=step_rows[:, 8],
        step_attn_pairs=step_rows[:, 9],
        step_logits=step_rows[:, 10],
        kv_capacity_tokens=kv_capacity_tokens,
        preemptions=preemptions,
    )
