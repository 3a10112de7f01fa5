"""One engine replica doing continuous batching, one step at a time, under a scheduler profile.

A step runs in phases, each a method: take the arrivals; the profile composes the batch (the running
sequences' demands, preempting when KV blocks run out, then admission of waiting sequences); the
batch's shape and cost; applying it. The profiles (engine/profiles.py describes each, with its sources):
- vllm-v1: every step, each decoding sequence takes a token, the prompt in progress the rest of the
  token budget, then waiting sequences while the step has room (sequences, tokens, KV blocks), a long
  prompt chunked to the budget. When a growing sequence finds no free KV block, the most recently
  admitted running sequences are preempted and will be recomputed: they lose their cache and go back
  to the front of the queue, keeping the tokens already sent.
- trtllm: the same batch shape, but a partial prompt chunk is rounded down to whole blocks, and with
  "reserve" admission a request is admitted only if its whole KV cache fits in the unreserved blocks
  (so nothing is ever preempted).
- prefill-first: a step either prefills (waiting prompts, and the prompt in progress) while decoding
  sequences pause, or decodes every running sequence; with multi-step scheduling a decode step is a
  window of k steps with a fixed batch.

A step lasts its compute time plus its non-overlapped traffic time, then whatever the host blocks it
for (copying the sampled ids, and detokenizing when that runs inline). Time is integer nanoseconds,
so each request's time splits exactly into waiting, compute, traffic and delivery.

Why the bookkeeping looks the way it does: a step costs O(1) Python work plus O(1) per request that
joins, finishes or is preempted, never O(batch). That holds because the token budget covers every
decoding sequence (vLLM requires max_num_batched_tokens >= max_num_seqs), so at most one sequence is
part-way through its prompt, and it is the one admitted last. Decoding sequences are then described
by aggregates (their count and summed context) plus, per sequence, the tick it started decoding at:
its context, its KV blocks and its token index at any later tick follow from that.

Ticks count the steps in which decoding sequences advance (the decode clock). Under vllm-v1 and
trtllm they advance in every step, so a tick is a step; under prefill-first they pause in prefill
steps, and the clock stops there. The aggregates (first tick, block_due, event_due, finishing_at)
are keyed by tick, so a paused decoder costs nothing per step; the step of each tick is recorded
(`tick_steps`) only when the two differ.

Nor is each request's share of the step costs added up while stepping: the replica records which
ticks each request sampled in (spans of consecutive ticks) and `accounts` sums the step columns over
them afterwards, in numpy. Per-step and per-span rows are buffered as Python ints and moved into
numpy in blocks (`_Rows`): writing one item of an `array("q")` goes through argument parsing, about
a thousand machine instructions, where appending to a list takes a few dozen.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from tokenpath.engine.host_time import host_overlapped
from tokenpath.engine.new_token_ratio import NewTokenRatio, new_request_tokens
from tokenpath.engine.prefix_cache import PrefixCache
from tokenpath.engine.queues import QUEUES, WaitingQueue
from tokenpath.engine.spec import EngineSpec
from tokenpath.prefixes import Prefixes


class StepCosts(Protocol):
    def compute_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float,
                  chunk_context_tokens: float) -> float: ...
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
               "attn_pairs", "kv_read_tokens", "chunk_context_tokens", "logits")


def closes_event(token_index: int, output_tokens: int, interval: int) -> bool:
    """Whether token `token_index` of a sequence is the last of its SSE event (see delivery.lastmile)."""
    return token_index % interval == 0 or token_index == output_tokens - 1


class _Rows:
    """A growing int64 table: rows are appended to `buffer` (a flat list of Python ints) and moved
    into numpy blocks by `flush`, so memory stays at 8 bytes per value however long the run."""

    FLUSH_VALUES = 1 << 16

    def __init__(self, width: int, keep: bool = True) -> None:
        self.width = width
        self.keep = keep  # False: rows are dropped at each flush (a server that never reads them back)
        self.buffer: list[int] = []  # callers extend it in place: its identity never changes
        self.blocks: list[np.ndarray] = []

    def flush(self) -> None:
        if self.buffer:
            if self.keep:
                self.blocks.append(np.fromiter(self.buffer, np.int64, len(self.buffer)).reshape(-1, self.width))
            self.buffer.clear()

    def array(self) -> np.ndarray:
        """Every row so far, as a (rows, width) array."""
        if not self.keep:
            raise RuntimeError("this replica was built with keep_rows=False: its step rows were not kept")
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


_NONE: tuple = ()  # no admissions, no finishers: shared, so a step without them allocates nothing


class Replica:
    """An engine replica. `submit` requests, then call `step` until `idle`."""

    def __init__(self, costs: StepCosts, host: Host, spec: EngineSpec, kv_capacity_tokens: int,
                 record_emitters: bool = False, keep_rows: bool = True) -> None:
        """`record_emitters`: keep each step's emitters for a live caller (serve); `keep_rows`: keep the
        per-step and per-token rows `steps`, `spans` and `accounts` read back (a long-running server
        that never reads them passes False, so its memory does not grow with every step)."""
        if spec.max_num_batched_tokens < spec.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        self.costs, self.host, self.spec = costs, host, spec
        # Called once per step: bound once here.
        self._compute_s, self._traffic_s, self._on_step = costs.compute_s, costs.traffic_s, host.on_step
        self.max_batched, self.max_seqs = spec.max_num_batched_tokens, spec.max_num_seqs
        self.block = spec.block_size
        self.interval = host.stream_interval
        self.cache_blocks = kv_capacity_tokens // spec.block_size  # whole blocks of the KV cache
        self.free_blocks = self.cache_blocks
        self.record_emitters = record_emitters
        self.now = 0

        # The profile (engine/spec.py): how a step's batch is composed, as bound methods and flags.
        self.chunked = spec.chunked_prefill
        self.pauses = spec.prefills_alone  # decoders pause in prefill steps
        self.window = spec.num_scheduler_steps  # steps of a decode window (multi-step scheduling)
        self.reserve = spec.kv_admission == "reserve"
        # SGLang's admission headroom for the running requests' outputs still to come (new_token_ratio.py).
        self.ratio = NewTokenRatio() if spec.profile.new_token_ratio else None
        # A prompt chunk that is not the prompt's rest: any tokens, or whole KV blocks (TensorRT-LLM).
        self.chunk_unit = spec.block_size if spec.profile.chunk_unit == "block" else 1
        self.unreserved_blocks = self.free_blocks  # reserving: blocks no running request has reserved
        # Prefix caching (engine/prefix_cache.py): made when the first request with a prefix comes,
        # so a workload without shared prefixes pays nothing for it.
        self.prefix_caching = spec.prefix_caching
        self.prefix: PrefixCache | None = None
        self._compose = self._compose_prefill_first if self.pauses else self._compose_mixed
        self._host = self._on_step if self.window == 1 else self._host_window
        # An overlapped scheduler forms each batch when the step before starts (host_time.host_overlapped):
        # while the engine is busy, the next step takes only requests that arrived by `formed_ns`, the
        # start of the step that just ran.
        self.lagged = host_overlapped(spec.scheduler, spec.host_overlap)
        self.formed_ns = 0

        # Per request (index = submission order). Set at submission, as compact int64 columns (a run
        # can hold millions), except the one updated as the request runs.
        self.prompt = array("q")
        self.cached = array("q")        # prompt tokens whose KV arrived with the request (0 after preemption)
        self.out = array("q")
        self.arrival = array("q")
        self.upload = array("q")        # time spent on the way in, counted as delivery
        self.generated: list[int] = []  # tokens sampled and sent so far
        self.times_preempted = array("q")  # per request: how often it lost its cache and went back to wait

        self.arrivals: list[int] = []  # heap of arrival at the server << _ID_BITS | request
        self.waiting: WaitingQueue = QUEUES[spec.profile.queue_policy]()
        self.prefill: _Prefill | None = None
        self.tick = 0  # the decode clock: steps in which decoding sequences advanced so far
        # In admission order, request -> (first tick it decodes in, its context then, its last tick, request).
        self.decoding: dict[int, tuple[int, int, int, int]] = {}
        self.context_sum = 0                 # summed context of the decoding sequences
        self.last_tick_sum = 0               # summed last ticks of the decoding sequences (outputs to come)
        self.out_sum = 0                     # summed output lengths of the decoding sequences
        self.preempted_in_step = False
        self.block_due = [0] * self.block    # decoding sequences that need a new block at tick % block
        # With several tokens per SSE event: decoding sequences whose token closes an event at tick % interval.
        self.event_due = [0] * self.interval
        # Decoding states by the tick of their last token; a preempted request's entry goes stale.
        self.finishing_at: dict[int, list[tuple[int, int, int, int]]] = {}
        # Multi-step: steps of the current decode window after this one, the sequences that sampled
        # their last token in it (still computed until it ends), and the tokens and events it made so far.
        self.window_left = 0
        self.zombies: list[int] = []
        self._window_emitted = self._window_events = 0

        # One row of STEP_FIELDS per step. Where tokens came from: (request, first tick, tokens) spans,
        # a token in each of consecutive ticks, and each prompt's first token (request, step, 1): the
        # same table when ticks are steps. Steps a request took part in without sampling (a prompt
        # chunk that does not finish its prompt): (request, step). The step of each tick, when they differ.
        self.step_rows = _Rows(len(STEP_FIELDS), keep_rows)
        self.span_rows, self.silent_rows = _Rows(3, keep_rows), _Rows(2, keep_rows)
        self.first_rows = _Rows(3, keep_rows) if self.pauses else self.span_rows
        self.tick_rows = _Rows(1, keep_rows)
        self._step_buffer, self._span_buffer = self.step_rows.buffer, self.span_rows.buffer
        self._silent_buffer, self._first_buffer = self.silent_rows.buffer, self.first_rows.buffer
        self._tick_buffer = self.tick_rows.buffer
        self._flush_values = _Rows.FLUSH_VALUES
        self.num_steps = 0
        self.last_leave_ns = 0
        self.emitters: list[int] = []  # with record_emitters: the requests that got a token last step
        # With record_emitters: the emitters of each step whose tokens left at `last_leave_ns` with the
        # last step (that step's alone; with multi-step, every step of the window it ended, or none).
        self.released: list[list[int]] = []
        self._window_emitters: list[list[int]] = []
        self.preemptions = 0

    # -- requests in -----------------------------------------------------------------------------

    def submit(self, input_tokens: int, output_tokens: int, arrival_ns: int, delivery_ns: int = 0,
               cached_tokens: int = 0, prefix: tuple[list[int], list[int]] | None = None) -> int:
        """Queue a request that reaches the server at `arrival_ns`; `delivery_ns` is time it already
        spent on the way (its upload); the KV of its first `cached_tokens` prompt tokens comes with it
        (a decode engine receiving a prefilled request); `prefix`: the keys of its shared prompt
        segments and the token each ends at (workload.prefixes). Returns its index."""
        if not 0 <= cached_tokens < input_tokens:
            raise ValueError("cached_tokens must leave at least one prompt token to compute")
        self._check_reservable(input_tokens + output_tokens)
        i = len(self.prompt)
        if i > _ID_MASK:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, value in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                              (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.append(int(value))
        self.generated.append(0)
        if prefix is not None and prefix[0]:
            self._add_prefix(i, *prefix)
        self.times_preempted.append(0)
        heapq.heappush(self.arrivals, int(arrival_ns) << _ID_BITS | i)
        return i

    def _add_prefix(self, i: int, keys: list[int], end_tokens: list[int]) -> None:
        if not self.prefix_caching:
            return
        if self.cached[i]:
            raise ValueError("a request with KV cache of its own cannot also look up prefixes")
        if self.prefix is None:
            self.prefix = PrefixCache(self.block, self.free_blocks)
        self.prefix.add(i, keys, end_tokens)

    def submit_all(self, input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_ns: np.ndarray,
                   delivery_ns: np.ndarray, cached_tokens: np.ndarray, prefixes: Prefixes | None = None,
                   held: np.ndarray | None = None) -> None:
        """`submit` for many requests at once (int64 arrays, one row per request), in one pass. Rows
        where `held` is true do not arrive until `send` names them (a session's later turns)."""
        if not ((0 <= cached_tokens) & (cached_tokens < input_tokens)).all():
            raise ValueError("cached_tokens must leave at least one prompt token to compute")
        if len(input_tokens):
            self._check_reservable(int((input_tokens + output_tokens).max()))
        first, n = len(self.prompt), len(input_tokens)
        if first + n > _ID_MASK + 1:
            raise ValueError(f"a replica takes at most {_ID_MASK + 1} requests")
        for column, values in ((self.prompt, input_tokens), (self.cached, cached_tokens), (self.out, output_tokens),
                               (self.arrival, arrival_ns), (self.upload, delivery_ns)):
            column.frombytes(np.ascontiguousarray(values, np.int64).tobytes())
        self.generated.extend([0] * n)
        if prefixes is not None and self.prefix_caching:
            for k in np.flatnonzero(prefixes.offsets[1:] > prefixes.offsets[:-1]).tolist():
                self._add_prefix(first + k, *prefixes.segments(k))
        self.times_preempted.frombytes(bytes(8 * n))
        if held is None:
            self.arrivals.extend([t << _ID_BITS | i for i, t in enumerate(arrival_ns.tolist(), first)])
        else:
            rows = np.flatnonzero(~held)
            self.arrivals.extend([t << _ID_BITS | i for i, t in zip((rows + first).tolist(), arrival_ns[rows].tolist())])
        heapq.heapify(self.arrivals)

    def send(self, i: int, arrival_ns: int, delivery_ns: int) -> None:
        """Request i, submitted held, reaches the server at `arrival_ns` after `delivery_ns` on the way."""
        self.arrival[i], self.upload[i] = arrival_ns, delivery_ns
        heapq.heappush(self.arrivals, arrival_ns << _ID_BITS | i)

    def _check_reservable(self, tokens: int) -> None:
        """Reserving, a request whose whole KV cache exceeds the cache would wait forever."""
        if self.reserve and -(-tokens // self.block) > self.cache_blocks:
            raise ValueError(f"a request of {tokens} tokens needs more than the {self.cache_blocks} KV blocks "
                             "of the cache")

    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.waiting or self.decoding or self.prefill)

    def abort(self, i: int) -> bool:
        """End request i now, between steps (a stop string, a client gone), as vLLM's abort does: it
        takes no part in the next step, which can give its batch slot and KV blocks to others. It
        keeps the tokens already made and from then on counts as finished with them (`out[i]`
        becomes `generated[i]`). Returns False if it had already finished (or been aborted).

        O(1) Python work, plus a C-level scan of the queue (or arrivals) holding a waiting (or
        arriving) request."""
        prefill = self.prefill
        if self.generated[i] >= self.out[i]:  # finished (under multi-step, perhaps waiting for its window's end)
            return False
        if i in self.decoding:  # its entry in finishing_at goes stale (see _still_due)
            context = self._stop_decoding(i, self.tick - self.decoding[i][0])
            self._release(i, context)
        elif prefill is not None and prefill.request == i:
            self._release(i, 0, prefill.blocks)
            self.prefill = None
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
        """Form and run the next step; returns the requests that finished in it (with multi-step, those
        that finished in the window it ends).

        An idle engine first jumps to the next arrival. Afterwards `now` is the step's end and
        `last_leave_ns` when the tokens that left last left the server.
        """
        self._take_arrivals()
        s, d = self.num_steps, self.tick
        self.preempted_in_step = False
        decode, prefill_num, admitted = self._compose(d)
        if self.ratio is not None and decode and not prefill_num and not admitted and not self.preempted_in_step:
            self.ratio.decoded()
        completing, finishing = self._run_batch(s, d, decode, prefill_num, admitted)
        return self._apply(s, d, decode, completing, finishing)

    def _take_arrivals(self) -> None:
        """Queue the requests that have reached the server by the time the step's batch is formed; an
        idle engine first waits for one and forms its batch at once."""
        arrivals, waiting = self.arrivals, self.waiting
        if waiting or self.decoding or self.prefill:
            formed = self.formed_ns if self.lagged else self.now
        else:
            first_ns = arrivals[0] >> _ID_BITS
            if first_ns > self.now and self.ratio is not None:  # it waits idle: SGLang starts the ratio over
                self.ratio.idle()
            formed = self.now = max(self.now, first_ns)
        arrived = (formed + 1) << _ID_BITS
        while arrivals and arrivals[0] < arrived:
            waiting.append(heapq.heappop(arrivals) & _ID_MASK)

    # The profiles' batches. Each returns (decoding sequences taking part, tokens of the prompt in
    # progress, admitted (request, tokens, target)), having taken the KV blocks they need.

    def _compose_mixed(self, d: int) -> tuple[int, int, Sequence[tuple[int, int, int]]]:
        """vllm-v1 and trtllm (and prefill-first with mixed chunks): the running sequences, then waiting
        ones while the step has room; none in a step that had to preempt (as vLLM does), nor while a
        prompt is still in progress."""
        prefill, new_blocks = self.prefill, self.block_due[d % self.block]
        if prefill is None and new_blocks <= self.free_blocks:  # the common case, without a call
            self.free_blocks -= new_blocks
            decode = len(self.decoding)
            if not self.waiting:
                return decode, 0, _NONE
            return decode, 0, self._admit(self.max_batched - decode, self.max_seqs - decode)
        prefill_num, preempted = self._running_demands(d)
        if preempted or not self.waiting:
            return len(self.decoding), prefill_num, _NONE
        decode = len(self.decoding)
        if prefill_num < prefill.target - prefill.computed:
            return decode, prefill_num, _NONE
        return decode, prefill_num, self._admit(self.max_batched - decode - prefill_num, self.max_seqs - decode - 1)

    def _compose_prefill_first(self, d: int) -> tuple[int, int, Sequence[tuple[int, int, int]]]:
        """prefill-first: a prefill step (the prompt in progress, then waiting prompts) while decoding
        sequences pause, when one can run; otherwise a decode window of every decoding sequence (one
        step, or num_scheduler_steps with a fixed batch)."""
        if self.window_left:
            self.window_left -= 1
            return len(self.decoding), 0, _NONE
        prefill, budget = self.prefill, self.max_batched
        room = self.max_seqs - len(self.decoding) - (prefill is not None)
        if prefill is not None:
            rest = prefill.target - prefill.computed
            num = rest if rest <= budget else budget
            blocks = -(-(prefill.computed + num) // self.block) - prefill.blocks
            if blocks <= self.free_blocks:
                self.free_blocks -= blocks
                prefill.blocks += blocks
                if self.prefix is not None:
                    self.prefix.computed(prefill.request, prefill.computed + num)
                return 0, num, self._admit(budget - num, room) if num == rest and self.waiting else _NONE
        elif self.waiting:
            admitted = self._admit(budget, room)
            if admitted:
                return 0, 0, admitted
        return self._decode_window(d), 0, _NONE

    # The phases the profiles share.

    def _running_demands(self, d: int) -> tuple[int, bool]:
        """The running sequences' tokens and KV blocks when they all take part: a token for every
        decoding sequence, the rest of the budget for the prompt in progress. Preempts when the blocks
        do not fit. Returns (tokens of the prompt in progress, whether it preempted)."""
        new_blocks = self.block_due[d % self.block]
        prefill = self.prefill
        if prefill is None:
            if new_blocks <= self.free_blocks:
                self.free_blocks -= new_blocks
                return 0, False
        else:
            rest, budget = prefill.target - prefill.computed, self.max_batched - len(self.decoding)
            num = rest if rest <= budget else budget - budget % self.chunk_unit
            blocks = -(-(prefill.computed + num) // self.block) - prefill.blocks
            if new_blocks + blocks <= self.free_blocks:
                self.free_blocks -= new_blocks + blocks
                prefill.blocks += blocks
                if self.prefix is not None:
                    self.prefix.computed(prefill.request, prefill.computed + num)
                return num, False
        new_blocks = self._preempt(d, new_blocks, 1)  # (it frees blocks: not inside `free_blocks -= ...`)
        self.free_blocks -= new_blocks
        return 0, True

    def _decode_window(self, d: int) -> int:
        """Start a decode window: take the KV blocks every decoding sequence needs over its steps,
        preempting when they do not fit. Returns the decoding sequences taking part."""
        window, block, due = self.window, self.block, self.block_due
        new_blocks = due[d % block] if window == 1 else sum(due[(d + j) % block] for j in range(window))
        if new_blocks > self.free_blocks:
            new_blocks = self._preempt(d, new_blocks, window)
        self.free_blocks -= new_blocks
        decode = len(self.decoding)
        self.window_left = window - 1 if decode else 0
        return decode

    def _preempt(self, d: int, new_blocks: int, window: int) -> int:
        """Preempt from the tail of the running order (the prompt in progress, then the newest decoding)
        until the blocks the decoding sequences need over the next `window` ticks fit. Preempted
        sequences lose their cache (a prefix that came with the request too) and go back to the front
        of the queue. Returns the blocks the remaining decoding sequences need."""
        victims: list[int] = []
        prefill, block = self.prefill, self.block
        if prefill is not None:
            self._free(prefill.request, prefill.blocks)
            victims.append(prefill.request)
            self.prefill = None
        while new_blocks > self.free_blocks and self.decoding:
            i = next(reversed(self.decoding))
            first, context0, _, _ = self.decoding[i]
            context = context0 + d - first
            new_blocks -= (context + window - 1) // block - (context - 1) // block  # its blocks in the window
            self._stop_decoding(i, d - first)
            self._free(i, -(-context // block))
            victims.append(i)
        self.preemptions += len(victims)
        for i in victims:
            self.cached[i] = 0
            self.times_preempted[i] += 1
        self.waiting.extendleft(victims)
        self.preempted_in_step = True
        if self.ratio is not None:  # (the prompt in progress, if any, was the first victim)
            self.ratio.retracted(self.out_sum - self._outputs_to_come(), self.out_sum, len(self.decoding))
        return new_blocks

    def _admit(self, budget: int, room: int) -> list[tuple[int, int, int]]:
        """Waiting sequences, first come first served, while the step has room: sequences, tokens and
        KV blocks (reserving: the whole KV cache of each, prompt and output). A prompt longer than the
        budget left waits, or with chunked prefill is cut to it (to whole blocks under trtllm) and is
        the last admitted. Returns (request, tokens this step, its prefill target) for each."""
        admitted: list[tuple[int, int, int]] = []
        waiting, block = self.waiting, self.block
        prefix, ratio = self.prefix, self.ratio
        if ratio is not None:
            spare = ratio.spare_tokens(self.free_blocks * block, self._outputs_to_come())
        while waiting and len(admitted) < room and budget > 0:
            i = waiting[0]
            cached = self.cached[i]
            target = self.prompt[i] + self.generated[i]  # a preempted request recomputes the tokens it sent
            touched = 0  # with a prefix hit: cached blocks taken off the free queue, less the hit blocks
            if prefix is not None and i in prefix.segments:
                found, hit_blocks, queued = prefix.lookup(i, target, self.free_blocks)
                cached = hit_blocks * block
                touched = queued - hit_blocks
            need = num = target - cached
            if need > budget:
                if not self.chunked:
                    break
                num = budget - budget % self.chunk_unit
                if not num:
                    break
            blocks = -(-(cached + num) // block)
            if ratio is not None:
                estimate = new_request_tokens(need, self.out[i] - self.generated[i], self.cache_blocks * block)
                if estimate >= spare:
                    break
                spare -= estimate
            if self.reserve:
                reserved = -(-(self.prompt[i] + self.out[i]) // block)
                if reserved > self.unreserved_blocks:
                    break
                self.unreserved_blocks -= reserved
            elif blocks + touched > self.free_blocks:
                break
            waiting.popleft()
            self.free_blocks -= blocks + touched
            if prefix is not None and i in prefix.segments:
                prefix.acquire(i, found, i not in prefix.hit_tokens)
                self.cached[i] = cached
                prefix.computed(i, cached + num)
            admitted.append((i, num, target))
            if num < need:
                break
            budget -= num
        return admitted

    def _outputs_to_come(self) -> int:
        """Tokens the running sequences will still generate: the decoding ones' (from their last ticks, at
        this tick) and the prompt in progress's."""
        left = self.last_tick_sum - len(self.decoding) * (self.tick - 1)
        prefill = self.prefill
        if prefill is not None:
            left += self.out[prefill.request] - self.generated[prefill.request]
        return left

    def _run_batch(self, s: int, d: int, decode: int, prefill_num: int,
                   admitted: Sequence[tuple[int, int, int]]) -> tuple[list[tuple[int, int]], Sequence[int]]:
        """The batch's shape, its cost and its row; moves `now` to the step's end. Sequences still short
        of their prompt take part silently; the others sample a token. Returns the sequences that
        finish their prompt (request, context after the step) and the decoding ones whose token is
        their last."""
        num_tokens = decode + prefill_num
        # Each decoding sequence attends to its cache plus its new token: pairs = positions read.
        attn_pairs = kv_read = self.context_sum + decode if decode else 0
        chunk_context = 0  # positions cached before each prompt chunk
        completing: list[tuple[int, int]] = []
        if prefill_num:
            prefill = self.prefill
            p, q = prefill.computed, prefill_num
            attn_pairs, kv_read, chunk_context = attn_pairs + q * p + q * (q + 1) // 2, kv_read + p + q, p
            prefill.computed = p + q
            if p + q == prefill.target:
                completing.append((prefill.request, p + q))
                self.prefill = None
            else:
                self._silent_buffer.extend((prefill.request, s))
        cached = self.cached
        for i, q, target in admitted:
            p = cached[i]
            num_tokens += q
            attn_pairs += q * p + q * (q + 1) // 2
            kv_read += p + q
            chunk_context += p
            if p + q == target:
                completing.append((i, p + q))
            else:
                self.prefill = _Prefill(i, p + q, -(-(p + q) // self.block), target)
                self._silent_buffer.extend((i, s))
        finishing: Sequence[int] = _NONE
        if decode or not self.pauses:  # the decode clock ticks
            due = self.finishing_at.pop(d, None)
            if due:
                finishing = self._still_due(due)
        logits = decode + len(completing)
        events = logits if self.interval == 1 else self._events(d, decode, finishing, completing)

        compute_ns = round(self._compute_s(num_tokens, logits, attn_pairs, kv_read, chunk_context) * 1e9)
        traffic_ns = round(self._traffic_s(num_tokens, logits == num_tokens) * 1e9)
        gpu_end = self.now + compute_ns + traffic_ns
        blocking_ns, leave_ns = self._host(gpu_end, logits, events)
        self._step_buffer.extend((self.now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens,
                                  decode + (prefill_num > 0) + len(admitted), attn_pairs, kv_read, chunk_context,
                                  logits))
        self.num_steps = s + 1
        if leave_ns >= 0:
            self.last_leave_ns = leave_ns
        if self.record_emitters:
            self._record_emitters(decode, completing)
        self.formed_ns = self.now  # the next step's batch, if formed while this one runs
        self.now = gpu_end + blocking_ns
        return completing, finishing

    def _apply(self, s: int, d: int, decode: int, completing: list[tuple[int, int]],
               finishing: Sequence[int]) -> list[int]:
        """Advance the decoding sequences a token, retire the finished, and start decoding the sequences
        that finished their prompt. Returns the requests that finished."""
        if decode or not self.pauses:
            self.context_sum += decode
            self.tick = d + 1
            if self.pauses:
                self._tick_buffer.append(s)
        if self.window > 1:
            finished = self._retire_in_window(d, finishing)
        elif finishing:
            finished = [self._finish_decoding(i, d) for i in finishing]
        else:
            finished = []
        for i, context in completing:
            self._first_buffer.extend((i, s, 1))
            self.generated[i] += 1
            if self.generated[i] == self.out[i]:
                self._release(i, context)
                finished.append(i)
            else:
                self._start_decoding(i, self.tick, context)
        if len(self._step_buffer) >= self._flush_values:
            for rows in (self.step_rows, self.span_rows, self.silent_rows, self.first_rows, self.tick_rows):
                rows.flush()
        return finished

    # -- bookkeeping -------------------------------------------------------------------------------

    def _start_decoding(self, i: int, first_tick: int, context: int) -> None:
        last_tick = first_tick + self.out[i] - self.generated[i] - 1
        self.decoding[i] = state = (first_tick, context, last_tick, i)
        self.context_sum += context
        self.last_tick_sum += last_tick
        self.out_sum += self.out[i]
        self.block_due[(first_tick - context) % self.block] += 1
        if self.interval > 1:
            self.event_due[(first_tick - self.generated[i]) % self.interval] += 1
        due = self.finishing_at.get(last_tick)
        if due is None:
            self.finishing_at[last_tick] = [state]
        else:
            due.append(state)

    def _leave_aggregates(self, i: int, ticks_taken: int) -> tuple[int, int]:
        """Take request i out of the decoding sequences' sums after `ticks_taken` decode ticks: (the tick
        it started decoding at, its context)."""
        first, context0, last_tick, _ = self.decoding.pop(i)
        context = context0 + ticks_taken
        self.context_sum -= context
        self.last_tick_sum -= last_tick
        self.out_sum -= self.out[i]
        self.block_due[(first - context0) % self.block] -= 1
        return first, context

    def _stop_decoding(self, i: int, ticks_taken: int) -> int:
        """Take request i out of the decoding aggregates after `ticks_taken` decode ticks; its context."""
        first, context = self._leave_aggregates(i, ticks_taken)
        if self.interval > 1:
            self.event_due[(first - self.generated[i]) % self.interval] -= 1
        if ticks_taken:
            self._span_buffer.extend((i, first, ticks_taken))
        self.generated[i] += ticks_taken
        return context

    def _still_due(self, due: list[tuple[int, int, int, int]]) -> list[int]:
        """The requests of `due` (decoding states entered to finish at this tick) that still do: one
        preempted since is not decoding, or decoding again under a new state (which, recomputed at
        once, can be due at the same tick: its new entry is the one that counts)."""
        decoding = self.decoding
        return [state[3] for state in due if decoding.get(state[3]) is state]

    def _finish_decoding(self, i: int, d: int) -> int:
        context = self._stop_decoding(i, d - self.decoding[i][0] + 1)
        if self.prefix is None:
            self.free_blocks += -(-context // self.block)
        else:
            self.prefix.computed(i, context)  # its answer's segments, if named (a session's next turn repeats it)
            self.free_blocks += self.prefix.release(i, -(-context // self.block))
        if self.reserve:
            self.unreserved_blocks += -(-(self.prompt[i] + self.out[i]) // self.block)
        return i

    def _release(self, i: int, context: int, blocks: int | None = None) -> None:
        """A finished request gives back its KV blocks (those of `context` tokens unless given) and,
        reserving, its reservation. Named segments of its answer become cached (prefixes.py)."""
        if self.prefix is not None and context:
            self.prefix.computed(i, context)
        self._free(i, -(-context // self.block) if blocks is None else blocks)
        if self.reserve:
            self.unreserved_blocks += -(-(self.prompt[i] + self.out[i]) // self.block)

    def _free(self, i: int, blocks: int) -> None:
        """Request i gives back its `blocks` KV blocks; with prefix caching its shared ones stay cached
        until evicted (they still count as free: they can be taken)."""
        if self.prefix is None:
            self.free_blocks += blocks
        else:
            self.free_blocks += self.prefix.release(i, blocks)

    def _retire_in_window(self, d: int, finishing: Sequence[int]) -> list[int]:
        """Multi-step: a sequence that sampled its last token stays in the batch, computed but sampling
        nothing more, until the window ends; then every such sequence leaves, in the order of their
        last tokens."""
        if self.window_left:
            for i in finishing:
                first = self.decoding[i][0]
                ticks = d - first + 1
                self._span_buffer.extend((i, first, ticks))
                if self.interval > 1:
                    self.event_due[(first - self.generated[i]) % self.interval] -= 1
                self.generated[i] += ticks
                self.zombies.append(i)
            return []
        finished = []
        for i in self.zombies:  # their spans, events and tokens were counted when they sampled their last
            _, context = self._leave_aggregates(i, d + 1 - self.decoding[i][0])
            self._release(i, context)
            finished.append(i)
        self.zombies.clear()
        finished += [self._finish_decoding(i, d) for i in finishing]
        return finished

    def _events(self, d: int, decode: int, finishing: Sequence[int], completing: list[tuple[int, int]]) -> int:
        """SSE events the step's tokens close (only needed when events group several tokens)."""
        interval = self.interval
        events = self.event_due[d % interval] if decode else 0
        for i in finishing:  # a last token always closes its event; count those off the grid
            if (self.out[i] - 1) % interval:
                events += 1
        for i, _ in completing:
            events += closes_event(self.generated[i], self.out[i], interval)
        return events

    def _host_window(self, gpu_end_ns: int, logits: int, events: int) -> tuple[int, int]:
        """Multi-step: the host takes a window's tokens (not the dropped ones of sequences already
        done) once, when its last step ends; until then steps are not blocked and leave nothing (-1)."""
        emitted = logits - len(self.zombies)
        if self.interval == 1:  # every token its own event (the others are counted without the zombies)
            events = emitted
        if self.window_left:
            self._window_emitted += emitted
            self._window_events += events
            return 0, -1
        emitted, events = emitted + self._window_emitted, events + self._window_events
        self._window_emitted = self._window_events = 0
        return self._on_step(gpu_end_ns, emitted, events)

    def _record_emitters(self, decode: int, completing: list[tuple[int, int]]) -> None:
        zombies = set(self.zombies)
        emitters = [i for i in self.decoding if i not in zombies] if decode else []
        self.emitters = emitters + [i for i, _ in completing]
        self._window_emitters.append(self.emitters)
        self.released = [] if self.window_left else self._window_emitters
        if not self.window_left:
            self._window_emitters = []

    # -- results -----------------------------------------------------------------------------------

    def steps(self) -> dict[str, np.ndarray]:
        """Per-step columns as arrays, keyed by STEP_FIELDS; a step inside a multi-step window leaves
        its tokens when the window's last step does."""
        rows = self.step_rows.array()
        steps = {name: rows[:, k].copy() for k, name in enumerate(STEP_FIELDS)}
        leave = steps["leave_ns"]
        left = np.flatnonzero(leave >= 0)
        if len(left) < len(leave):
            later = np.searchsorted(left, np.arange(len(leave)))
            known = later < len(left)
            leave[known] = leave[left[later[known]]]
        return steps

    def tick_steps(self) -> np.ndarray | None:
        """The step of each tick of `spans`, or None where ticks are steps. Ticks [0, self.tick) are
        the decode clock's; each prompt's first token is at tick self.tick + its step."""
        if not self.pauses:
            return None
        return np.concatenate([self.tick_rows.array()[:, 0], np.arange(self.num_steps, dtype=np.int64)])

    def spans(self) -> np.ndarray:
        """(request, first tick, tokens) rows, a token in each of consecutive ticks (see `tick_steps`),
        sorted by request then step."""
        spans = self.span_rows.array()
        if not self.pauses:
            return spans[np.lexsort((spans[:, 1], spans[:, 0]))]
        firsts = self.first_rows.array() + np.array([0, self.tick, 0])
        spans = np.concatenate([spans, firsts])
        return spans[np.lexsort((self.tick_steps()[spans[:, 1]], spans[:, 0]))]

    def accounts(self, steps: dict[str, np.ndarray], spans: np.ndarray,
                 tick_steps: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per request (from `steps()`, `spans()` and `tick_steps()`): the summed compute and traffic
        time of the steps it took part in, its delivery time (its upload, then the host time that
        blocked those steps), and the end of the step that made its last token (0 for a request with
        none yet)."""
        n = len(self.prompt)
        requests, first, count = spans[:, 0], spans[:, 1], spans[:, 2]
        silent = self.silent_rows.array()
        totals = {}
        for name in ("compute_ns", "traffic_ns", "blocking_ns"):
            per_step = steps[name]
            per_tick = per_step if tick_steps is None else per_step[tick_steps]
            cum = np.concatenate([[0], np.cumsum(per_tick)])
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
        last_tick = first[rows] + count[rows] - 1
        last_step_end[has_tokens] = step_end[last_tick if tick_steps is None else tick_steps[last_tick]]
        # The first step each request took part in: a prompt chunk that sampled nothing, or its first token.
        first_step = np.full(n, len(steps["start_ns"]), np.int64)
        first_row = np.searchsorted(requests, np.arange(n), side="left")
        has_row = first_row < len(requests)
        has_row[has_row] = requests[first_row[has_row]] == np.flatnonzero(has_row)
        ticks = first[first_row[has_row]]
        first_step[has_row] = ticks if tick_steps is None else tick_steps[ticks]
        np.minimum.at(first_step, silent[:, 0], silent[:, 1])
        starts = np.append(steps["start_ns"], -1)  # -1: in no step (a request aborted before it ran)
        return {
            "first_step_start_ns": starts[first_step],
            "times_preempted": np.frombuffer(self.times_preempted, np.int64).copy(),
            "compute_ns": totals["compute_ns"],
            "traffic_ns": totals["traffic_ns"],
            "delivery_ns": np.frombuffer(self.upload, np.int64) + totals["blocking_ns"],
            "last_step_end_ns": last_step_end,
        }
