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

    def upload_ns(self, input_tokens: int) -> int: ...
    def on_step(self, gpu_end_ns: int, token_index: np.ndarray, output_tokens: np.ndarray) -> tuple[int, int]: ...
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
    kv_capacity_tokens: int
    preemptions: int


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


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

    computed = np.zeros(n, np.int64)  # tokens with KV in the cache
    generated = np.zeros(n, np.int64)  # tokens sampled and sent
    blocks = np.zeros(n, np.int64)
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

    waiting: deque[int] = deque()
    running = np.empty(0, np.int64)
    steps: list[tuple[int, ...]] = []
    emitted: list[np.ndarray] = []
    now = 0
    done = 0
    preemptions = 0

    while done < n:
        while arrivals and arrivals[0][0] <= now:
            waiting.append(heapq.heappop(arrivals)[1])
        if not waiting and len(running) == 0:
            now = arrivals[0][0]
            continue

        budget = budget_max
        num = np.empty(0, np.int64)
        if len(running):
            need = prompt[running] + generated[running] - computed[running]
            before = np.cumsum(need) - need
            num = np.clip(budget - before, 0, need)
            extra = np.maximum(-(-(computed[running] + num) // block) - blocks[running], 0)
            if extra.sum() > free_blocks:
                # Keep the longest head whose growth fits in the free blocks plus those freed by
                # preempting everything behind it.
                held_behind = np.append(np.cumsum(blocks[running][::-1])[::-1][1:], 0)
                fits = np.cumsum(extra) <= free_blocks + held_behind
                keep = int(np.argmin(fits)) if not fits.all() else len(running)
                victims = running[keep:]
                free_blocks += int(blocks[victims].sum())
                blocks[victims] = 0
                computed[victims] = 0
                waiting.extendleft(victims[::-1].tolist())
                preemptions += len(victims)
                running, num, extra = running[:keep], num[:keep], extra[:keep]
            blocks[running] += extra
            free_blocks -= int(extra.sum())
            budget -= int(num.sum())

        admitted: list[int] = []
        admitted_num: list[int] = []
        room = spec.max_num_seqs - len(running)
        while waiting and len(admitted) < room and budget > 0:
            i = waiting[0]
            need_i = int(prompt[i] + generated[i] - computed[i])
            if need_i > budget and not spec.chunked_prefill:
                break
            num_i = min(need_i, budget)
            extra_i = -(-(int(computed[i]) + num_i) // block) - int(blocks[i])
            if extra_i > free_blocks:
                break
            waiting.popleft()
            blocks[i] += extra_i
            free_blocks -= extra_i
            budget -= num_i
            admitted.append(i)
            admitted_num.append(num_i)
        if admitted:
            running = np.concatenate([running, np.array(admitted, np.int64)])
            num = np.concatenate([num, np.array(admitted_num, np.int64)])

        active = num > 0
        part = running[active]
        q = num[active]
        p = computed[part]
        if len(part) == 0:
            raise RuntimeError("engine stalled with work queued: a request cannot fit the KV cache")
        emits = p + q == prompt[part] + generated[part]
        emitters = part[emits]
        num_tokens = int(q.sum())
        attn_pairs = float((q * p).sum() + (q * (q + 1) // 2).sum())
        kv_read = float((p + q).sum())
        compute_ns = _ns(costs.compute_s(num_tokens, len(emitters), attn_pairs, kv_read))
        traffic_ns = _ns(costs.traffic_s(num_tokens))
        gpu_end = now + compute_ns + traffic_ns
        blocking_ns, leave_ns = host.on_step(gpu_end, generated[emitters], out[emitters])
        end = gpu_end + blocking_ns

        acc_compute[part] += compute_ns
        acc_traffic[part] += traffic_ns
        acc_delivery[part] += blocking_ns
        computed[part] += q
        generated[emitters] += 1
        decode_seqs = int(np.count_nonzero((q == 1) & (p >= prompt[part])))
        steps.append((now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens, len(part), decode_seqs, int(kv_read)))
        emitted.append(emitters)

        finished = emitters[generated[emitters] == out[emitters]]
        if len(finished):
            last_end[finished] = end
            free_blocks += int(blocks[finished].sum())
            blocks[finished] = 0
            running = running[~np.isin(running, finished)]
            done += len(finished)
            for f in finished.tolist():
                if next_to_send < n:
                    freed_at = host.last_event_arrival_ns(leave_ns, int(out[f]))
                    send(next_to_send, max(int(scheduled_ns[next_to_send]), freed_at))
                    next_to_send += 1
            if progress is not None:
                progress(len(finished))
        now = end

    step_rows = np.array(steps, dtype=np.int64).reshape(-1, 9)
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
        kv_capacity_tokens=kv_capacity_tokens,
        preemptions=preemptions,
    )
