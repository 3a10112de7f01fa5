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
its context, its KV blocks and its token index at any later step follow from that, and the per-step
costs it shares are read from running sums when it leaves.
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
    def traffic_s(self, num_tokens: int) -> float: ...


class Host(Protocol):
    """What the engine needs from the delivery path (implemented by delivery.LastMile)."""

    stream_interval: int  # tokens per SSE event: the first token alone, then groups, the last flushed

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int]:
        """(blocking_ns, leave_ns) of a step that sampled `emitted` tokens closing `events` events."""
        ...


STEP_FIELDS = ("start_ns", "compute_ns", "traffic_ns", "blocking_ns", "leave_ns", "tokens", "seqs",
               "attn_pairs", "kv_read_tokens", "logits")


def closes_event(token_index: int, output_tokens: int, interval: int) -> bool:
    """Whether token `token_index` of a sequence is the last of its SSE event (see delivery.lastmile)."""
    return token_index % interval == 0 or token_index == output_tokens - 1


@dataclass
class _Prefill:
    """The one sequence part-way through its prompt (or its recompute after preemption)."""

    request: int
    computed: int
    blocks: int


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

        # Per request (index = submission order), as compact int64 columns: a run can hold millions.
        self.prompt = array("q")
        self.cached = array("q")        # prompt tokens whose KV arrived with the request (0 after preemption)
        self.out = array("q")
        self.arrival = array("q")
        self.generated = array("q")     # tokens sampled and sent so far
        self.acc_compute = array("q")
        self.acc_traffic = array("q")
        self.acc_delivery = array("q")
        self.last_end = array("q")      # end of the step that produced the last token
        self.entry = array("q")         # while decoding: the first step it decodes in
        self.context0 = array("q")      # while decoding: its context (KV tokens) at that step
        self.epoch = array("q")         # bumped on preemption, to skip stale finish-heap entries
        # Where tokens came from: request span_request[k] got span_count[k] tokens in consecutive
        # steps from span_start[k].
        self.span_request, self.span_start, self.span_count = array("q"), array("q"), array("q")

        self.arrivals: list[tuple[int, int]] = []  # heap of (arrival at the server, request)
        self.waiting: deque[int] = deque()
        self.prefill: _Prefill | None = None
        self.decoding: dict[int, None] = {}  # in admission order
        self.context_sum = 0                 # summed context of the decoding sequences
        self.block_due = [0] * self.block    # decoding sequences that need a new block at step % block
        self.event_due = [0] * self.interval  # decoding sequences whose token closes an event at step % interval
        self.finishes: list[tuple[int, int, int]] = []  # heap of (last step, request, epoch)

        # Per step, one row of STEP_FIELDS; and running sums of (compute, traffic, blocking) time:
        # steps [a, b) cost cum_costs[3b + k] - cum_costs[3a + k].
        self.step_rows = array("q")
        self.cum_costs = array("q", [0, 0, 0])
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
        for column, value in ((self.prompt, input_tokens), (self.cached, cached_tokens),
                              (self.out, output_tokens), (self.arrival, arrival_ns),
                              (self.generated, 0), (self.acc_compute, 0), (self.acc_traffic, 0),
                              (self.acc_delivery, delivery_ns), (self.last_end, 0), (self.entry, 0),
                              (self.context0, 0), (self.epoch, 0)):
            column.append(int(value))
        heapq.heappush(self.arrivals, (arrival_ns, i))
        return i

    def submit_all(self, input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_ns: np.ndarray,
                   delivery_ns: np.ndarray, cached_tokens: np.ndarray) -> None:
        """`submit` for many requests at once (int64 arrays, one row per request), in one pass."""
        if not ((0 <= cached_tokens) & (cached_tokens < input_tokens)).all():
            raise ValueError("cached_tokens must leave at least one prompt token to compute")
        first, n = len(self.prompt), len(input_tokens)
        zeros = np.zeros(n, np.int64).tobytes()
        for column, values in ((self.prompt, input_tokens), (self.cached, cached_tokens),
                               (self.out, output_tokens), (self.arrival, arrival_ns),
                               (self.generated, None), (self.acc_compute, None), (self.acc_traffic, None),
                               (self.acc_delivery, delivery_ns), (self.last_end, None), (self.entry, None),
                               (self.context0, None), (self.epoch, None)):
            column.frombytes(zeros if values is None else np.ascontiguousarray(values, np.int64).tobytes())
        self.arrivals.extend(zip(arrival_ns.tolist(), range(first, first + n)))
        heapq.heapify(self.arrivals)

    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.waiting or self.decoding or self.prefill)

    # -- one step ----------------------------------------------------------------------------------

    def step(self) -> list[int]:
        """Form and run the next step; returns the requests that finished in it.

        An idle engine first jumps to the next arrival. Afterwards `now` is the step's end and
        `last_leave_ns` when its tokens leave the server.
        """
        arrivals, waiting = self.arrivals, self.waiting
        if not (waiting or self.decoding or self.prefill):
            self.now = max(self.now, arrivals[0][0])
        while arrivals and arrivals[0][0] <= self.now:
            waiting.append(heapq.heappop(arrivals)[1])

        s = self.num_steps
        block = self.block
        budget = self.max_batched - len(self.decoding)

        # Running sequences: every decoding one takes a token; the prefill takes what is left.
        new_blocks = self.block_due[s % block]
        prefill, prefill_num, prefill_blocks = self.prefill, 0, 0
        if prefill is not None:
            prefill_num = min(self._need(prefill.request, prefill.computed), budget)
            prefill_blocks = -(-(prefill.computed + prefill_num) // block) - prefill.blocks
        preempting = new_blocks + prefill_blocks > self.free_blocks
        if preempting:
            new_blocks, prefill_blocks, prefill_num = self._preempt(s, new_blocks + prefill_blocks)
            prefill = self.prefill
        self.free_blocks -= new_blocks + prefill_blocks
        budget -= prefill_num

        # Waiting sequences, first come first served, while the step has room; none in a step that
        # had to preempt (as vLLM does).
        admitted: list[tuple[int, int]] = []
        room = self.max_seqs - len(self.decoding) - (prefill is not None)
        while waiting and not preempting and len(admitted) < room and budget > 0:
            i = waiting[0]
            cached = self.cached[i]
            need = self._need(i, cached)
            if need > budget and not self.spec.chunked_prefill:
                break
            num = min(need, budget)
            blocks = -(-(cached + num) // block)
            if blocks > self.free_blocks:
                break
            waiting.popleft()
            self.free_blocks -= blocks
            budget -= num
            admitted.append((i, num))

        # The batch: its shape, then its cost.
        decode = len(self.decoding)
        num_tokens = decode + prefill_num
        attn_pairs = kv_read = self.context_sum + decode
        completing: list[tuple[int, int]] = []  # (request, context after this step)
        if prefill is not None:
            p, q = prefill.computed, prefill_num
            num_tokens, attn_pairs, kv_read = num_tokens, attn_pairs + q * p + q * (q + 1) // 2, kv_read + p + q
            prefill.computed += q
            prefill.blocks += prefill_blocks
            if prefill.computed == self._need(prefill.request, 0):
                completing.append((prefill.request, prefill.computed))
                self.prefill = None
        for i, q in admitted:
            p = self.cached[i]
            num_tokens += q
            attn_pairs += q * p + q * (q + 1) // 2
            kv_read += p + q
            if p + q == self._need(i, 0):
                completing.append((i, p + q))
            else:
                self.prefill = _Prefill(i, p + q, -(-(p + q) // block))
        finishing = self._due_to_finish(s) if self.finishes and self.finishes[0][0] <= s else []
        emitted = decode + len(completing)
        events = emitted if self.interval == 1 else self._events(s, finishing, completing)

        compute_ns = round(self._compute_s(num_tokens, emitted, attn_pairs, kv_read) * 1e9)
        traffic_ns = round(self._traffic_s(num_tokens) * 1e9)
        gpu_end = self.now + compute_ns + traffic_ns
        blocking_ns, leave_ns = self._on_step(gpu_end, emitted, events)
        end = gpu_end + blocking_ns
        self.step_rows.extend((self.now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens,
                               decode + (prefill is not None) + len(admitted), attn_pairs, kv_read, emitted))
        self.num_steps = s + 1
        self.last_leave_ns = leave_ns
        cum = self.cum_costs
        cum.extend((cum[-3] + compute_ns, cum[-2] + traffic_ns, cum[-1] + blocking_ns))
        if self.record_emitters:
            self.emitters = list(self.decoding) + [i for i, _ in completing]
        self.now = end

        # Apply the step: the sequences outside the decoding aggregates pay it directly.
        self.context_sum += decode
        if prefill is not None:
            self._charge(prefill.request, compute_ns, traffic_ns, blocking_ns)
        for i, _ in admitted:
            self._charge(i, compute_ns, traffic_ns, blocking_ns)
        finished = [self._finish_decoding(i, s, end) for i in finishing]
        for i, context in completing:
            self._span(i, s, 1)
            self.generated[i] += 1
            if self.generated[i] == self.out[i]:
                self.last_end[i] = end
                self.free_blocks += -(-context // block)
                finished.append(i)
            else:
                self._start_decoding(i, s + 1, context)
        return finished

    # -- bookkeeping -------------------------------------------------------------------------------

    def _need(self, i: int, computed: int) -> int:
        """Tokens request i still has to compute: its prompt and the tokens it has sent, less its cache."""
        return self.prompt[i] + self.generated[i] - computed

    def _span(self, i: int, first_step: int, tokens: int) -> None:
        self.span_request.append(i)
        self.span_start.append(first_step)
        self.span_count.append(tokens)

    def _charge(self, i: int, compute_ns: int, traffic_ns: int, blocking_ns: int) -> None:
        self.acc_compute[i] += compute_ns
        self.acc_traffic[i] += traffic_ns
        self.acc_delivery[i] += blocking_ns

    def _start_decoding(self, i: int, first_step: int, context: int) -> None:
        self.decoding[i] = None
        self.entry[i] = first_step
        self.context0[i] = context
        self.context_sum += context
        self.block_due[(first_step - context) % self.block] += 1
        self.event_due[(first_step - self.generated[i]) % self.interval] += 1
        last_step = first_step + self.out[i] - self.generated[i] - 1
        heapq.heappush(self.finishes, (last_step, i, self.epoch[i]))

    def _stop_decoding(self, i: int, steps_taken: int) -> int:
        """Take request i out of the decoding aggregates after `steps_taken` decode steps; its context."""
        del self.decoding[i]
        first = self.entry[i]
        context = self.context0[i] + steps_taken
        self.context_sum -= context
        self.block_due[(first - self.context0[i]) % self.block] -= 1
        self.event_due[(first - self.generated[i]) % self.interval] -= 1
        cum, a, b = self.cum_costs, 3 * first, 3 * (first + steps_taken)
        self.acc_compute[i] += cum[b] - cum[a]
        self.acc_traffic[i] += cum[b + 1] - cum[a + 1]
        self.acc_delivery[i] += cum[b + 2] - cum[a + 2]
        if steps_taken:
            self._span(i, first, steps_taken)
        self.generated[i] += steps_taken
        return context

    def _due_to_finish(self, s: int) -> list[int]:
        """Decoding requests whose last token comes in step s."""
        due = []
        finishes = self.finishes
        while finishes and finishes[0][0] <= s:  # earlier entries belong to preempted decodes
            step, i, epoch = heapq.heappop(finishes)
            if epoch == self.epoch[i]:
                due.append(i)
        return due

    def _finish_decoding(self, i: int, s: int, end_ns: int) -> int:
        context = self._stop_decoding(i, s - self.entry[i] + 1)
        self.free_blocks += -(-context // self.block)
        self.last_end[i] = end_ns
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
            prefill_num = min(self._need(prefill.request, prefill.computed), budget)
            prefill_blocks = -(-(prefill.computed + prefill_num) // self.block) - prefill.blocks
        if prefill is not None and demand > self.free_blocks:
            demand -= prefill_blocks
            self.free_blocks += prefill.blocks
            victims.append(prefill.request)
            self.prefill = prefill = None
        while demand > self.free_blocks and self.decoding:
            i = next(reversed(self.decoding))
            first = self.entry[i]
            crossing = (s - first + self.context0[i]) % self.block == 0
            context = self._stop_decoding(i, s - first)
            self.epoch[i] += 1
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
        rows = np.frombuffer(self.step_rows, dtype=np.int64).reshape(-1, len(STEP_FIELDS))
        return {name: rows[:, k].copy() for k, name in enumerate(STEP_FIELDS)}

    def spans(self) -> np.ndarray:
        """(request, first step, tokens) rows, sorted by request then step."""
        spans = np.stack([np.frombuffer(c, dtype=np.int64) for c in (self.span_request, self.span_start, self.span_count)],
                         axis=1) if self.span_request else np.empty((0, 3), np.int64)
        return spans[np.lexsort((spans[:, 1], spans[:, 0]))]
