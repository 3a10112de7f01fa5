"""One engine replica doing continuous batching as vLLM's V1 scheduler does, one step at a time.

Each step: running sequences first, in admission order, each taking the tokens it still needs (one to
decode, the rest of its prompt while prefilling) from the step's token budget; then waiting
sequences, first come first served, while the step has room (sequences, tokens, KV-cache blocks). A
prompt longer than the remaining budget is prefilled in chunks over several steps. When a growing
sequence finds no free KV block, the most recently admitted running sequences are preempted and will
be recomputed: they lose their cache and go back to the front of the queue, keeping the tokens
already sent.

A step lasts its compute time plus its non-overlapped traffic time, then whatever the host blocks it
for (copying the sampled ids, and detokenizing when that runs inline). Time is integer nanoseconds,
so each request's time splits exactly into waiting, compute, traffic and delivery.

Why the bookkeeping looks the way it does: a step costs O(1) Python work plus O(1) per request that
joins, finishes or is preempted, never O(batch). That holds because the token budget covers every
decoding sequence (vLLM requires max_num_batched_tokens >= max_num_seqs), so at most one sequence is
part-way through its prompt, and it is the one admitted last. Decoding sequences are then described
by aggregates (their count and summed context) plus, per sequence, the step it started decoding at:
its context, its KV blocks and its token index at any later step follow from that.

Nor is each request's share of the step costs added up while stepping: the replica records which
steps each request took part in (spans of consecutive steps) and `accounts` sums the step columns
over them afterwards, in numpy. Per-step and per-span rows are buffered as Python ints and moved into
numpy in blocks (`_Rows`): writing one item of an `array("q")` goes through argument parsing, about
a thousand machine instructions, where appending to a list takes a few dozen.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tokenpath.engine.spec import EngineSpec


class StepCosts(Protocol):
    def compute_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float) -> float: ...
    def traffic_s(self, num_tokens: int, decode_only: bool) -> float: ...


class Host(Protocol):
    """What the engine needs from the delivery path (implemented by delivery.LastMile)."""

    stream_interval: int  # tokens per SSE event: the first token alone, then groups, the last flushed

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int]:
        """(blocking_ns, leave_ns) of a step that sampled `emitted` tokens closing `events` events."""
        ...


# Arrival heap keys pack (time, request) into one int, which compares far faster than a tuple.
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1

STEP_FIELDS = ("start_ns", "compute_ns", "traffic_ns", "blocking_ns", "leave_ns", "tokens", "seqs",
               "attn_pairs", "kv_read_tokens", "logits")


def closes_event(token_index: int, output_tokens: int, interval: int) -> bool:
    """Whether token `token_index` of a sequence is the last of its SSE event (see delivery.lastmile)."""
    return token_index % interval == 0 or token_index == output_tokens - 1


class _Rows:
    """A growing int64 table: rows are appended to `buffer` (a flat list of Python ints) and moved
    into numpy blocks by `flush`, so memory stays at 8 bytes per value however long the run."""

    FLUSH_VALUES = 1 << 16

    def __init__(self, width: int) -> None:
        self.width = width
        self.buffer: list[int] = []  # callers extend it in place: its identity never changes
        self.blocks: list[np.ndarray] = []

    def flush(self) -> None:
        if self.buffer:
            self.blocks.append(np.fromiter(self.buffer, np.int64, len(self.buffer)).reshape(-1, self.width))
            self.buffer.clear()

    def array(self) -> np.ndarray:
        """Every row so far, as a (rows, width) array."""
        self.flush()
        if len(self.blocks) != 1:
            self.blocks = [np.concatenate(self.blocks) if self.blocks else np.empty((0, self.width), np.int64)]
        return self.blocks[0]


@dataclass
class _Prefill:
    """The one sequence part-way through its prompt (or its recompute after preemption)."""

    request: int
    computed: int  # tokens in its KV cache
    blocks: int
    target: int    # tokens it needs in its KV cache to sample: its prompt and the tokens already sent


class Replica:
    """An engine replica. `submit` requests, then call `step` until `idle`."""

    def __init__(self, costs: StepCosts, host: Host, spec: EngineSpec, kv_capacity_tokens: int,
                 record_emitters: bool = False) -> None:
        if spec.max_num_batched_tokens < spec.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        self.costs, self.host, self.spec = costs, host, spec
        # Called once per step: bound once here.
        self._compute_s, self._traffic_s, self._on_step = costs.compute_s, costs.traffic_s, host.on_step
        self.max_batched, self.max_seqs = spec.max_num_batched_tokens, spec.max_num_seqs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.block = spec.block_size
        self.interval = host.stream_interval
        self.free_blocks = kv_capacity_tokens // spec.block_size
        self.record_emitters = record_emitters
        self.now = 0

        # Per request (index = submission order). Set at submission, as compact int64 columns (a run
        # can hold millions), except the one updated as the request runs.
        self.prompt = array("q")
        self.cached = array("q")        # prompt tokens whose KV arrived with the request (0 after preemption)
        self.out = array("q")
        self.arrival = array("q")
        self.upload = array("q")        # time spent on the way in, counted as delivery
        self.generated: list[int] = []  # tokens sampled and sent so far

        self.arrivals: list[int] = []  # heap of arrival at the server << _ID_BITS | request
        self.waiting: deque[int] = deque()
        self.prefill: _Prefill | None = None
        # In admission order, request -> (first step it decodes in, its context then, its last step).
        self.decoding: dict[int, tuple[int, int, int]] = {}
        self.context_sum = 0                 # summed context of the decoding sequences
        self.block_due = [0] * self.block    # decoding sequences that need a new block at step % block
        # With several tokens per SSE event: decoding sequences whose token closes an event at step % interval.
        self.event_due = [0] * self.interval
        # Decoding requests by the step of their last token; a preempted request's entry goes stale.
        self.finishing_at: dict[int, list[int]] = {}

        # One row of STEP_FIELDS per step. Where tokens came from: (request, first step, tokens) spans,
        # a token in each of consecutive steps. Steps a request took part in without sampling (a
        # prompt chunk that does not finish its prompt): (request, step).
        self.step_rows, self.span_rows, self.silent_rows = _Rows(len(STEP_FIELDS)), _Rows(3), _Rows(2)
        self._step_buffer, self._span_buffer = self.step_rows.buffer, self.span_rows.buffer
        self._silent_buffer = self.silent_rows.buffer
        self.num_steps = 0
        self.last_leave_ns = 0
        self.emitters: list[int] = []  # with record_emitters: the requests that got a token last step
        self.preemptions = 0

    # -- requests in -----------------------------------------------------------------------------

    def submit(self, input_tokens: int, output_tokens: int, arrival_ns: int, delivery_ns: int = 0,
               cached_tokens: int = 0) -> int:
        """Queue a request that reaches the server at `arrival_ns`; `delivery_ns` is time it already
        spent on the way (its upload); the KV of its first `cached_tokens` prompt tokens comes with it
        (a decode engine receiving a prefilled request). Returns its index."""
        if not 0 <= cached_tokens < input_tokens:
            raise ValueError("cached_tokens must leave at least one prompt token to compute")
        i = len(self.prompt)
        if i > _ID_MASK:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, value in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                              (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.append(int(value))
        self.generated.append(0)
        heapq.heappush(self.arrivals, int(arrival_ns) << _ID_BITS | i)
        return i

    def submit_all(self, input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_ns: np.ndarray,
                   delivery_ns: np.ndarray, cached_tokens: np.ndarray) -> None:
        """`submit` for many requests at once (int64 arrays, one row per request), in one pass."""
        if not ((0 <= cached_tokens) & (cached_tokens < input_tokens)).all():
            raise ValueError("cached_tokens must leave at least one prompt token to compute")
        first, n = len(self.prompt), len(input_tokens)
        if first + n > _ID_MASK + 1:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, values in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                               (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.frombytes(np.ascontiguousarray(values, np.int64).tobytes())
        self.generated.extend([0] * n)
        self.arrivals.extend([t << _ID_BITS | i for i, t in enumerate(arrival_ns.tolist(), first)])
        heapq.heapify(self.arrivals)

    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.waiting or self.decoding or self.prefill)

    def abort(self, i: int) -> bool:
        """End request i now, between steps (a stop string, a client gone), as vLLM's abort does: it
        takes no part in the next step, which can give its batch slot and KV blocks to others. It
        keeps the tokens already made and from then on counts as finished with them (`out[i]`
        becomes `generated[i]`). Returns False if it had already finished (or been aborted).

        O(1) Python work, plus a C-level scan of one list: those due to finish in the same step as a
        decoding request, or the queue (or arrivals) holding a waiting (or arriving) one."""
        prefill = self.prefill
        if i in self.decoding:
            first, _, last_step = self.decoding[i]
            due = self.finishing_at[last_step]
            due.remove(i)
            if not due:
                del self.finishing_at[last_step]
            context = self._stop_decoding(i, self.num_steps - first)
            self.free_blocks += -(-context // self.block)
        elif prefill is not None and prefill.request == i:
            self.free_blocks += prefill.blocks
            self.prefill = None
        elif self.generated[i] >= self.out[i]:
            return False
        else:
            key = self.arrival[i] << _ID_BITS | i
            if key in self.arrivals:
                self.arrivals.remove(key)
                heapq.heapify(self.arrivals)
            else:
                self.waiting.remove(i)
        self.out[i] = self.generated[i]
        return True

    # -- one step ----------------------------------------------------------------------------------

    def step(self) -> list[int]:
        """Form and run the next step; returns the requests that finished in it.

        An idle engine first jumps to the next arrival. Afterwards `now` is the step's end and
        `last_leave_ns` when its tokens leave the server.
        """
        arrivals, waiting = self.arrivals, self.waiting
        if not (waiting or self.decoding or self.prefill):
            self.now = max(self.now, arrivals[0] >> _ID_BITS)
        arrived = (self.now + 1) << _ID_BITS
        while arrivals and arrivals[0] < arrived:
            waiting.append(heapq.heappop(arrivals) & _ID_MASK)

        s = self.num_steps
        block = self.block
        budget = self.max_batched - len(self.decoding)

        # Running sequences: every decoding one takes a token; the prefill takes what is left.
        new_blocks = self.block_due[s % block]
        prefill, prefill_num, prefill_blocks = self.prefill, 0, 0
        if prefill is not None:
            prefill_num = min(prefill.target - prefill.computed, budget)
            prefill_blocks = -(-(prefill.computed + prefill_num) // block) - prefill.blocks
        preempting = new_blocks + prefill_blocks > self.free_blocks
        if preempting:
            new_blocks, prefill_blocks, prefill_num = self._preempt(s, new_blocks + prefill_blocks)
            prefill = self.prefill
        self.free_blocks -= new_blocks + prefill_blocks
        budget -= prefill_num

        # Waiting sequences, first come first served, while the step has room; none in a step that
        # had to preempt (as vLLM does).
        admitted: list[tuple[int, int, int]] = []  # (request, tokens this step, its prefill target)
        room = self.max_seqs - len(self.decoding) - (prefill is not None)
        while waiting and not preempting and len(admitted) < room and budget > 0:
            i = waiting[0]
            cached = self.cached[i]
            target = self.prompt[i] + self.generated[i]  # a preempted request recomputes the tokens it sent
            need = target - cached
            if need > budget and not self.spec.chunked_prefill:
                break
            num = min(need, budget)
            blocks = -(-(cached + num) // block)
            if blocks > self.free_blocks:
                break
            waiting.popleft()
            self.free_blocks -= blocks
            budget -= num
            admitted.append((i, num, target))

        # The batch: its shape, then its cost. Sequences still short of their prompt take part
        # silently; the others sample a token.
        decode = len(self.decoding)
        num_tokens = decode + prefill_num
        attn_pairs = kv_read = self.context_sum + decode
        completing: list[tuple[int, int]] = []  # (request, context after this step)
        if prefill is not None:
            p, q = prefill.computed, prefill_num
            num_tokens, attn_pairs, kv_read = num_tokens, attn_pairs + q * p + q * (q + 1) // 2, kv_read + p + q
            prefill.computed += q
            prefill.blocks += prefill_blocks
            if prefill.computed == prefill.target:
                completing.append((prefill.request, prefill.computed))
                self.prefill = None
            else:
                self._silent_buffer.extend((prefill.request, s))
        for i, q, target in admitted:
            p = self.cached[i]
            num_tokens += q
            attn_pairs += q * p + q * (q + 1) // 2
            kv_read += p + q
            if p + q == target:
                completing.append((i, p + q))
            else:
                self.prefill = _Prefill(i, p + q, -(-(p + q) // block), target)
                self._silent_buffer.extend((i, s))
        due = self.finishing_at.pop(s, None)
        finishing = self._still_due(s, due) if due else []
        emitted = decode + len(completing)
        events = emitted if self.interval == 1 else self._events(s, finishing, completing)

        compute_ns = round(self._compute_s(num_tokens, emitted, attn_pairs, kv_read) * 1e9)
        traffic_ns = round(self._traffic_s(num_tokens, emitted == num_tokens) * 1e9)
        gpu_end = self.now + compute_ns + traffic_ns
        blocking_ns, leave_ns = self._on_step(gpu_end, emitted, events)
        self._step_buffer.extend((self.now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens,
                                  decode + (prefill is not None) + len(admitted), attn_pairs, kv_read, emitted))
        self.num_steps = s + 1
        self.last_leave_ns = leave_ns
        if self.record_emitters:
            self.emitters = list(self.decoding) + [i for i, _ in completing]
        self.now = gpu_end + blocking_ns

        # Apply the step.
        self.context_sum += decode
        finished = [self._finish_decoding(i, s) for i in finishing]
        for i, context in completing:
            self._span_buffer.extend((i, s, 1))
            self.generated[i] += 1
            if self.generated[i] == self.out[i]:
                self.free_blocks += -(-context // block)
                finished.append(i)
            else:
                self._start_decoding(i, s + 1, context)
        if len(self._step_buffer) >= _Rows.FLUSH_VALUES:
            for rows in (self.step_rows, self.span_rows, self.silent_rows):
                rows.flush()
        return finished

    # -- bookkeeping -------------------------------------------------------------------------------

    def _start_decoding(self, i: int, first_step: int, context: int) -> None:
        last_step = first_step + self.out[i] - self.generated[i] - 1
        self.decoding[i] = (first_step, context, last_step)
        self.context_sum += context
        self.block_due[(first_step - context) % self.block] += 1
        if self.interval > 1:
            self.event_due[(first_step - self.generated[i]) % self.interval] += 1
        due = self.finishing_at.get(last_step)
        if due is None:
            self.finishing_at[last_step] = [i]
        else:
            due.append(i)

    def _stop_decoding(self, i: int, steps_taken: int) -> int:
        """Take request i out of the decoding aggregates after `steps_taken` decode steps; its context."""
        first, context0, _ = self.decoding.pop(i)
        context = context0 + steps_taken
        self.context_sum -= context
        self.block_due[(first - context0) % self.block] -= 1
        if self.interval > 1:
            self.event_due[(first - self.generated[i]) % self.interval] -= 1
        if steps_taken:
            self._span_buffer.extend((i, first, steps_taken))
        self.generated[i] += steps_taken
        return context

    def _still_due(self, s: int, due: list[int]) -> list[int]:
        """Those of `due` (entered to finish in step s) that still do: a request preempted since is not
        decoding, or decoding towards a later last step."""
        decoding = self.decoding
        return [i for i in due if (state := decoding.get(i)) is not None and state[2] == s]

    def _finish_decoding(self, i: int, s: int) -> int:
        context = self._stop_decoding(i, s - self.decoding[i][0] + 1)
        self.free_blocks += -(-context // self.block)
        return i

    def _events(self, s: int, finishing: list[int], completing: list[tuple[int, int]]) -> int:
        """SSE events the step's tokens close (only needed when events group several tokens)."""
        interval = self.interval
        events = self.event_due[s % interval]
        for i in finishing:  # a last token always closes its event; count those off the grid
            if (self.out[i] - 1) % interval:
                events += 1
        for i, _ in completing:
            events += closes_event(self.generated[i], self.out[i], interval)
        return events

    def _preempt(self, s: int, demand: int) -> tuple[int, int, int]:
        """Preempt from the tail of the running order (the prefill, then the newest decoding) until
        the step's new blocks fit. Returns the step's (decode blocks, prefill blocks, prefill tokens)."""
        victims: list[int] = []
        prefill = self.prefill
        new_blocks = self.block_due[s % self.block]
        budget = self.max_batched - len(self.decoding)
        if prefill is not None:
            prefill_num = min(prefill.target - prefill.computed, budget)
            prefill_blocks = -(-(prefill.computed + prefill_num) // self.block) - prefill.blocks
        if prefill is not None and demand > self.free_blocks:
            demand -= prefill_blocks
            self.free_blocks += prefill.blocks
            victims.append(prefill.request)
            self.prefill = prefill = None
        while demand > self.free_blocks and self.decoding:
            i = next(reversed(self.decoding))
            first, context0, _ = self.decoding[i]
            crossing = (s - first + context0) % self.block == 0
            context = self._stop_decoding(i, s - first)
            self.free_blocks += -(-context // self.block)
            demand -= crossing
            new_blocks -= crossing
            victims.append(i)
        self.preemptions += len(victims)
        for i in victims:  # a preempted sequence recomputes everything, its prefix included
            self.cached[i] = 0
        self.waiting.extendleft(victims)
        if prefill is None:
            return new_blocks, 0, 0
        return new_blocks, prefill_blocks, prefill_num

    # -- results -----------------------------------------------------------------------------------

    def steps(self) -> dict[str, np.ndarray]:
        """Per-step columns as arrays, keyed by STEP_FIELDS."""
        rows = self.step_rows.array()
        return {name: rows[:, k].copy() for k, name in enumerate(STEP_FIELDS)}

    def spans(self) -> np.ndarray:
        """(request, first step, tokens) rows, sorted by request then step."""
        spans = self.span_rows.array()
        return spans[np.lexsort((spans[:, 1], spans[:, 0]))]

    def accounts(self, steps: dict[str, np.ndarray], spans: np.ndarray) -> dict[str, np.ndarray]:
        """Per request (from `steps()` and `spans()`): the summed compute and traffic time of the steps
        it took part in, its delivery time (its upload, then the host time that blocked those steps),
        and the end of the step that made its last token (0 for a request with none yet)."""
        n = len(self.prompt)
        requests, first, count = spans[:, 0], spans[:, 1], spans[:, 2]
        silent = self.silent_rows.array()
        totals = {}
        for name in ("compute_ns", "traffic_ns", "blocking_ns"):
            per_step = steps[name]
            cum = np.concatenate([[0], np.cumsum(per_step)])
            total = np.zeros(n, np.int64)
            np.add.at(total, requests, cum[first + count] - cum[first])
            np.add.at(total, silent[:, 0], per_step[silent[:, 1]])
            totals[name] = total
        step_end = steps["start_ns"] + steps["compute_ns"] + steps["traffic_ns"] + steps["blocking_ns"]
        last = np.searchsorted(requests, np.arange(n), side="right") - 1  # each request's last span
        has_tokens = last >= 0
        has_tokens[has_tokens] = requests[last[has_tokens]] == np.flatnonzero(has_tokens)
        last_step_end = np.zeros(n, np.int64)
        rows = last[has_tokens]
        last_step_end[has_tokens] = step_end[first[rows] + count[rows] - 1]
        return {
            "compute_ns": totals["compute_ns"],
            "traffic_ns": totals["traffic_ns"],
            "delivery_ns": np.frombuffer(self.upload, np.int64) + totals["blocking_ns"],
            "last_step_end_ns": last_step_end,
        }
