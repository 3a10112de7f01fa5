"""One engine replica doing continuous batching, one step at a time, under a scheduler profile
(engine/profiles.py describes each, with its sources).

A step runs in phases, each a method: take the arrivals; the profile composes the batch (the running
sequences' demands, preempting when KV blocks run out, then admission of waiting sequences); the
batch's shape and cost; applying it. A preempted sequence loses its cache and goes back to the queue
(its front, or under SGLang its back: Profile.preempted_requeue), to be recomputed, keeping the tokens
already sent.

A step lasts its compute time plus its non-overlapped traffic time, then whatever the host blocks it
for (copying the sampled ids, and detokenizing when the engine's own process does it). An overlapped
host (SGLang's, TensorRT-LLM's) forms a busy engine's batch when the step before starts and launches
it during that step, so an eager step starts with part of its launches done (`ahead_s`). Where the
server's front end takes time, a request reaches the engine when the front end has passed it on:
the replica hands the front end requests (by arrival) and steps' tokens (by step end) in time order,
so the two share its processes first come first served. Time is integer nanoseconds, so each
request's time splits exactly into waiting, compute, traffic and delivery.

A step costs O(1) Python work plus O(1) per request that joins, finishes, is preempted or waits for the
token budget (`_share_budget`), never O(batch) (but where SGLang retracts: it scans the decoding sequences
for each one, `_fewest_outputs`):
decoding sequences are kept as aggregates keyed by the decode clock, the ticks in which they advance
(engine/running.py says how), and each request's share of the step costs is summed afterwards, in
numpy, from rows the replica records (engine/trace_rows.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from tokenpath.engine.held_drafts import HeldDrafts
from tokenpath.engine.host_time import host_overlapped
from tokenpath.engine.multistep import WindowHost
from tokenpath.engine.new_token_ratio import (
    ATTENTION_DP_CONSERVATIVENESS,
    CLIP_MAX_NEW_TOKENS_ESTIMATION,
    NewTokenRatio,
    new_request_tokens,
)
from tokenpath.engine.pipeline import Pipeline
from tokenpath.engine.prefix_cache import PrefixCache
from tokenpath.engine.protocols import Host, StepCosts
from tokenpath.engine.queues import QUEUES, RankQueues, WaitingQueue
from tokenpath.engine.requests import _ID_BITS, _ID_MASK, Requests
from tokenpath.engine.running import Decoding, Prefill
from tokenpath.engine.spec import EngineSpec
from tokenpath.engine.trace_rows import STEP_FIELDS, TraceRows
from tokenpath.prefixes import Prefixes

_NONE: tuple = ()  # no admissions, no finishers: shared, so a step without them allocates nothing
# A run of decode steps taken at once (Replica.decode_run): at least this many steps (below it the arrays cost
# more than the steps they stand for), at most that many (their arrays' memory).
MIN_DECODE_RUN = 8
MAX_DECODE_RUN = 4096


class Replica:
    """An engine replica. `submit` requests, then call `step` until `idle`."""

    def __init__(self, costs: StepCosts, host: Host, spec: EngineSpec, kv_capacity_tokens: int,
                 record_emitters: bool = False, keep_rows: bool = True) -> None:
        """`record_emitters`: keep each step's emitters for a live caller (serve); `keep_rows`: keep the
        rows a trace is assembled from (`rows`: a long-running server that never reads them passes
        False, so its memory does not grow with every step)."""
        width = 1 if costs.speculation is None else costs.speculation.width
        running = spec.max_num_seqs
        # What a step does with the decodes whose tokens pass the budget (Profile.decodes_past_budget): run them,
        # or leave them waiting (`budget_binds`), the drafts of the first trimmed to the rest (`trims`).
        past_budget = spec.profile.decodes_past_budget
        self.budget_binds, self.trims = past_budget != "run", past_budget == "trim"
        if spec.max_num_batched_tokens < (width if self.budget_binds and not self.trims else running):
            raise ValueError("max_num_batched_tokens must cover every running sequence's decode")
        self.costs, self.host, self.spec = costs, host, spec
        # Called once per step: bound once here.
        self._compute_s, self._traffic_s, self._on_step = costs.compute_s, costs.traffic_s, host.on_step
        self.front = host.queues_requests  # requests pass through the front end (`_through_front`)
        self.max_batched, self.max_seqs = spec.max_num_batched_tokens, running
        self.block = spec.block_size
        self.interval = host.stream_interval
        self.cache_blocks = kv_capacity_tokens // spec.block_size  # whole blocks of the KV cache
        self.free_blocks = self.cache_blocks
        self.record_emitters = record_emitters
        self.now = 0
        self.side_ns = 0  # another model's kernels, run in the next step (engine/side_work.py)
        # One of a replica's pipeline batches in flight: the stages its steps share with the others
        # (engine/pipeline.py; set by the cluster that runs them, None: a replica's steps run alone).
        self.pipeline: Pipeline | None = None

        # The profile (engine/spec.py): how a step's batch is composed, as bound methods and flags.
        self.chunked = spec.chunked_prefill
        self.long_prompt_alone = not spec.chunked_prefill and spec.profile.long_prompt_alone
        self.window = spec.num_scheduler_steps  # steps of a decode window (multi-step scheduling)
        self.reserve = spec.kv_admission == "reserve"
        self.whole_prompt = spec.whole_prompt_admission  # (a waiting prompt's whole KV must be free to admit it)
        # Attention data-parallel: a replica's requests go to its ranks as the profile routes them
        # (Profile.attention_dp_routing, engine/queues.py), each rank admits from its own queue up to its
        # own max_num_seqs (`rank_seqs`), and a step lasts as long as the rank with the most prompt tokens
        # (compute/roofline.py, busiest_chip_share).
        self.ranks = costs.attention_ranks
        # ... and each rank's prompt tokens a step. Where its scheduler takes a share of the replica's
        # chunked budget (Profile.attention_dp_splits_budget: SGLang), that share; else each rank's scheduler
        # has the engine's limits of its own (vLLM's data-parallel engine cores, TensorRT-LLM's ranks:
        # max_num_seqs and max_num_batched_tokens per rank), so the replica's are the ranks' together.
        self.rank_seqs, self.rank_budget = self.max_seqs, None
        if self.ranks > 1:
            self.rank_seqs, self.rank_budget = spec.rank_limits(self.ranks)
            if not spec.profile.attention_dp_splits_budget:
                self.max_batched, self.max_seqs = self.ranks * self.max_batched, self.ranks * self.max_seqs
        # Decoders pause in prefill steps (prefill-first). Under attention data-parallel each rank runs a
        # scheduler of its own (SGLang: a scheduler process per DP rank, their forwards kept in step for the
        # MLP and MoE layers by prepare_mlp_sync_batch_raw, managers/scheduler_components/dp_attn.py, each
        # rank's local batch a prefill or a decode), so a rank with a prompt to run pauses its own decodes
        # while the other ranks decode in the same forward: across the replica, prompts and decodes share
        # the step, as in a mixed step, and a rank's prompt budget is its own (its paused decodes take none
        # of it). The prompt's own rank's decodes take no part in that step (`_pause_prompt_ranks`).
        self.rank_pauses = spec.prefills_alone and self.ranks > 1
        self.paused_context = self.paused_events = 0  # of the decodes a step's prompts pause (_pause_prompt_ranks)
        self.pauses = spec.prefills_alone and not self.rank_pauses
        # SGLang's admission headroom for the running requests' outputs still to come (new_token_ratio.py).
        self.ratio = None
        if spec.profile.new_token_ratio:
            self.ratio = NewTokenRatio(ATTENTION_DP_CONSERVATIVENESS if self.ranks > 1 else 1.0)
        # A prompt chunk that is not the prompt's rest: any tokens, or whole KV blocks (TensorRT-LLM).
        self.chunk_unit = spec.block_size if spec.profile.chunk_unit == "block" else 1
        self.unreserved_blocks = self.free_blocks  # reserving: blocks no running request has reserved
        # Prefix caching (engine/prefix_cache.py): made when the first request with a prefix comes,
        # so a workload without shared prefixes pays nothing for it.
        self.prefix_caching = spec.prefix_caching
        self.prefix: PrefixCache | None = None
        # What a preempted request leaves cached (Profile.preempted_keeps); the cache is made, if need
        # be, at the first preemption.
        self.keeps = spec.profile.preempted_keeps if spec.prefix_caching else None
        self.requeue_back = spec.profile.preempted_requeue == "back"  # (else ahead of the waiting requests)
        self.preempt_fewest = spec.profile.preempts_first == "fewest_outputs"  # (else the newest first)
        # SGLang: the attention ranks (0: the replica's one) that admit none until one of their running requests
        # leaves, a waiting request having found no room in the KV cache (Profile.refusal_waits_for_a_leave).
        self.waits_for_a_leave = spec.profile.refusal_waits_for_a_leave
        self.shut_ranks: set[int] = set()
        self._compose = self._compose_prefill_first if self.pauses else self._compose_mixed
        self._host = self._on_step if self.window == 1 else self._host_window
        # An overlapped scheduler forms each batch when the step before starts (host_time.host_overlapped):
        # while the engine is busy, the next step takes only requests that arrived by `formed_ns`, the
        # start of the step that just ran.
        self.lagged = host_overlapped(spec.scheduler, spec.host_overlap)
        self.formed_ns = 0
        # ... and takes in a step's outputs only once it has formed the next batch: a request that finishes
        # in a step keeps its sequence slot and KV blocks while that batch is formed (`unseen`, released after
        # it: _release_unseen). vLLM V1's async scheduling skips it but keeps it running until
        # update_from_output (Scheduler.schedule, vllm/v1/core/sched/scheduler.py; the engine core's
        # step_with_batch_queue schedules a batch before it waits for the oldest one's output); TensorRT-LLM
        # frees it in _process_previous_batch, after scheduling the next (PyExecutor._executor_loop_overlap);
        # SGLang's event_loop_overlap processes a batch's result after launching the next.
        self.finish_lag = self.lagged and self.window == 1
        # ... and, where the profile's scheduler does (Profile.runs_finished_batch), still runs that batch for
        # them once nothing else is left to run (_run_finished_batch).
        self.runs_finished_batch = self.finish_lag and spec.runs_finished_batch
        self.unseen: list[tuple[int, int, int | None]] = []  # (request, context, blocks: None, its context's)
        # ... and launches its kernels while the GPU runs that step, once its own work in it is done: the
        # next step's host is `ahead_s` ahead of the GPU (0 after an idle engine's wait, or not overlapped,
        # or where no step's time depends on it: costs.host_busy_s is None).
        self.ahead_s = 0.0
        self._host_busy_s = costs.host_busy_s if self.lagged else None  # (None: no lead is kept)
        # Speculative decoding (engine/speculative.py): a decoding sequence runs `width` query tokens a
        # step (its drafts and one more) and gains `advance` tokens, drawn per step; the decode clock
        # then moves `advance` ticks a step, a tick being a token, and the drafter adds its time.
        speculation = costs.speculation
        if speculation is not None and (self.window > 1 or self.interval > 1):
            raise ValueError("speculative decoding runs with num_scheduler_steps = 1 and stream_interval = 1")
        self.width = 1 if speculation is None else speculation.width
        self.acceptance = None if speculation is None else speculation.draws()
        self.advance = 1
        self._draft_s = costs.draft_s
        self.ticks_apart = self.pauses or speculation is not None  # ticks are not steps (trace_rows.py)

        # Per request (engine/requests.py): its columns and the arrival heap, bound here.
        self.requests = requests = Requests(self.front)
        self.prompt, self.cached, self.out = requests.prompt, requests.cached, requests.out
        self.generated, self.times_preempted = requests.generated, requests.times_preempted
        self.arrivals, self.at_front = requests.arrivals, requests.at_front
        queue = QUEUES[spec.profile.queue_policy]
        self.waiting: WaitingQueue | RankQueues = (
            queue() if self.ranks == 1
            else RankQueues(queue, self.ranks, spec.profile.attention_dp_routing, self.prompt))
        # The sequences part-way through their prompts, in admission order: at most one, or one a rank
        # under attention data-parallel, where each rank's scheduler chunks a prompt of its own (SGLang's
        # chunked_req, managers/scheduler.py, is a scheduler's, one a DP rank).
        self.prefills: list[Prefill] = []
        self.tick = 0  # the decode clock: steps in which decoding sequences advanced so far
        self.preempted_in_step = False
        self.window_left = 0  # multi-step: steps of the current decode window after this one
        self.window_host = WindowHost(self._on_step, self.interval)
        self.shortfall = 0  # speculative: tokens the sequences finishing in a step did not gain of its advance
        # Decodes past the token budget (`budget_binds`), in the step being composed: those that wait (in running
        # order), the one whose drafts are trimmed (request, its tokens, its context) and what it does not gain of
        # the step's advance, and whether they leave none of the budget (no prompt runs beside a decode that waits).
        self.sitting: list[int] = []
        self.trimmed: tuple[int, int, int] | None = None
        self.trimmed_short = 0
        self.budget_spent = False
        # ... and without held drafts' slots, the ticks of the step each of them gains (those that wait none), and
        # the blocks the decoding sequences' aggregate counts for the others (`_decode_blocks` leaves them out).
        self.gains: dict[int, int] = {}
        self.spared_blocks = 0

        # What each step did, as rows: the replica appends to their buffers, bound here.
        self.rows = rows = TraceRows(self.ticks_apart, keep_rows)
        self._step_buffer, self._span_buffer = rows.step_rows.buffer, rows.span_rows.buffer
        self._silent_buffer, self._first_buffer = rows.silent_rows.buffer, rows.first_rows.buffer
        self._tick_buffer, self._flush_values = rows.tick_rows.buffer, rows.flush_values
        self.num_steps = 0
        self.last_leave_ns = 0
        self.preemptions = 0
        # The decoding sequences (engine/running.py), and what the hot path reads of them, bound here.
        clip = None if self.ratio is None else CLIP_MAX_NEW_TOKENS_ESTIMATION  # (what the headroom reads)
        self.decoders = decoders = Decoding(self.block, self.interval, self.out, self.generated, self._span_buffer,
                                            clip)
        self.decoding, self.block_due, self.finishing_at = decoders.states, decoders.block_due, decoders.finishing_at
        self._start_decoding, self._stop_decoding = decoders.start, decoders.stop
        # An engine that keeps its drafts' KV slots from step to step (vLLM V1, SGLang's V2 worker,
        # engine/draft_slots.py): the decoding sequences' holds (engine/held_drafts.py), and the lookahead a
        # running prompt's chunk takes.
        hold = None if speculation is None else spec.draft_hold()
        if hold is not None and hold.width != self.width:
            raise ValueError(f"the engine's table drafts {hold.width - 1} tokens a step, the costs {self.width - 1}")
        self.held = None if hold is None else HeldDrafts(hold, self.block, self.decoding)
        self.chunk_lookahead = 0 if hold is None else hold.chunk_lookahead
        self.finish_blocks: dict[int, int] = {}  # holding: the blocks of each sequence finishing in the step
        self.completing_blocks: dict[int, int] = {}  # ... and of each finishing its prompt
        # Whether runs of decode steps can be taken at once (decode_run): nothing but the sequences' aggregates
        # sets a decode step's work and time.
        self._runs_decodes = (speculation is None and self.window == 1 and self.ranks == 1 and self.interval == 1
                              and not record_emitters and hasattr(costs, "decode_steps_s")
                              and hasattr(host, "on_steps"))

    # -- requests in -----------------------------------------------------------------------------

    def submit(self, input_tokens: int, output_tokens: int, arrival_ns: int, delivery_ns: int = 0,
               cached_tokens: int = 0, prefix: tuple[list[int], list[int]] | None = None, held: bool = False) -> int:
        """Queue a request that reaches the server at `arrival_ns`; `delivery_ns` is time it already
        spent on the way (its upload); the KV of its first `cached_tokens` prompt tokens comes with it
        (a decode engine receiving a prefilled request); `prefix`: the keys of its shared prompt
        segments and the token each ends at (workload.prefixes); `held`: it does not arrive until
        `send` names it. Returns its index."""
        self._check_fits(input_tokens, output_tokens)
        i = self.requests.add(input_tokens, output_tokens, arrival_ns, delivery_ns, cached_tokens, held)
        if prefix is not None and prefix[0] and self.prefix_caching:
            self._add_prefix(i, *prefix)
        return i

    def _add_prefix(self, i: int, keys: list[int], end_tokens: list[int]) -> None:
        if self.prefix is None:
            self.prefix = PrefixCache(self.block, self.free_blocks)
        self.prefix.add(i, keys, end_tokens)

    def submit_all(self, input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_ns: np.ndarray,
                   delivery_ns: np.ndarray, cached_tokens: np.ndarray, prefixes: Prefixes | None = None,
                   held: np.ndarray | None = None) -> None:
        """`submit` for many requests at once (int64 arrays, one row per request), in one pass. Rows
        where `held` is true do not arrive until `send` names them (a session's later turns)."""
        if len(input_tokens):
            self._check_fits(input_tokens, output_tokens)
        first = self.requests.add_all(input_tokens, output_tokens, arrival_ns, delivery_ns, cached_tokens, held)
        if prefixes is not None and self.prefix_caching:
            for k in np.flatnonzero(prefixes.offsets[1:] > prefixes.offsets[:-1]).tolist():
                self._add_prefix(first + k, *prefixes.segments(k))

    def hold_warm(self, prefixes: Prefixes) -> None:
        """Before the replica's first request: its prefix cache holds the warm segments (prefixes.py's
        `warm`) that the requests it will serve (`prefixes`' rows) name. Nothing without prefix caching."""
        if prefixes.warm is None or not self.prefix_caching:
            return
        if self.prefix is not None or len(self.requests.prompt):
            raise ValueError("a warm prefix cache is made before the replica's first request")
        blocks: dict[int, int] = {}
        warm = set(prefixes.warm.tolist())
        for k in np.flatnonzero(prefixes.offsets[1:] > prefixes.offsets[:-1]).tolist():
            keys, ends = prefixes.segments(k)
            start = 0
            for key, end in zip(keys, ends):
                if key in warm:
                    blocks[key] = end // self.block - start
                start = end // self.block
        order = [key for key in prefixes.warm.tolist() if blocks.get(key)]
        if order:
            self.prefix = PrefixCache(self.block, self.free_blocks, [(key, blocks[key]) for key in order])

    def send(self, i: int, arrival_ns: int, delivery_ns: int) -> None:
        """Request i, submitted held, reaches the server at `arrival_ns` after `delivery_ns` on the way."""
        self.requests.send(i, arrival_ns, delivery_ns)

    def _reservation(self, i: int) -> int:
        """Reserving, the KV blocks request i holds from admission to its end: its prompt, its output and,
        under speculative decoding, the drafts a verify step runs past them (`width` - 1 tokens)."""
        return -(-(self.prompt[i] + self.out[i] + self.width - 1) // self.block)

    def _check_fits(self, input_tokens, output_tokens) -> None:
        """Requests (ints, or arrays of them) that the whole cache cannot hold (EngineSpec.longest_request_tokens),
        or that no step holds whole (EngineSpec.whole_step_tokens), would never finish."""
        tokens = int(np.max(input_tokens + output_tokens))
        if tokens > self.spec.longest_request_tokens(self.cache_blocks * self.block, self.width - 1):
            raise ValueError(f"a request of {tokens} tokens needs more than the {self.cache_blocks} KV blocks "
                             "of the cache")
        step = self.spec.whole_step_tokens(input_tokens, output_tokens)
        step = None if step is None else int(np.max(step))
        if step is not None and step > self.spec.max_num_batched_tokens:
            raise ValueError(f"a request needs {step} tokens in one step without chunked prefill, "
                             f"above max_num_batched_tokens ({self.spec.max_num_batched_tokens})")

    def next_step_ns(self, horizon_ns: int | None = None) -> int | None:
        """When the next step starts: now with requests queued or running, else at the next arrival (or None).

        `horizon_ns`: more requests may yet be submitted that reach the server from then on (replicas on one
        clock, engine/cluster.py). The front end takes only the requests that reached it before: one that
        came at the same time or just before a later one must share its turn with it, so passing it through
        alone now would put its work ahead of theirs. A start from the horizon on is then a bound."""
        if self.waiting or self.decoding or self.prefills:
            return self.now
        if self.front:
            self._through_front_idle(horizon_ns)
        if self.arrivals:
            return max(self.now, self.arrivals[0] >> _ID_BITS)
        return max(self.now, self.at_front[0] >> _ID_BITS) if self.at_front else None

    def kv_used(self) -> float:
        """The share of the KV cache's blocks in use (cached prefix blocks count as free: they can be taken)."""
        return 1 - self.free_blocks / self.cache_blocks

    @property
    def busy(self) -> bool:
        """Requests are queued or running: the next step starts now."""
        return bool(self.waiting or self.decoding or self.prefills)

    def occupy(self, until_ns: int) -> None:
        """With nothing queued or running, the GPU is busy with other work until `until_ns`
        (engine/side_work.py): the next step starts no earlier."""
        if self.busy:
            raise ValueError("occupy: the engine has requests to run")
        self.now = max(self.now, until_ns)

    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.at_front or self.waiting or self.decoding or self.prefills)

    def abort(self, i: int) -> bool:
        """End request i now, between steps (a stop string, a client gone), as vLLM's abort does: it
        takes no part in the next step, which can give its batch slot and KV blocks to others. It
        keeps the tokens already made and from then on counts as finished with them (`out[i]`
        becomes `generated[i]`). Returns False if it had already finished (or been aborted). Under
        multi-step, one decoding inside a window gives back the blocks the window took for it too, and
        a window it leaves empty ends at once (`_end_window`). An abort that leaves nothing to run ends
        as a step that does (`_nothing_left`: under SGLang, its finished batch runs first).

        O(1) Python work, plus a C-level scan of the queue (or arrivals) holding a waiting (or
        arriving) request."""
        if self.generated[i] >= self.out[i]:  # finished (under multi-step, perhaps waiting for its window's end)
            return False
        prefill = next((prefill for prefill in self.prefills if prefill.request == i), None)
        if i in self.decoding:  # its entry in finishing_at goes stale (see Decoding.still_due)
            first, context0, _, _ = self.decoding[i]
            blocks = None
            if self.held is not None:
                blocks = self.held.held(i)
                self.held.leave(i)
            elif self.window_left:  # mid-window: it holds the blocks its window took for the steps still to run
                blocks = -(-(context0 + self.tick + self.window_left - first) // self.block)
            self._release(i, self._stop_decoding(i, self.tick - first), blocks)
            if self.window_left and not self.decoding:
                self._end_window()  # (nothing is left to run its steps)
        elif prefill is not None:
            self._release(i, 0, prefill.blocks)
            self.prefills.remove(prefill)
        elif not self.requests.withdraw(i):  # it is not on its way: it waits
            self.waiting.remove(i)
        self.out[i] = self.generated[i]
        if self.unseen and not (self.waiting or self.decoding or self.prefills):
            self._nothing_left()  # as after a step
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
        if self.acceptance is not None:
            self.advance = self.acceptance.next() if self.decoding else 1
        self.preempted_in_step = False
        scheduled = not self.window_left  # a step after a multi-step window's first calls no scheduler
        decode, chunks, admitted = self._compose(d)
        if self.unseen:
            self._release_unseen()
            if not (decode or admitted or any(chunks)):  # nothing to run: it takes in the outputs, then forms it
                self.formed_ns, self.ahead_s = self.now, 0.0
                self._take_arrivals()
                decode, chunks, admitted = self._compose(d)
        if self.ratio is not None and decode and not any(chunks) and not admitted and not self.preempted_in_step:
            self.ratio.decoded()
        if self.rank_pauses and (admitted or any(chunks)):
            decode = self._pause_prompt_ranks(d, decode, chunks, admitted)
        completing, finishing = self._run_batch(s, d, decode, chunks, admitted, scheduled)
        return self._apply(s, d, decode, completing, finishing)

    def decode_run(self) -> bool:
        """Run, where it can, the steps to come that only decode the same sequences, at once: each step as
        `step` runs it, value for value, from the running sequences' aggregates (their context grows by one
        token each a step). The run ends before a step that would finish a sequence, take a block the cache
        does not have, or see a request that reached the server or the engine; with requests waiting it runs only
        where none of its steps could admit one (`_admits_none`), and only where no step's work or time depends
        on more (`_runs_decodes`: no speculative decoding, multi-step windows, pipeline stages, attention ranks,
        drafts' slots, SSE events of several tokens or a live caller; the step's costs and delivery say where
        theirs can be had at once). Returns whether it ran any step: the caller then calls it, or `step`, again.
        A caller whose requests may reach the engine between steps without passing through it (a cluster's
        router, side jobs, a live server) calls `step` alone."""
        if not (self._runs_decodes and self.decoding) or self.prefills or self.unseen or self.pipeline is not None:
            return False
        self._take_arrivals()  # (as `step` does first: with sequences decoding, a second call takes nothing more)
        if (self.waiting and not self._admits_none()) or self.trimmed is not None or self.paused_context \
                or self.paused_events or self.side_ns or self.window_left \
                or (self.budget_binds and len(self.decoding) > self.max_batched):
            return False
        d, decode = self.tick, len(self.decoding)
        steps = self.decoders.ticks_to_finish(d)
        steps = MAX_DECODE_RUN if steps is None or steps > MAX_DECODE_RUN else steps
        arrival_ns = self.arrivals[0] >> _ID_BITS if self.arrivals else None
        at_front_ns = self.at_front[0] >> _ID_BITS if self.at_front else None
        if arrival_ns is not None or at_front_ns is not None:  # (as many steps as the last one's length leaves
            # before the next request comes, and two: the run is cut where it comes, whatever this guess)
            next_ns = min(t for t in (arrival_ns, at_front_ns) if t is not None)
            steps = min(steps, (next_ns - self.now) // max(self.now - self.formed_ns, 1) + 2)
        if steps < MIN_DECODE_RUN:
            return False
        blocking_ns = self.host.steps_blocking_ns(decode, decode)
        if blocking_ns is None:
            return False
        # The KV blocks each step takes (`_decode_blocks`), while the cache has them.
        blocks = np.cumsum(np.array(self.block_due)[(d + np.arange(steps)) % self.block] - self.spared_blocks)
        steps = int(np.searchsorted(blocks, self.free_blocks, side="right"))
        if steps < MIN_DECODE_RUN:
            return False
        pairs = self.decoders.context_sum + decode * np.arange(1, steps + 1, dtype=np.int64)  # (`_decode_attention`)
        compute_s = self.costs.decode_steps_s(decode, pairs, pairs)
        if compute_s is None:
            return False
        traffic_ns = round(self._traffic_s(decode, True) * 1e9)
        gpu_ns = np.rint(compute_s * 1e9).astype(np.int64) + traffic_ns
        start_ns = self.now + np.concatenate(([0], np.cumsum(gpu_ns[:-1] + blocking_ns)))
        gpu_end_ns = start_ns + gpu_ns
        # Where the run ends: before the step whose batch would be formed once a request had reached the engine
        # (`_take_arrivals`: formed as the step before began, or as it begins), or that would end on the GPU
        # once one had reached the server (`_gpu_work` passes it through the front end).
        formed_ns = np.concatenate(([-1], start_ns[:-1] if self.lagged else start_ns[1:]))  # (the first step's
        # batch is formed already: its arrivals are taken)
        if arrival_ns is not None:
            steps = min(steps, int(np.searchsorted(formed_ns, arrival_ns, side="left")))
        if at_front_ns is not None:
            steps = min(steps, int(np.searchsorted(formed_ns, at_front_ns, side="left")),
                        int(np.searchsorted(gpu_end_ns, at_front_ns, side="left")))
        if steps < MIN_DECODE_RUN:
            return False
        start_ns, gpu_ns, gpu_end_ns, pairs = start_ns[:steps], gpu_ns[:steps], gpu_end_ns[:steps], pairs[:steps]
        leave_ns, front_queue_ns, front_work_ns = self.host.on_steps(gpu_end_ns, decode, decode)
        ahead_s = np.full(steps, self.ahead_s)  # the host's lead as each step begins (`_end_step`)
        if self._host_busy_s is not None:
            lead_s = gpu_ns / 1e9 - self._host_busy_s(decode, decode, True, None)
            lead_s = np.where(lead_s > 0.0, lead_s, 0.0)
            ahead_s[1:], self.ahead_s = lead_s[:-1], float(lead_s[-1])
        s = self.num_steps
        columns = {"start_ns": start_ns, "compute_ns": gpu_ns - traffic_ns, "traffic_ns": traffic_ns,
                   "blocking_ns": blocking_ns, "leave_ns": leave_ns, "tokens": decode, "seqs": decode,
                   "attn_pairs": pairs, "kv_read_tokens": pairs, "chunk_context_tokens": 0, "logits": decode,
                   "front_queue_ns": front_queue_ns, "front_work_ns": front_work_ns, "scheduled": 1,
                   "ahead_ns": np.rint(ahead_s * 1e9)}
        table = np.empty((steps, len(STEP_FIELDS)), np.int64)
        for k, name in enumerate(STEP_FIELDS):
            table[:, k] = columns[name]
        self.rows.step_rows.append(table)
        if self.ticks_apart:
            self.rows.tick_rows.append(np.arange(s, s + steps, dtype=np.int64).reshape(-1, 1))
        self.num_steps, self.tick = s + steps, d + steps
        self.free_blocks -= int(blocks[steps - 1])
        self.decoders.context_sum += decode * steps
        self.formed_ns, self.now = int(start_ns[-1]), int(gpu_end_ns[-1]) + blocking_ns
        self.last_leave_ns = int(leave_ns[-1])
        self.preempted_in_step, self.budget_spent = False, False
        if self.ratio is not None:
            for _ in range(steps):
                self.ratio.decoded()
        return True

    def _admits_none(self) -> bool:
        """Whether `_admit` takes none of the waiting requests, with no other effect, in any step of a decode run,
        for a reason no such step changes (each holds the same running sequences, reservations and refusals):
        every sequence slot is taken, the queue's head reserving its whole cache would pass what is unreserved, or
        a refusal waits for a running request to leave (`_shut`)."""
        return len(self.decoding) >= self.max_seqs or 0 in self.shut_ranks or self._head_cannot_reserve()

    def _head_cannot_reserve(self) -> bool:
        """Reserving (one attention rank), the queue's head needs more KV blocks than no running request has
        reserved: it waits, and none behind it is admitted."""
        return self.reserve and self._reservation(self.waiting[0]) > self.unreserved_blocks

    def _take_arrivals(self) -> None:
        """Queue the requests that have reached the engine by the time the step's batch is formed; an
        idle engine first waits for one and forms its batch at once."""
        arrivals, waiting = self.arrivals, self.waiting
        if waiting or self.decoding or self.prefills:
            formed = self.formed_ns if self.lagged else self.now
            at_front = self.at_front
            if at_front and at_front[0] >> _ID_BITS <= formed:
                self._through_front(formed)
        else:
            if self.front:
                self._through_front_idle()
            first_ns = arrivals[0] >> _ID_BITS
            if first_ns <= self.formed_ns:  # it came by the start of the last step (an overlapped scheduler's
                formed = self.formed_ns  # formation, or _run_finished_batch's): its batch was formed then
            else:
                if first_ns > self.now and self.ratio is not None:  # it waits idle: SGLang starts the ratio over
                    self.ratio.idle()
                formed = self.now = max(self.now, first_ns)
                self.ahead_s = 0.0  # its host had nothing to launch before the batch was formed
        arrived = (formed + 1) << _ID_BITS
        while arrivals and arrivals[0] < arrived:
            waiting.append(heapq.heappop(arrivals) & _ID_MASK)

    def _through_front(self, until_ns: int) -> None:
        """Pass the requests that reached the server by `until_ns` through the front end, in arrival order."""
        at_front, prompt, arrivals = self.at_front, self.prompt, self.arrivals
        requests = self.requests
        upload, front_queue, front_work = requests.upload, requests.front_queue, requests.front_work
        until = (until_ns + 1) << _ID_BITS
        key = heapq.heappop(at_front)
        if not at_front or at_front[0] >= until:  # the common case: one request, without the lists
            ids = (key & _ID_MASK,)
            waits = (self.host.request(key >> _ID_BITS, prompt[ids[0]]),)
        else:
            keys = [key]
            while at_front and at_front[0] < until:
                keys.append(heapq.heappop(at_front))
            ids = [key & _ID_MASK for key in keys]
            waits = self.host.requests([key >> _ID_BITS for key in keys], [prompt[i] for i in ids])
        for i, (done_ns, queue_ns, work_ns) in zip(ids, waits):
            upload[i] += queue_ns + work_ns  # its time on the way in is delivery, the front end's too
            front_queue[i], front_work[i] = queue_ns, work_ns
            heapq.heappush(arrivals, done_ns << _ID_BITS | i)

    def _through_front_idle(self, horizon_ns: int | None = None) -> None:
        """With nothing to run, pass requests through the front end until the first that reaches the engine
        is known: every request that reached the server before it (another process may pass it on sooner),
        and before `horizon_ns` (next_step_ns)."""
        at_front, arrivals = self.at_front, self.arrivals
        while at_front and (horizon_ns is None or at_front[0] >> _ID_BITS < horizon_ns) and (
                not arrivals or at_front[0] >> _ID_BITS <= arrivals[0] >> _ID_BITS):
            self._through_front(at_front[0] >> _ID_BITS)

    # The profiles' batches. Each returns (decoding sequences taking part, tokens of each prompt in
    # progress (`prefills`' order; empty without one), admitted (request, tokens, target)), having taken
    # the KV blocks they need.

    def _compose_mixed(self, d: int) -> tuple[int, Sequence[int], Sequence[tuple[int, int, int]]]:
        """vllm-v1 and trtllm (and prefill-first with mixed chunks): the running sequences, then waiting
        ones while the step has room; none in a step that had to preempt (as vLLM does), nor on a rank
        whose prompt is still in progress after the step. Decodes past the token budget wait (`_share_budget`)."""
        over = self.budget_binds and len(self.decoding) * self.width > self.max_batched
        self.budget_spent, self.trimmed = over, None
        if over:
            self._share_budget(d)
        new_blocks = self._decode_blocks(d, self.advance)
        if not self.prefills and new_blocks <= self.free_blocks:  # the common case, without a call
            self.free_blocks -= new_blocks
            decode = self._seat(d) if over else len(self.decoding)
            if not self.waiting:
                return decode, _NONE, _NONE
            return decode, _NONE, self._admit(self.max_batched - self._decode_tokens(),
                                              self.max_seqs - len(self.decoding) - len(self.unseen))
        chunks, preempted = self._running_demands(d)
        decode = self._seat(d) if over else len(self.decoding)
        if preempted or not self.waiting:
            return decode, chunks, _NONE
        return decode, chunks, self._admit(self.max_batched - self._decode_tokens() - sum(chunks),
                                           self.max_seqs - len(self.decoding) - len(self.prefills) - len(self.unseen),
                                           chunks)

    def _decode_tokens(self) -> int:
        """The share of the step's token budget that the decoding sequences take: a token each (speculating,
        their drafts too), or where they pass it the whole of it (`_share_budget`); none where each rank pauses
        its own decodes for its prompts (`rank_pauses`)."""
        if self.rank_pauses:
            return 0
        return self.max_batched if self.budget_spent else len(self.decoding) * self.width

    def _share_budget(self, d: int) -> None:
        """The decoding sequences' tokens pass the step's budget (Profile.decodes_past_budget, engine/
        batch_limits.py): in running order each takes its verify tokens; the first that would pass the budget
        runs the rest where the engine trims its drafts (vLLM V1), and it (else) and those after wait a step,
        holding their KV blocks. Before the step's blocks are counted: those that wait take none, the trimmed one
        those of its tokens. Under attention data-parallel, over the ranks' budgets together (a rank's decoding
        tokens are taken as an even share elsewhere too, `_rank_budgets_left`). O(1) per sequence that waits."""
        width, held, block, ticks = self.width, self.held, self.block, self.advance
        whole, rest = divmod(self.max_batched, width)
        trims = self.trims and rest > 0
        newest = reversed(self.decoding)
        sitting = [next(newest) for _ in range(len(self.decoding) - whole - trims)]
        sitting.reverse()
        self.sitting = sitting
        self.gains, spared, states = {}, 0, self.decoding
        for i in sitting:
            if held is not None:
                held.sit_out(i)
            else:
                first, context0, _, _ = states[i]
                context = context0 + d - first
                spared += (context + ticks - 1) // block - (context - 1) // block
                self.gains[i] = 0
        if trims:
            i = next(newest)
            first, context0, _, _ = states[i]
            context = context0 + d - first
            self.trimmed = (i, rest, context)
            if held is not None:
                held.trim(i, rest)
            else:  # (blocks for the tokens it can gain)
                gains = self.gains[i] = min(ticks, rest)
                spared += (context + ticks - 1) // block - (context + gains - 1) // block
        self.spared_blocks = spared

    def _seat(self, d: int) -> int:
        """After the step's blocks are taken (a preemption may have taken some of the decodes past the budget
        too): those that wait make no token in the step's ticks, and the trimmed one none in those after its
        tokens (Decoding.pause); the step leaves their contexts out. Returns the decoding sequences that take
        part."""
        decoding, ticks, pause = self.decoding, self.advance, self.decoders.pause
        sitting = [i for i in self.sitting if i in decoding]
        for i in sitting:
            self.paused_context += pause(i, d, ticks)
        self.sitting, self.gains, self.spared_blocks = [], {}, 0
        if self.trimmed is not None:
            i, tokens, _ = self.trimmed
            if i not in decoding:  # (preempted, and every decode after it)
                self.trimmed = None
            elif tokens < ticks and decoding[i][2] >= d + tokens:  # (its last token comes after its tokens)
                pause(i, d + tokens, ticks - tokens)
                self.trimmed_short = ticks - tokens
        return len(decoding) - len(sitting)

    def _compose_prefill_first(self, d: int) -> tuple[int, Sequence[int], Sequence[tuple[int, int, int]]]:
        """prefill-first (one attention rank): a prefill step (the prompt in progress, then waiting
        prompts) while decoding sequences pause, when one can run; otherwise a decode window of every
        decoding sequence (one step, or num_scheduler_steps with a fixed batch)."""
        if self.window_left:
            self.window_left -= 1
            return len(self.decoding), _NONE, _NONE
        budget = self.max_batched
        room = self.max_seqs - len(self.decoding) - len(self.prefills) - len(self.unseen)
        if self.prefills:
            prefill = self.prefills[0]
            rest = prefill.target - prefill.computed
            num = rest if rest <= budget else budget
            blocks = -(-(prefill.computed + num) // self.block) - prefill.blocks
            if blocks <= self.free_blocks:
                self.free_blocks -= blocks
                prefill.blocks += blocks
                if self.prefix is not None:
                    self.prefix.computed(prefill.request, prefill.computed + num)
                chunks = [num]
                return 0, chunks, self._admit(budget - num, room, chunks) if self.waiting else _NONE
        elif self.waiting:
            admitted = self._admit(budget, room)
            if admitted:
                return 0, _NONE, admitted
        return self._decode_window(d), _NONE, _NONE

    # The phases the profiles share.

    def _running_demands(self, d: int) -> tuple[Sequence[int], bool]:
        """The running sequences' tokens and KV blocks when they all take part: a token for every
        decoding sequence (speculating, its drafts too), the rest of the budget for each prompt in
        progress (under attention data-parallel, of its rank's budget). Preempts when the blocks do not
        fit. Returns (tokens of each prompt in progress, whether it preempted)."""
        ticks = self.advance
        new_blocks = self._decode_blocks(d, ticks)
        prefills, block, lookahead = self.prefills, self.block, self.chunk_lookahead
        if not prefills:
            if new_blocks <= self.free_blocks:
                self.free_blocks -= new_blocks
                return _NONE, False
        else:
            decode_tokens = self._decode_tokens()
            budget, rank_budget = self.max_batched - decode_tokens, None
            if self.rank_budget is not None:  # each rank's share, less its share of the decoding tokens
                rank_budget = self.rank_budget - -(-decode_tokens // self.ranks)
            while True:
                chunks, blocks, left = [], new_blocks, budget
                for prefill in prefills:  # (at most one a rank)
                    rest = prefill.target - prefill.computed
                    room = left if rank_budget is None else min(left, rank_budget)
                    # (speculative decoding's decodes can take the whole budget: the prompt then waits a step)
                    num = rest if rest <= room else max(room - room % self.chunk_unit, 0)
                    chunks.append(num)
                    left -= num
                    # (holding drafts' slots, a chunk that runs takes the lookahead: engine/draft_slots.py)
                    blocks += max(-(-(prefill.computed + num + (lookahead if num else 0)) // block) - prefill.blocks, 0)
                if blocks <= self.free_blocks:
                    self.free_blocks -= blocks
                    for prefill, num in zip(prefills, chunks):
                        prefill.blocks = max(-(-(prefill.computed + num + (lookahead if num else 0)) // block),
                                             prefill.blocks)
                        if self.prefix is not None:
                            self.prefix.computed(prefill.request, prefill.computed + num)
                    return chunks, self.preempted_in_step
                if len(prefills) == 1:
                    break
                # Several ranks' prompts: the newest is preempted first, the others go on (so the oldest
                # always progresses, as the one prompt in progress does).
                self._requeue([self._free_prompt(prefills.pop())])
        new_blocks = self._preempt(d, new_blocks, ticks)  # (it frees blocks: not inside `free_blocks -= ...`)
        self.free_blocks -= new_blocks
        return _NONE, True

    def _decode_window(self, d: int) -> int:
        """Start a decode window: take the KV blocks every decoding sequence needs over its steps,
        preempting when they do not fit. Returns the decoding sequences taking part."""
        window = self.window
        ticks = window if window > 1 else self.advance  # (multi-step and speculative decoding never meet)
        new_blocks = self._decode_blocks(d, ticks)
        if new_blocks > self.free_blocks:
            new_blocks = self._preempt(d, new_blocks, ticks)
        self.free_blocks -= new_blocks
        decode = len(self.decoding)
        self.window_left = window - 1 if decode else 0
        return decode

    def _decode_blocks(self, d: int, ticks: int) -> int:
        """KV blocks the decoding sequences take in the step at tick d that advances them `ticks` ticks: those
        of its tokens (but those the decodes past the budget do not gain, `spared_blocks`), or where the engine
        keeps drafts' slots the growth of their holds (engine/held_drafts.py)."""
        if self.held is not None:
            return self.held.due(d, self._blocks_due)
        return (self.block_due[d % self.block] if ticks == 1 else self._blocks_due(d, ticks)) - self.spared_blocks

    def _blocks_due(self, d: int, ticks: int) -> int:
        """KV blocks the decoding sequences need over the `ticks` ticks from d."""
        due, block = self.block_due, self.block
        return sum(due[(d + j) % block] for j in range(ticks))

    def _preempt(self, d: int, new_blocks: int, window: int) -> int:
        """Preempt from the tail of the running order (the prompts in progress, then the newest decoding, or
        under SGLang the decoding one with the fewest tokens made: `_fewest_outputs`) until the blocks the
        decoding sequences need over the next `window` ticks fit. Preempted sequences give back their
        blocks (a prefix that came with the request too) and go back to the queue (`_requeue`); with
        prefix caching, what the profile keeps stays cached for them: all
        they had computed, or the tokens of their last prefill (a prompt in progress: its chunks so
        far). Returns the blocks the remaining decoding sequences need."""
        block, keeps = self.block, self.keeps
        victims = [self._free_prompt(prefill) for prefill in reversed(self.prefills)]
        self.prefills = []
        while new_blocks > self.free_blocks and self.decoding:
            i = self._fewest_outputs(d) if self.preempt_fewest else next(reversed(self.decoding))
            first, context0, _, _ = self.decoding[i]
            context = context0 + d - first
            if self.held is None:  # (a decode past the budget gains fewer ticks: `gains`)
                gains = self.gains.get(i, window)
                due, held = (context + gains - 1) // block - (context - 1) // block, -(-context // block)
            else:  # (its hold, and the hold's growth the step would take)
                due, held = self.held.preempted(i)
            new_blocks -= due  # its blocks in the window
            self._stop_decoding(i, d - first)
            self._free(i, held, context if keeps == "computed" else context0 if keeps else 0)
            victims.append(i)
        self._requeue(victims)
        return new_blocks

    def _fewest_outputs(self, d: int) -> int:
        """SGLang's next decoding sequence to retract at tick d: the one that has made the fewest tokens, then
        the one of the longest prompt, then the newest (ScheduleBatch.retract_decode's order). A scan of the
        decoding sequences, once per sequence retracted."""
        generated, prompt = self.generated, self.prompt
        victim, fewest = -1, None
        for i, (first, _, _, _) in reversed(self.decoding.items()):  # (the newest first: it wins a tie)
            key = (generated[i] + d - first, -prompt[i])
            if fewest is None or key < fewest:
                victim, fewest = i, key
        return victim

    def _free_prompt(self, prefill: Prefill) -> int:
        """A prompt in progress, preempted, gives back its blocks; with prefix caching its chunks so far stay
        cached if the profile keeps them. Returns its request."""
        self._free(prefill.request, prefill.blocks, prefill.computed if self.keeps else 0)
        return prefill.request

    def _requeue(self, victims: list[int]) -> None:
        """Preempted requests, the newest first, lose their KV cache and go back to the queue: to its front
        (the oldest first), or under SGLang to its back, in the order they were preempted."""
        self.preemptions += len(victims)
        for i in victims:
            if self.shut_ranks:
                self._reopen(i)
            self.cached[i] = 0
            self.times_preempted[i] += 1
            if self.reserve:  # (admitted again, it reserves again)
                self.unreserved_blocks += self._reservation(i)
        if self.requeue_back:
            self.waiting.extend(victims)
        else:
            self.waiting.extendleft(victims)
        self.preempted_in_step = True
        if self.ratio is not None:
            out_sum = self.decoders.out_sum
            self.ratio.retracted(out_sum - self._outputs_to_come(), out_sum, len(self.decoding))

    def _admit(self, budget: int, room: int, chunks: Sequence[int] = _NONE) -> list[tuple[int, int, int]]:
        """Waiting sequences, first come first served, while the step has room: sequences, tokens and
        KV blocks (reserving: the whole KV cache of each, prompt and output; where the release admits a
        prompt only while its whole prompt's blocks are free, `whole_prompt`, those must be, the chunk's
        taken). A prompt longer than the
        budget left (under attention data-parallel, its rank's) waits, or with chunked prefill is cut to it (to
        whole blocks under trtllm) and is the last admitted; without, SGLang runs it whole if it is the
        first its rank admits in the step (Profile.long_prompt_alone). `chunks`: the tokens the step runs of each
        prompt in progress; one still in progress after the step admits none behind it (on its rank).
        Returns (request, tokens this step, its prefill target) for each.

        Under attention data-parallel each rank admits from its own queue (its scheduler's), the rank
        whose next request came first (the lowest index) first: a rank that can take no more closes,
        the others go on, each rank up to its own max_num_seqs (`rank_seqs`); the KV cache and SGLang's ratio
        are the replica's."""
        admitted: list[tuple[int, int, int]] = []
        block, prefix, ratio, ranks = self.block, self.prefix, self.ratio, self.ranks
        if ranks == 1 and self._head_cannot_reserve():
            return admitted  # (the common case of a full engine that reserves: its queue's head waits)
        if ranks == 1:
            queues, rank_of, running, open_ranks = (self.waiting,), None, None, [0]
        else:
            waiting = self.waiting
            queues, rank_of, running = waiting.queues, waiting.rank_of, waiting.running
            open_ranks = [r for r in range(ranks) if queues[r] and running[r] < self.rank_seqs]
        for prefill, num in zip(self.prefills, chunks):
            r = 0 if rank_of is None else rank_of[prefill.request]
            if num < prefill.target - prefill.computed and r in open_ranks:
                open_ranks.remove(r)
        if self.shut_ranks:
            open_ranks = [r for r in open_ranks if r not in self.shut_ranks]
        if not open_ranks:
            return admitted
        rank_left = None if self.rank_budget is None else self._rank_budgets_left(chunks)
        if ratio is not None:
            spare = ratio.spare_tokens(self.free_blocks * block, self._clipped_to_come())
        while open_ranks and len(admitted) < room and budget > 0:
            r = open_ranks[0] if len(open_ranks) == 1 else min(open_ranks, key=lambda r: queues[r][0])
            waiting = queues[r]
            i = waiting[0]
            cached = self.cached[i]
            target = self.prompt[i] + self.generated[i]  # a preempted request recomputes the tokens it sent
            touched = 0  # with a prefix hit: cached blocks taken off the free queue, less the hit blocks
            if prefix is not None and i in prefix.segments:
                found, hit_blocks, queued = prefix.lookup(i, target, self.free_blocks)
                # (a decode replica's request brings its prompt's KV: the hit's blocks it shares, not recomputes)
                cached = max(cached, hit_blocks * block)
                touched = queued - hit_blocks
            need = num = target - cached
            room_tokens = budget if rank_left is None else max(min(budget, rank_left[r]), 0)
            # (SGLang without chunking takes a prompt after its rank's first only below the budget left:
            # `input_tokens >= rem_input_tokens` stops its PrefillAdder, schedule_policy.py)
            if need > room_tokens or (need == room_tokens and self.long_prompt_alone):
                num = room_tokens - room_tokens % self.chunk_unit if self.chunked else 0
                if self.long_prompt_alone and not any(rank_of is None or rank_of[a[0]] == r for a in admitted):
                    num = need  # SGLang without chunking: whole, as its rank's first this step
                if not num:  # its rank takes no more this step
                    open_ranks.remove(r)
                    continue
            blocks = -(-(cached + num) // block)
            if ratio is not None:
                estimate = new_request_tokens(need, self.out[i] - self.generated[i], self.cache_blocks * block)
                if estimate >= spare:
                    self._shut(r, admitted)
                    break
                spare -= estimate
            if self.reserve:
                reserved = self._reservation(i)
                if reserved > self.unreserved_blocks:
                    break
                self.unreserved_blocks -= reserved
            elif (-(-target // block) if self.whole_prompt else blocks) + touched > self.free_blocks:
                self._shut(r, admitted)
                break
            waiting.popleft()
            self.free_blocks -= blocks + touched
            if prefix is not None and i in prefix.segments:
                prefix.acquire(i, found, hit_blocks, i not in prefix.hit_tokens)
                self.cached[i] = cached
                prefix.computed(i, cached + num)
            admitted.append((i, num, target))
            budget -= min(num, room_tokens)  # (a prompt run alone above it takes only its rank's room)
            if rank_left is not None:
                rank_left[r] -= num
            if running is not None:
                running[r] += 1
                if running[r] >= self.rank_seqs:  # its rank's max_num_seqs
                    open_ranks.remove(r)
                    continue
            if num < need or not waiting:  # a prompt cut to the budget is the last its rank admits
                open_ranks.remove(r)
        return admitted

    def _shut(self, r: int, admitted: Sequence[tuple[int, int, int]]) -> None:
        """Rank r's next waiting request found no room in the KV cache: under SGLang the rank admits none until
        one of its running requests leaves (`_reopen`), where it has one (or admitted one in this step)."""
        if not self.waits_for_a_leave:
            return
        if self.ranks == 1:
            runs = bool(self.decoding or self.prefills or admitted)
        else:
            runs = self.waiting.running[r] > 0
        if runs:
            self.shut_ranks.add(r)

    def _reopen(self, i: int) -> None:
        """Running request i leaves (finished, aborted or preempted): its rank admits again."""
        self.shut_ranks.discard(0 if self.ranks == 1 else self.waiting.rank_of[i])

    def _rank_budgets_left(self, chunks: Sequence[int]) -> list[int]:
        """Under attention data-parallel, each rank's prompt tokens left in the step being composed: its
        budget (`rank_budget`), less an even share of the decoding tokens taking part and the `chunks` of
        the prompts in progress on it."""
        decode_tokens = self._decode_tokens()
        left = [self.rank_budget - -(-decode_tokens // self.ranks)] * self.ranks
        rank_of = self.waiting.rank_of
        for prefill, num in zip(self.prefills, chunks):
            left[rank_of[prefill.request]] -= num
        return left

    def _prompt_on_busiest_rank(self, chunks: Sequence[int], admitted: Sequence[tuple[int, int, int]]) -> int:
        """Attention data-parallel: the prompt tokens of the step's rank that holds the most (the `chunks` of
        the prompts in progress and the `admitted`, each on its request's rank)."""
        rank_of, per_rank = self.waiting.rank_of, [0] * self.ranks
        for prefill, q in zip(self.prefills, chunks):
            per_rank[rank_of[prefill.request]] += q
        for i, q, _ in admitted:
            per_rank[rank_of[i]] += q
        return max(per_rank)

    def _pause_prompt_ranks(self, d: int, decode: int, chunks: Sequence[int],
                            admitted: Sequence[tuple[int, int, int]]) -> int:
        """SGLang under attention data-parallel: a rank that runs a prompt in the step pauses its own decodes
        (`rank_pauses`). Each of them decodes again after the step's ticks with the context it has, in its
        place (Decoding.pause), and gives back the KV block taken for a token it does not make; the step's
        work leaves out their contexts (`paused_context`) and, where events group tokens, the events they
        would close (`paused_events`). Returns the decoding sequences that take part."""
        rank_of, ticks, block, interval = self.waiting.rank_of, self.advance, self.block, self.interval
        ranks = {rank_of[prefill.request] for prefill, num in zip(self.prefills, chunks) if num}
        ranks.update(rank_of[i] for i, _, _ in admitted)
        paused = [i for i in self.decoding if rank_of[i] in ranks]
        pause = self.decoders.pause
        context_sum = events = 0
        held = self.held
        for i in paused:
            taken = None if held is None else held.pause(i)  # (holding drafts' slots: what the step took for it)
            context = pause(i, d, ticks)
            context_sum += context
            self.free_blocks += (context + ticks - 1) // block - (context - 1) // block if taken is None else taken
            if interval > 1 and (ticks - self.generated[i]) % interval == 0:
                events += 1  # (its new start, d + ticks, puts it on tick d's events: Decoding's event_due)
        self.paused_context, self.paused_events = context_sum, events
        return decode - len(paused)

    def _finish_short(self, last: int, finishing: Sequence[int]) -> None:
        """Speculative decoding: the sequences that finish before the step's `last` tick gain fewer tokens
        than its advance (`shortfall`), and give back the KV blocks taken for the ticks after theirs."""
        states, block, trimmed = self.decoding, self.block, self.trimmed
        for i in finishing:
            first, context0, last_tick, _ = states[i]
            extra = last - last_tick
            if extra:
                self.shortfall += extra
                if self.held is not None:  # (its hold is given back whole when it leaves)
                    continue
                if trimmed is not None and trimmed[0] == i:  # (blocks were taken for the tokens it could gain)
                    extra -= self.advance - min(self.advance, trimmed[1])
                context = context0 + last_tick - first + 1
                unused = (context + extra - 1) // block - (context - 1) // block
                self.free_blocks += unused
                if self.prefix is not None:
                    self.prefix.give_back(unused)

    def _due_within(self, d: int, ticks: int) -> list:
        """The states due to finish at the `ticks` ticks from d, in tick order."""
        finishing_at, due = self.finishing_at, []
        for t in range(d, d + ticks):
            states = finishing_at.pop(t, None)
            if states:
                due += states
        return due

    def _outputs_to_come(self) -> int:
        """Tokens the running sequences will still generate: the decoding ones' (from their last ticks, at
        this tick) and the prompts' in progress."""
        left = self.decoders.last_tick_sum - len(self.decoding) * (self.tick - 1)
        for prefill in self.prefills:
            left += self.out[prefill.request] - self.generated[prefill.request]
        return left

    def _clipped_to_come(self) -> int:
        """What SGLang's headroom reserves a share of: each running request's outputs to come, up to
        CLIP_MAX_NEW_TOKENS_ESTIMATION (PrefillAdder._get_running_request_total_token_offset)."""
        left = self.decoders.clipped_to_come(self.tick)
        for prefill in self.prefills:
            to_come = self.out[prefill.request] - self.generated[prefill.request]
            left += to_come if to_come < CLIP_MAX_NEW_TOKENS_ESTIMATION else CLIP_MAX_NEW_TOKENS_ESTIMATION
        return left

    def _run_batch(self, s: int, d: int, decode: int, chunks: Sequence[int], admitted: Sequence[tuple[int, int, int]],
                   scheduled: bool) -> tuple[list[tuple[int, int]], Sequence[int]]:
        """The batch's shape, its cost and its row; moves `now` to the step's end. Sequences still short
        of their prompt take part silently; the others sample a token; `scheduled`: the step called the
        scheduler. Returns the sequences that finish their prompt (request, context after the step) and
        the decoding ones whose token is their last."""
        width = self.width
        prefill_num = sum(chunks) if chunks else 0  # (the prompts in progress)
        prefilling = 0  # ... that take part
        num_tokens = decode * width + prefill_num
        # (the paused decodes' contexts and events, `_pause_prompt_ranks` and `_seat`, take no part)
        context, paused_events = self.decoders.context_sum - self.paused_context, self.paused_events
        self.paused_context = self.paused_events = 0
        attn_pairs, kv_read = self._decode_attention(context, decode) if decode else (0, 0)
        cut = 0  # the verify tokens the budget's end trims off a decode (`_share_budget`)
        if self.trimmed is not None:
            _, tokens, trimmed_context = self.trimmed
            cut = width - tokens
            num_tokens -= cut
            attn_pairs -= cut * trimmed_context + (width * (width + 1) - tokens * (tokens + 1)) // 2
            kv_read -= cut
        chunk_context = 0  # positions cached before each prompt chunk
        completing: list[tuple[int, int]] = []
        prompt_on_busiest = None
        if self.ranks > 1 and (prefill_num or admitted):
            prompt_on_busiest = self._prompt_on_busiest_rank(chunks, admitted)
        if prefill_num:
            in_progress = []
            for prefill, q in zip(self.prefills, chunks):
                if not q:
                    in_progress.append(prefill)
                    continue
                p = prefill.computed
                prefilling += 1
                attn_pairs, kv_read = attn_pairs + q * p + q * (q + 1) // 2, kv_read + p + q
                chunk_context += p
                prefill.computed = p + q
                if p + q == prefill.target:
                    completing.append((prefill.request, p + q))
                    if self.held is not None:
                        self.completing_blocks[prefill.request] = prefill.blocks
                else:
                    in_progress.append(prefill)
                    self._silent_buffer.extend((prefill.request, s))
            self.prefills = in_progress
        cached = self.cached
        for i, q, target in admitted:
            p = cached[i]
            num_tokens += q
            attn_pairs += q * p + q * (q + 1) // 2
            kv_read += p + q
            chunk_context += p
            if p + q == target:
                completing.append((i, p + q))
                if self.held is not None:  # (a waiting request's first chunk takes no lookahead)
                    self.completing_blocks[i] = -(-(p + q) // self.block)
            else:
                self.prefills.append(Prefill(i, p + q, -(-(p + q) // self.block), target))
                self._silent_buffer.extend((i, s))
        finishing: Sequence[int] = _NONE
        advance, self.shortfall, self.trimmed_short = self.advance, self.trimmed_short, 0
        if decode or not self.pauses:  # the decode clock ticks
            due = self.finishing_at.pop(d, None) if advance == 1 else self._due_within(d, advance)
            if due:
                finishing = self.decoders.still_due(due)
                if advance > 1:
                    self._finish_short(d + advance - 1, finishing)
        logits = decode * width - cut + len(completing)  # the LM head's rows
        if width == 1:
            sampled = logits
            events = logits if self.interval == 1 else self.decoders.events(d, decode, finishing, completing)
            if paused_events and decode:  # (the grid is read only with decodes taking part)
                events -= paused_events
        else:  # every sequence's new tokens leave in one event
            sampled, events = decode * advance - self.shortfall + len(completing), decode + len(completing)

        # Speculating, the sequences sampled are not the LM head's rows (its verify rows): the host's
        # work and the decode graphs count them.
        sequences = None if width == 1 else decode + len(completing)
        side_ns, self.side_ns = self.side_ns, 0  # another model's kernels in this step
        compute_ns, traffic_ns, gpu_end = self._gpu_work(num_tokens, logits, attn_pairs, kv_read, chunk_context,
                                                         scheduled, prompt_on_busiest, sequences,
                                                         decode + len(completing), side_ns)
        blocking_ns, leave_ns, front_queue_ns, front_work_ns = self._host(gpu_end, sampled, events)
        self._record(s, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens, decode + prefilling + len(admitted),
                     attn_pairs, kv_read, chunk_context, logits, front_queue_ns, front_work_ns, scheduled)
        if leave_ns >= 0:
            self.last_leave_ns = leave_ns
        if self.record_emitters:
            self.rows.emitted(self.decoders.emitters(d, decode, completing), not self.window_left)
        self._end_step(gpu_end + blocking_ns, compute_ns + traffic_ns, num_tokens, logits, scheduled, sequences)
        return completing, finishing

    def _decode_attention(self, context: int, decode: int) -> tuple[int, int]:
        """(attention pairs, KV positions read) of `decode` decoding sequences of `context` cached positions in all:
        each attends to its cache and its new token; speculating, to its cache and its `width` new ones, each
        query those before it too."""
        width = self.width
        if width == 1:
            return context + decode, context + decode
        return width * context + decode * width * (width + 1) // 2, context + decode * width

    def _record(self, s: int, compute_ns: int, traffic_ns: int, blocking_ns: int, leave_ns: int, num_tokens: int,
                sequences: int, attn_pairs: int, kv_read: int, chunk_context: int, logits: int, front_queue_ns: int,
                front_work_ns: int, scheduled: bool) -> None:
        """Step `s`'s row of the trace (engine/trace_rows.py's columns), begun at `now`."""
        self._step_buffer.extend((self.now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens, sequences,
                                  attn_pairs, kv_read, chunk_context, logits, front_queue_ns, front_work_ns, scheduled,
                                  round(self.ahead_s * 1e9)))
        self.num_steps = s + 1

    def _gpu_work(self, num_tokens: int, logits: int, attn_pairs: int, kv_read: int, chunk_context: int,
                  scheduled: bool, prompt_on_busiest: float | None, sequences: int | None, drafting: int,
                  side_ns: int) -> tuple[int, int, int]:
        """A step's GPU work from `now`: (compute_ns, traffic_ns, its end). The step's kernels, the drafter's
        passes for `drafting` sequences after them (compute/drafter.py) and `side_ns` of another model's kernels,
        a pipeline's wait for a stage another batch holds counted as compute; the requests that reached the
        server while it ran pass the front end first."""
        traffic_s = self._traffic_s(num_tokens, logits == num_tokens)
        if prompt_on_busiest is None and sequences is None:
            compute_s = self._compute_s(num_tokens, logits, attn_pairs, kv_read, chunk_context, scheduled,
                                        traffic_s, self.ahead_s)
        else:
            compute_s = self._compute_s(num_tokens, logits, attn_pairs, kv_read, chunk_context, scheduled,
                                        traffic_s, self.ahead_s, prompt_on_busiest, sequences)
        compute_ns = round(compute_s * 1e9) + side_ns
        draft_ns = 0
        if self._draft_s is not None:
            draft_ns = round(self._draft_s(num_tokens, drafting, attn_pairs, kv_read, chunk_context) * 1e9)
        traffic_ns = round(traffic_s * 1e9)
        gpu_end = self.now + compute_ns + draft_ns + traffic_ns
        if self.pipeline is not None:  # (the drafter on the last stage alone: engine/pipeline.py)
            gpu_end = self.pipeline.run(self.now, compute_ns + traffic_ns, draft_ns)
        compute_ns = gpu_end - self.now - traffic_ns
        at_front = self.at_front  # (empty without a front end)
        if at_front and at_front[0] >> _ID_BITS <= gpu_end:
            self._through_front(gpu_end)
        return compute_ns, traffic_ns, gpu_end

    def _end_step(self, end_ns: int, gpu_ns: int, num_tokens: int, logits: int, scheduled: bool,
                  sequences: int | None) -> None:
        """The step just run, of `gpu_ns` on the GPU, ends at `end_ns`: the next step's batch was formed as it
        began (overlapped), and its host is ahead by what the GPU took beyond its own work."""
        self.formed_ns = self.now
        if self._host_busy_s is not None:
            ahead_s = gpu_ns / 1e9 - self._host_busy_s(num_tokens, logits, scheduled, sequences)
            self.ahead_s = ahead_s if ahead_s > 0.0 else 0.0
        self.now = end_ns

    def _apply(self, s: int, d: int, decode: int, completing: list[tuple[int, int]],
               finishing: Sequence[int]) -> list[int]:
        """Advance the decoding sequences a token (speculating, the step's advance), retire the finished, and
        start decoding the sequences that finished their prompt. Returns the requests that finished."""
        if decode or not self.pauses:
            advance = self.advance
            self.decoders.context_sum += decode * advance - self.shortfall
            self.tick = d + advance
            if self.ticks_apart:
                if advance == 1:
                    self._tick_buffer.append(s)
                else:
                    self._tick_buffer.extend([s] * advance)
        release = self._finish_unseen if self.finish_lag else self._release
        held = self.held
        if held is not None and finishing:
            self.finish_blocks = {i: held.held(i) for i in finishing}
        finished = (self.decoders.finish(d, finishing, self.window_left > 0,
                                         release if held is None else self._release_holding)
                    if finishing or self.window > 1 else [])
        for i, context in completing:
            self._first_buffer.extend((i, s, 1))
            self.generated[i] += 1
            blocks = None if held is None else self.completing_blocks.pop(i)
            if self.generated[i] == self.out[i]:
                release(i, context, blocks)
                finished.append(i)
            else:
                self._start_decoding(i, self.tick, context)
                if held is not None:
                    held.enter(i, blocks)
        if held is not None:
            held.stepped(d)
        if self.unseen and not (self.waiting or self.decoding or self.prefills):
            self._nothing_left()
        if len(self._step_buffer) >= self._flush_values:
            self.rows.flush()
        return finished

    # -- bookkeeping -------------------------------------------------------------------------------

    def _release(self, i: int, context: int, blocks: int | None = None) -> None:
        """A finished request gives back its KV blocks (those of `context` tokens unless given) and,
        reserving, its reservation. Named segments of its answer become cached (prefixes.py)."""
        if blocks is None:
            blocks = -(-context // self.block)
        prefix = self.prefix  # (as _free does, inline: this is the path of every finished request)
        if prefix is not None and context:
            prefix.computed(i, context)
        self.free_blocks += blocks if prefix is None else prefix.release(i, blocks)
        if self.reserve:
            self.unreserved_blocks += self._reservation(i)
        if self.shut_ranks:
            self._reopen(i)
        if self.ranks > 1:
            self.waiting.finished(i)

    def _release_holding(self, i: int, context: int) -> None:
        """A decoding sequence that finished in the step just run, where the engine keeps drafts' slots: it
        gives back its hold (`finish_blocks`), not only its context's blocks."""
        self.held.leave(i)
        (self._finish_unseen if self.finish_lag else self._release)(i, context, self.finish_blocks.pop(i))

    def _finish_unseen(self, i: int, context: int, blocks: int | None = None) -> None:
        """An overlapped scheduler's request that finished in the step just run: released once the next
        batch is formed (`finish_lag`)."""
        self.unseen.append((i, context, blocks))

    def _nothing_left(self) -> None:
        """An overlapped engine whose finished sequences' outputs are not yet taken in has nothing else to run
        (after a step, or an abort between steps): where its profile does, it first runs, as its next step, the
        batch formed for them while the last step ran, if that batch holds only them (no request had reached
        the engine by then: `_run_finished_batch`); then it takes in the outputs before it waits."""
        arrivals = self.arrivals
        if self.runs_finished_batch and (not arrivals or arrivals[0] >> _ID_BITS > self.formed_ns):
            self._run_finished_batch()
        self._release_unseen()

    def _run_finished_batch(self) -> None:
        """An overlapped scheduler left with nothing to run (Profile.runs_finished_batch): the batch it formed
        while the step before ran holds the sequences that finished in that step, since their outputs were
        taken in only after it was launched, and the GPU runs it, one more decode each whose tokens are
        dropped, before anything new starts (SGLang's event_loop_overlap launches batch N+1 before it
        processes batch N's results, and receives new requests only once it has waited for N+1's). The next
        batch is formed from the requests that had reached the engine when this one began (`formed_ns`,
        _take_arrivals); no request is charged for it."""
        width, finished = self.width, len(self.unseen)
        num_tokens = finished * width
        attn_pairs, kv_read = self._decode_attention(sum(c for _, c, _ in self.unseen), finished)
        sequences = None if width == 1 else finished
        compute_ns, traffic_ns, gpu_end = self._gpu_work(num_tokens, num_tokens, attn_pairs, kv_read, 0, True, None,
                                                         sequences, finished, 0)
        self._record(self.num_steps, compute_ns, traffic_ns, 0, gpu_end, num_tokens, finished, attn_pairs, kv_read, 0,
                     num_tokens, 0, 0, True)
        if not self.ticks_apart:  # (a tick is a step: the clock keeps to the steps' count)
            self.tick += 1
        if self.ratio is not None:
            self.ratio.decoded()
        # (no token of it leaves: a live caller's emitters stay those of the step it ran after)
        self._end_step(gpu_end, compute_ns + traffic_ns, num_tokens, num_tokens, True, sequences)

    def _release_unseen(self) -> None:
        unseen, self.unseen = self.unseen, []
        for i, context, blocks in unseen:
            self._release(i, context, blocks)

    def _free(self, i: int, blocks: int, kept_tokens: int = 0) -> None:
        """Request i, preempted, gives back its `blocks` KV blocks; with prefix caching its shared ones, and
        its first `kept_tokens`, stay cached until evicted (they still count as free: they can be taken).
        The cache is made, if need be, at the first preemption of a profile that keeps what it computed."""
        if self.keeps is not None and self.prefix is None:
            self.prefix = PrefixCache(self.block, self.free_blocks)
        self.free_blocks += blocks if self.prefix is None else self.prefix.release(i, blocks, kept_tokens)

    def _end_window(self) -> None:
        """Multi-step: every sequence of the open window was aborted. The window ends now, so that the next
        batch is formed at once rather than after empty steps; its tokens so far, all the aborted requests',
        leave with nobody."""
        self.window_left = 0
        self.window_host.drop()
        self.rows.drop_window()

    def _host_window(self, gpu_end_ns: int, logits: int, events: int) -> tuple[int, int, int, int]:
        """Multi-step: the window's tokens leave when it ends, less the dropped ones of sequences already done."""
        return self.window_host.step(gpu_end_ns, logits - len(self.decoders.zombies), events, not self.window_left)
