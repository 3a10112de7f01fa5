"""A straightforward, vectorized-per-step implementation of the engine, kept as a test oracle.

tokenpath.engine.replica computes the same thing with O(1) work per step; tests check the two
agree exactly. This one recomputes every running sequence every step, which is easy to read.
engine/profiles.py describes the scheduler profiles; here each is written out plainly, its rules in
RULES (adding a profile there means adding its rules here, which the tests check):

- vllm-v1 and trtllm (`step_mixed`): running sequences first, in admission order, each taking the
  tokens it still needs (one to decode, the rest of its prompt when prefilling) from the step's token
  budget; then waiting sequences, first come first served, while the step has room (sequences,
  tokens, KV-cache blocks). A prompt longer than the remaining budget is prefilled in chunks across
  steps (trtllm: a cut chunk is rounded down to whole blocks). When a growing sequence finds no free
  KV block, the most recently admitted running sequences are preempted and will be recomputed: they
  lose their cache and go back to the front of the queue (under prefill-first, as SGLang, its back, the newest
  first), keeping the tokens already sent. Reserving
  (trtllm), a request is admitted only if its whole KV cache fits in the blocks no running request
  has reserved.
- prefill-first (`step_prefill_first`): a step prefills (the prompt in progress, then waiting
  prompts) while decoding sequences pause, when that can run; otherwise every decoding sequence
  decodes, for one step or, with multi-step scheduling, for a window of k steps with a fixed batch
  (sequences done mid-window are computed to its end, and the window's tokens leave at its end; only
  the window's first step calls the scheduler, and its cost says so).
  With mixed chunks the batch is formed as vllm-v1's.
- vllm-v0: prefill-first's batches without chunked prefill, vllm-v1's with it.

Prefix caching (`_PlainPrefixCache`) keeps every free block as one queue item; a request that
finishes caches the named segments its computed tokens cover (a session turn's answer), and a
session's next turn is sent its think time after the turn before finishes at the client.

With the host overlapped (SGLang, TensorRT-LLM), a busy engine's batch is formed when the step before
it starts, so it takes only the requests that had arrived by then; an idle engine takes a request as
soon as it arrives.

A step lasts its compute time plus its non-overlapped traffic time, then whatever the host blocks it
for (copying the sampled ids, and detokenizing when that runs inline). Time is integer nanoseconds,
so each request's time splits exactly into waiting, compute, traffic and delivery.

Speculative decoding (`costs.speculation`: k drafts a sequence, engine/speculative.py): every step
in which some sequence decodes first draws `advance`, 1 to k + 1, from one stream per replica (even
a prefill step in which the decoding sequences pause uses up its draw). A decoding sequence taking
part runs k + 1 query tokens (of the token budget, the attention and the LM head), takes KV blocks
for `advance` more tokens, and gains `advance` tokens, or the fewer it still has to make; one that
finishes short gives back, after the step, the blocks of the tokens it did not make. Its tokens
leave in one event, and it is charged for the step once. The drafter's time, `costs.draft_s` of the
step's shape, adds to the step's compute.

Most steps of a busy engine only decode: every running sequence adds one token and nothing else
changes until a sequence finishes, a request arrives or the cache runs short (a queue whose head
waits for blocks waits through it). Such stretches are advanced step by step with scalar arithmetic
only (`_Replica.decode_run`), which gives the same result as the general step at a fraction of its
cost (tests/test_engine.py checks that it does).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.lastmile import closes_event
from tokenpath.engine.loop import EngineTrace
from tokenpath.engine.new_token_ratio import CLIP_MAX_NEW_TOKENS_ESTIMATION, NewTokenRatio, new_request_tokens
from tokenpath.engine.protocols import Host, StepCosts
from tokenpath.engine.release import release_at_least
from tokenpath.engine.spec import EngineSpec


@dataclass(frozen=True)
class Hold:
    """A decoding sequence's block table, where it keeps its drafts' slots: it reaches `lookahead` past its base
    and, where it counts the tokens it schedules (vLLM's allocate_slots), those of the step too. The base is its
    context, or lagged (overlapped host), where it ran in the step before, that step's context and, counting them,
    the tokens it scheduled there. A running prompt's chunk reaches `chunk_lookahead` past its tokens."""

    counts_scheduled: bool
    lookahead: int
    chunk_lookahead: int


def _vllm_hold(method: str, drafts: int, lagged: bool) -> Hold:
    lookahead = drafts if method in ("eagle", "eagle3", "mtp", "draft_model") else 0
    return Hold(counts_scheduled=True, lookahead=lookahead, chunk_lookahead=lookahead)


def _sglang_hold(method: str, drafts: int, lagged: bool) -> Hold | None:
    """SGLang's speculative V2 worker (overlapped, not n-gram): committed tokens plus 2 (k + 1)."""
    return Hold(counts_scheduled=False, lookahead=2 * (drafts + 1), chunk_lookahead=0) \
        if lagged and method != "ngram" else None


@dataclass(frozen=True)
class Rules:
    """A profile's rules as this engine applies them, stated here rather than read from
    engine/profiles.py, so that the tests compare two statements of each profile."""

    prefills_alone: Callable[[EngineSpec], bool]  # prompts in steps of their own, the decodes paused
    chunk_in_blocks: bool  # a cut prompt chunk is whole KV blocks
    headroom: bool         # admission keeps SGLang's new_token_ratio of the outputs to come
    overlapped: bool       # the host prepares a step while the GPU runs the one before, unless told
    # With prefix caching, a preempted sequence leaves cached all it computed ("computed"), the tokens
    # of its last prefill or the chunks of its prompt so far ("prefilled"), or nothing (None).
    keeps: str | None
    requeue_back: bool = False  # a preempted request waits behind the others (SGLang), not ahead of them
    # Without chunked prefill, a prompt after the step's first is admitted only below the budget left
    # (SGLang: `input_tokens >= rem_input_tokens` stops its PrefillAdder), not up to it.
    below_budget: bool = False
    fewest_outputs_first: bool = False  # preempt the decoding sequence with the fewest tokens made (SGLang)
    # Once a waiting request finds no room in the KV cache (its headroom included), admit none until a running
    # sequence leaves (finished, aborted or preempted), rather than trying every step (SGLang's batch_is_full).
    waits_for_a_leave: bool = False
    # Speculating with a drafter named in the engine's table, where a running sequence's block table keeps every
    # slot it reached until the sequence leaves: what it reaches (`Hold`), for the method, its drafts and
    # whether the host is overlapped; None (or a rule that gives None): the slots of rejected drafts are given
    # back after each step.
    hold: Callable[[str, int, bool], Hold | None] | None = None
    # Decoding sequences whose query tokens pass the token budget, in running order: "run" all the same; the
    # first that does not fit and those after "wait" a step (TensorRT-LLM's micro-batch scheduler); or that first
    # one runs the budget left, its drafts trimmed, and those after wait ("trim": vLLM V1's scheduler).
    past_budget: str = "run"
    # Overlapped, an engine left with nothing else to run first runs the batch it formed while the last step ran,
    # which still decodes the sequences that step finished (SGLang's event_loop_overlap before 0.5.22), rather
    # than leaving them out of it: up to this release (exclusive; None: never)
    runs_finished_until: str | None = None
    # From this release ("0": every one; None: none) a waiting prompt is admitted only while the free blocks
    # hold the whole of it, not only the chunk it runs first (vLLM V1's scheduler_reserve_full_isl from 0.19.0;
    # vLLM V0's block manager, which sizes the whole prompt).
    whole_prompt_since: str | None = None


RULES = {
    "vllm-v1": Rules(prefills_alone=lambda spec: False, chunk_in_blocks=False, headroom=False, overlapped=False,
                     keeps="computed", hold=_vllm_hold, past_budget="trim", whole_prompt_since="0.19.0"),
    "vllm-v0": Rules(prefills_alone=lambda spec: not spec.chunked_prefill, chunk_in_blocks=False, headroom=False,
                     overlapped=False, keeps="computed", whole_prompt_since="0"),
    "prefill-first": Rules(prefills_alone=lambda spec: not spec.mixed_chunk, chunk_in_blocks=False, headroom=True,
                           overlapped=True, keeps="prefilled", requeue_back=True, below_budget=True,
                           fewest_outputs_first=True, waits_for_a_leave=True, hold=_sglang_hold,
                           runs_finished_until="0.5.22"),
    "trtllm": Rules(prefills_alone=lambda spec: False, chunk_in_blocks=True, headroom=False, overlapped=True,
                    keeps=None, past_budget="wait"),
}


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _PlainPrefixCache:
    """Prefix caching written out block by block (engine/prefix_cache.py has the rules): every free
    block is one item of `queue`, head first, labelled with the cached segment it holds (None: none);
    taking a block pops the head at once, and a cached segment whose block is taken is forgotten, its
    other blocks left as plain ones; a preempted request's run is cut to the blocks still queued."""

    def __init__(self, block: int, free_blocks: int) -> None:
        self.block = block
        self.queue: deque = deque([None] * free_blocks)
        self.entries: dict[int, list[int]] = {}  # key -> [blocks, references]
        self.segments: dict[int, tuple[list[int], list[int]]] = {}  # request -> (keys, end block of each)
        self.held: dict[int, list[int]] = {}
        self.cached_upto: dict[int, int] = {}  # request -> segments of its prefix it has walked through
        self.hit_tokens: dict[int, int] = {}
        self.cut: dict[int, int] = {}  # request -> blocks of its last held segment past its hit (computed again)
        # A preempted request's kept blocks past its prefix segments: request -> (first, end block, label)
        self.runs: dict[int, tuple[int, int, tuple]] = {}
        self.serial = 0

    def lookup(self, i: int, target: int) -> tuple[int, int, int]:
        keys, ends = self.segments[i]
        cap = (target - 1) // self.block
        found = 0
        while found < len(keys) and keys[found] in self.entries and ends[found] <= cap:
            found += 1
        hit = ends[found - 1] if found else 0
        cut = found < len(keys) and keys[found] in self.entries and hit < cap  # the last token's segment
        if cut:
            found, hit = found + 1, cap
        queued = sum(self.entries[k][0] for k in keys[:found] if self.entries[k][1] == 0)
        if not cut and self._run_found(i, found):
            queued += self.runs[i][1] - hit
            hit = self.runs[i][1]
        return found, hit, queued

    def _run_found(self, i: int, found: int) -> bool:
        """Request i's kept run follows the prefix segments found, every one of them."""
        keys, ends = self.segments[i]
        return i in self.runs and found == len(keys) and self.runs[i][0] == (ends[-1] if ends else 0)

    def acquire(self, i: int, found: int, hit: int) -> None:
        keys = self.segments[i][0][:found]
        ends = self.segments[i][1]
        segments_hit = min(hit, ends[found - 1]) if found else 0
        self.cut[i] = (ends[found - 1] if found else 0) - segments_hit  # a cut segment's blocks it recomputes
        for key in keys:
            if self.entries[key][1] == 0:
                self.queue = deque(label for label in self.queue if label != key)
            self.entries[key][1] += 1
        if i in self.runs:  # taken back as its own blocks if found, else left as plain free blocks
            label = self.runs[i][2]
            found_run = not self.cut[i] and self._run_found(i, found)
            self.queue = deque(other for other in self.queue if other != label) if found_run else deque(
                None if other == label else other for other in self.queue)
            del self.entries[label], self.runs[i]
        self.held[i] = list(keys)
        self.cached_upto[i] = found
        if i not in self.hit_tokens:
            self.hit_tokens[i] = segments_hit * self.block

    def take(self, blocks: int) -> None:
        for _ in range(blocks):
            label = self.queue.popleft()
            if isinstance(label, tuple):  # a preempted request's run loses its last block
                start, end, _ = self.runs[label[1]]
                self.entries[label][0] -= 1
                self.runs[label[1]] = (start, end - 1, label)
                if end - 1 == start:
                    del self.entries[label], self.runs[label[1]]
            elif label is not None:
                del self.entries[label]
                self.queue = deque(None if other == label else other for other in self.queue)

    def computed(self, i: int, tokens: int) -> None:
        if i not in self.cached_upto:
            return
        keys, ends = self.segments[i]
        k = self.cached_upto[i]
        while k < len(keys) and ends[k] <= tokens // self.block:
            if keys[k] not in self.entries:
                self.entries[keys[k]] = [ends[k] - (ends[k - 1] if k else 0), 1]
                self.held[i].append(keys[k])
            k += 1
        self.cached_upto[i] = k

    def give(self, i: int, blocks: int, kept_tokens: int = 0) -> None:
        held = self.held.pop(i, [])
        self.cached_upto.pop(i, None)
        cut = self.cut.pop(i, 0)
        run = 0
        if kept_tokens:
            ends = self.segments.setdefault(i, ([], []))[1]
            start = ends[-1] if ends else 0
            run = max(kept_tokens // self.block - start, 0)
        self.queue.extend([None] * (blocks - (sum(self.entries[k][0] for k in held) - cut) - run))
        if run:
            label = ("run", i, self.serial)
            self.serial += 1
            self.entries[label] = [run, 0]
            self.runs[i] = (start, start + run, label)
            self.queue.extend([label] * run)
        for key in reversed(held):
            self.entries[key][1] -= 1
            if self.entries[key][1] == 0:
                self.queue.extend([key] * self.entries[key][0])


class _Running:
    """The running sequences, in admission order: one int64 row per field, one column per sequence.

    Kept as one aligned block (rather than gathered from per-request arrays every step) because the
    engine touches every running sequence every step; columns leave only when sequences finish or are
    preempted. Fields are read and updated in place through their row views.
    """

    FIELDS = ("ids", "target", "computed", "blocks", "left", "sent", "compute", "traffic", "delivery",
              "decoding", "reserved", "decoded_from", "ran")

    def __init__(self) -> None:
        self._set(np.empty((len(self.FIELDS), 0), np.int64))

    def _set(self, state: np.ndarray) -> None:
        self.state = state
        (self.ids, self.target, self.computed, self.blocks, self.left, self.sent,
         self.compute, self.traffic, self.delivery, self.decoding, self.reserved, self.decoded_from, self.ran) = state

    def __len__(self) -> int:
        return self.state.shape[1]

    def append(self, columns: list[tuple[int, ...]]) -> None:
        """Add sequences, each a tuple of FIELDS values."""
        self._set(np.concatenate([self.state, np.array(columns, np.int64).T], axis=1))

    def keep(self, mask: np.ndarray) -> None:
        self._set(self.state[:, mask])


def reference_engine(
    scheduled_ns: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    costs: StepCosts,
    host: Host,
    spec: EngineSpec,
    kv_capacity_tokens: int,
    max_concurrency: int | None = None,
    progress: Callable[[int], None] | None = None,
    cached_tokens: np.ndarray | None = None,
    aborts: dict[int, list[int]] | None = None,
    abort_results: list[bool] | None = None,
    prefixes=None,
    think_ns: np.ndarray | None = None,
) -> EngineTrace:
    """Simulate one engine replica serving the given requests (rows sorted by scheduled time); the KV
    of each request's first `cached_tokens` prompt tokens comes with it. `aborts` (open loop only):
    step -> requests ended just before that step, keeping the tokens they have (see `_Replica.abort`);
    what each abort returned is appended to `abort_results`. `think_ns` (multi-turn sessions, no
    concurrency cap): a row with a value >= 0 is sent that long after the row before it finishes at
    the client."""
    if aborts and max_concurrency is not None:
        raise ValueError("aborts are defined for an open loop only")
    if think_ns is not None and max_concurrency is not None:
        raise ValueError("sessions are closed loops of their own: no concurrency cap")
    replica = _Replica(scheduled_ns, input_tokens, output_tokens, costs, host, spec, kv_capacity_tokens,
                       max_concurrency, progress, think_ns)
    if cached_tokens is not None:
        replica.cached[:] = cached_tokens
    replica.aborts = {step: list(requests) for step, requests in (aborts or {}).items()}
    keeps = spec.prefix_caching and RULES[spec.scheduler].keeps is not None
    if keeps or (prefixes is not None and spec.prefix_caching and (prefixes.offsets[-1] > 0)):
        replica.prefix = _PlainPrefixCache(spec.block_size, replica.free_blocks)
    if replica.prefix is not None and prefixes is not None:
        for i in range(len(prefixes)):
            keys, ends = prefixes.segments(i)
            if keys:
                replica.prefix.segments[i] = (keys, [end // spec.block_size for end in ends])
    trace = replica.run()
    if abort_results is not None:
        abort_results.extend(replica.aborted)
    return trace



class _Replica:
    """The state of one engine replica over a simulation; `run` drives it to the end."""

    def __init__(self, scheduled_ns, input_tokens, output_tokens, costs, host, spec, kv_capacity_tokens,
                 max_concurrency, progress, think_ns=None) -> None:
        n = len(scheduled_ns)
        self.n = n
        self.scheduled_ns = np.asarray(scheduled_ns, dtype=np.int64)
        self.prompt = np.asarray(input_tokens, dtype=np.int64)
        self.out = np.asarray(output_tokens, dtype=np.int64)
        self.costs, self.host, self.spec, self.progress = costs, host, spec, progress
        self.kv_capacity_tokens = kv_capacity_tokens
        self.block = spec.block_size
        self.total_blocks = kv_capacity_tokens // spec.block_size
        self.free_blocks = self.total_blocks
        self.prefix: _PlainPrefixCache | None = None
        rules = RULES[spec.scheduler]
        self.pauses = rules.prefills_alone(spec)
        self.window = spec.num_scheduler_steps
        self.reserve = spec.kv_admission == "reserve"
        self.whole_prompt = rules.whole_prompt_since is not None and release_at_least(spec.version,
                                                                                      rules.whole_prompt_since)
        self.ratio = NewTokenRatio() if rules.headroom else None
        self.preempted_in_step = False
        self.shut = False  # no admissions until a running sequence leaves (Rules.waits_for_a_leave)
        self.chunk_unit = spec.block_size if rules.chunk_in_blocks else 1
        # An overlapped scheduler forms a busy engine's next batch when the step before it starts.
        self.lagged = rules.overlapped if spec.host_overlap is None else spec.host_overlap
        self.formed = 0  # the start of the last step
        # ... and takes in a step's outputs after forming the next batch: a request that finished in the step
        # just run keeps its slot, blocks and reservation while that batch is formed (`unseen`).
        self.finish_lag = self.lagged and self.window == 1
        self.unseen: list[tuple[int, int, int, int]] = []  # (request, computed, blocks, reserved)
        self.runs_finished = self.finish_lag and rules.runs_finished_until is not None and not release_at_least(
            spec.version, rules.runs_finished_until)
        # An overlapped host launches a step's kernels while the GPU runs the step before, once its own work
        # in that step is done: how long before the step starts (0 after an idle wait).
        self.ahead_s = 0.0
        # Speculative decoding: query tokens a decoding sequence runs in a step (its drafts and one
        # more), and the tokens it gains in the step being run, drawn per step.
        speculation = costs.speculation
        if speculation is not None and (self.window > 1 or host.stream_interval > 1):
            raise ValueError("speculative decoding runs with num_scheduler_steps = 1 and stream_interval = 1")
        self.width = 1 if speculation is None else speculation.width
        self.acceptance = None if speculation is None else speculation.draws()
        self.advance = 1
        self.max_seqs = spec.max_num_seqs  # the sequences running at once
        self.past_budget = rules.past_budget
        # Holding drafts' slots (Rules.hold): each decoding sequence's block table reaches past its context, or
        # lagged, where it ran in the step before, past that step's context (`decoded_from`: the context its last
        # decode step started at; `ran`: the tokens it ran in the step before, 0 where it took no part).
        rule = rules.hold
        self.hold = None
        if speculation is not None and spec.speculative is not None and rule is not None:
            self.hold = rule(spec.speculative.method, spec.speculative.num_speculative_tokens, self.lagged)

        # Per-request accounts, kept here while a request is not running (a preempted request keeps
        # the tokens it has sent and the time it has spent).
        self.generated = np.zeros(n, np.int64)
        self.cached = np.zeros(n, np.int64)  # prompt KV that came with the request; lost on preemption
        self.prefilled = np.zeros(n, np.int64)  # the tokens each request's last admission prefills to
        self.acc_compute = np.zeros(n, np.int64)
        self.acc_traffic = np.zeros(n, np.int64)
        self.acc_delivery = np.zeros(n, np.int64)
        self.sent = np.full(n, -1, np.int64)
        self.arrival = np.full(n, -1, np.int64)
        self.last_end = np.zeros(n, np.int64)
        self.last_step = np.full(n, -1, np.int64)  # the step of each request's last token
        self.first_start = np.full(n, -1, np.int64)  # the start of the first step each request was charged for
        self.times_preempted = np.zeros(n, np.int64)

        self.arrivals: list[tuple[int, int]] = []  # heap of (arrival at the engine, request)
        # With a front end that takes time (host.queues_requests), requests reach it first: a heap of
        # (arrival at the server, request), passed on in arrival order between steps.
        self.at_front: list[tuple[int, int]] = []
        self.front_request = np.zeros((n, 2), np.int64)  # each request's (wait, work) at the front end
        self.upload = np.zeros(n, np.int64)
        self.waiting: deque[int] = deque()
        self.running = _Running()
        self.steps: list[tuple[int, ...]] = []
        self.emitted: list[np.ndarray] = []  # per step, the requests that got a token
        self.now = 0
        self.done = 0
        self.preemptions = 0
        self.aborts: dict[int, list[int]] = {}  # step -> requests to abort just before it
        self.aborted: list[bool] = []           # what each abort returned, in order
        # Multi-step: steps left in the current decode window after this one, and the tokens and
        # events of its steps so far (the host takes them when it ends).
        self.window_left = 0
        self.window_tokens = self.window_events = 0
        self.scheduled = True  # whether the step being run called the scheduler

        # Sessions: the think time before each row, -1 for a row sent at its scheduled time.
        self.think_ns = np.full(n, -1, np.int64) if think_ns is None else np.asarray(think_ns, np.int64)
        first_wave = n if max_concurrency is None else min(n, max_concurrency)
        for i in range(first_wave):
            if self.think_ns[i] < 0:
                self.send(i, int(self.scheduled_ns[i]))
        self.next_to_send = first_wave

    def send(self, i: int, at_ns: int) -> None:
        """The client sends request i at `at_ns`; it reaches the server after its upload."""
        upload = self.host.upload_ns(int(self.prompt[i]))
        self.sent[i] = at_ns
        self.arrival[i] = at_ns + upload
        self.acc_delivery[i] += upload
        self.upload[i] = upload
        heapq.heappush(self.at_front if self.host.queues_requests else self.arrivals, (int(self.arrival[i]), i))

    def through_front(self, until_ns: int) -> None:
        """The front end takes the requests that reached the server by `until_ns`, together, in arrival order."""
        arrived = []
        while self.at_front and self.at_front[0][0] <= until_ns:
            arrived.append(heapq.heappop(self.at_front))
        waits = self.host.requests([at_ns for at_ns, _ in arrived], [int(self.prompt[i]) for _, i in arrived])
        for (_, i), (done_ns, wait_ns, work_ns) in zip(arrived, waits):
            self.front_request[i] = wait_ns, work_ns
            self.acc_delivery[i] += wait_ns + work_ns
            self.upload[i] += wait_ns + work_ns
            heapq.heappush(self.arrivals, (done_ns, i))

    def run(self) -> EngineTrace:
        while self.done < self.n:
            # The aborts due before this step, and before any the engine ran without coming back here (an
            # overlapped engine's finished batch, `run_finished`): late, as the harness makes them.
            for step in sorted(step for step in self.aborts if step <= len(self.steps)):
                for i in self.aborts.pop(step):
                    self.aborted.append(self.abort(i))
            if self.done == self.n:
                break
            busy = self.waiting or len(self.running)
            if self.unseen and not busy:
                if self.runs_finished and not (self.arrivals and self.arrivals[0][0] <= self.formed):
                    self.run_finished()
                self.release_unseen()
            if busy:
                formed = self.formed if self.lagged else self.now
                self.through_front(formed)
            else:  # until the first request the front end passes on is known
                while self.at_front and (not self.arrivals or self.at_front[0][0] <= self.arrivals[0][0]):
                    self.through_front(self.at_front[0][0])
                if self.arrivals and self.arrivals[0][0] <= self.formed:
                    formed = self.formed  # it came before the last step began: its batch was formed then
                else:
                    formed, self.ahead_s = self.now, 0.0
            while self.arrivals and self.arrivals[0][0] <= formed:
                self.waiting.append(heapq.heappop(self.arrivals)[1])
            if not self.waiting and len(self.running) == 0:
                if self.ratio is not None:
                    self.ratio.idle()
                self.now = self.arrivals[0][0]
                continue
            if self.acceptance is not None:  # drawn by every step with a decoding sequence
                self.advance = self.acceptance.next() if (self.running.decoding == 1).any() else 1
            self.preempted_in_step = False
            self.scheduled = not self.window_left  # the steps of a window after its first call no scheduler
            if not self.decode_run():
                if self.pauses:
                    self.step_prefill_first()
                else:
                    self.step_mixed()
        if self.unseen and self.runs_finished:  # the batch formed during the last step runs all the same
            self.run_finished()
        return self.trace()

    def abort(self, i: int) -> bool:
        """End request i between steps with the tokens it has: out of the arrivals, the queue or the
        running batch (its KV blocks freed). False if it had already finished (under multi-step, perhaps
        still in its window)."""
        run = self.running
        rows = np.flatnonzero(run.ids == i)
        if len(rows) and run.left[rows[0]] == 0:  # multi-step: it has its last token, and leaves with its window
            return False
        if len(rows):
            self.park(rows)
            self.retire(rows)
            run.keep(run.ids != i)
            if self.window_left and not (self.running.decoding == 1).any():
                # every sequence of the window aborted: it ends, its tokens so far leaving with nobody
                self.window_left = self.window_tokens = self.window_events = 0
        elif i in self.waiting:
            self.waiting.remove(i)
        elif any(r == i for _, r in self.arrivals):
            self.arrivals = [(t, r) for t, r in self.arrivals if r != i]
            heapq.heapify(self.arrivals)
        elif any(r == i for _, r in self.at_front):
            self.at_front = [(t, r) for t, r in self.at_front if r != i]
            heapq.heapify(self.at_front)
        else:
            return False
        self.out[i] = self.generated[i]
        self.done += 1
        return True

    def take(self, blocks: int) -> None:
        self.free_blocks -= blocks
        if self.prefix is not None:
            self.prefix.take(blocks)

    def give_back(self, blocks: int) -> None:
        """Blocks that no request holds any more go to the tail of the free queue, as plain blocks."""
        self.free_blocks += blocks
        if self.prefix is not None:
            self.prefix.queue.extend([None] * blocks)

    def give(self, ids, blocks, kept_tokens: int = 0) -> None:
        """Requests `ids` give back their blocks, in that order (preempted, one request: keeping its
        first `kept_tokens` cached)."""
        for i, b in zip(np.atleast_1d(ids).tolist(), np.atleast_1d(blocks).tolist()):
            if self.prefix is not None:
                self.prefix.give(i, b, kept_tokens)
                self.free_blocks = len(self.prefix.queue)
            else:
                self.free_blocks += b

    def retire(self, rows: np.ndarray) -> None:
        """Running rows leave for good (finished or aborted), in that order: each first caches the
        named segments its computed tokens cover (a session turn's answer: its next turn repeats it),
        then gives back its blocks."""
        run = self.running
        for row in np.atleast_1d(rows).tolist():
            self.leave(int(run.ids[row]), int(run.computed[row]), int(run.blocks[row]))

    def leave(self, i: int, computed: int, blocks: int) -> None:
        if self.prefix is not None:
            self.prefix.computed(i, computed)
        self.give(i, blocks)
        self.shut = False

    def run_finished(self) -> None:
        """An overlapped engine left with nothing to run: the batch it formed while the last step ran holds
        the sequences that finished in that step, and the GPU runs it, one more decode each (`width` query
        tokens), their tokens dropped, before the engine takes anything new."""
        computed = np.array([c for _, c, _, _ in self.unseen], np.int64)
        q = np.full(len(computed), self.width, np.int64)
        num_tokens = int(q.sum())
        if self.ratio is not None:
            self.ratio.decoded()
        self.account(num_tokens, len(q), num_tokens, int(np.dot(q, computed) + np.dot(q, q + 1) // 2),
                     int(computed.sum()) + num_tokens, 0, np.empty(0, np.int64), np.empty(0, np.int64), len(q))

    def release_unseen(self) -> None:
        for i, computed, blocks, _ in self.unseen:
            self.leave(i, computed, blocks)
        self.unseen = []

    def cache_computed(self, rows: np.ndarray) -> None:
        """Prefix caching: running rows that prefill have blocks for `computed + ahead` tokens."""
        if self.prefix is not None:
            for i, tokens in rows:
                self.prefix.computed(int(i), int(tokens))

    # -- the profiles' steps -----------------------------------------------------------------------

    def step_mixed(self) -> None:
        """vllm-v1 and trtllm: the running sequences take what they need from the budget, in order;
        waiting ones join unless the step preempted or a prompt is still in progress."""
        run = self.running
        budget = self.spec.max_num_batched_tokens
        need = run.target - run.computed
        # What each takes of the budget: a prompt what it needs, a decoding sequence its one token or,
        # under speculative decoding, its `width` query tokens (`query`); past the budget (Rules.past_budget)
        # every decoding sequence all the same, or the first that does not fit its drafts trimmed to the rest or
        # none, and those after none.
        speculating = self.acceptance is not None
        decoding = run.decoding == 1 if speculating else None
        cost = np.where(decoding, self.width, need) if speculating else need
        query = np.where(decoding, self.width, 0) if speculating else None
        if int(cost.sum()) <= budget:
            num = need.copy()
        else:
            left = budget - (np.cumsum(cost) - cost)  # what each row finds left of the budget
            num = np.minimum(np.maximum(left, 0), need)
            cut = num < need
            num[cut] -= num[cut] % self.chunk_unit
            if speculating and self.past_budget == "run":
                num[decoding] = need[decoding]
            elif speculating:
                fits = np.clip(left, 0, self.width) if self.past_budget == "trim" else \
                    np.where(left >= self.width, self.width, 0)
                query = np.where(decoding, fits, 0)
                num[decoding] = np.where(query > 0, need, 0)[decoding]
        partial = bool((num < need).any())
        # KV blocks: a decoding sequence's for the `advance` tokens it may gain, a prompt's for its chunk.
        ahead = np.where(decoding, np.minimum(self.advance, query), num) if speculating else num
        preempted = self.grow(ahead, None if self.hold is None else self.reach(num, query))
        num = num[:len(self.running)]
        query = None if query is None else query[:len(self.running)]
        if self.waiting and not preempted and not partial:
            used = int(np.where(decoding[:len(num)], query, num).sum()) if speculating else int(num.sum())
            admitted = self.admit_waiting(budget - used, self.max_seqs - len(self.running) - len(self.unseen))
            num = np.concatenate([num, np.array(admitted, np.int64)])
            query = None if query is None else np.concatenate([query, np.zeros(len(admitted), np.int64)])
        self.run_batch(num, query)

    def step_prefill_first(self) -> None:
        """prefill-first: a prefill step when the prompt in progress fits, or else when waiting prompts
        can be admitted; otherwise a decode window. Decoding sequences pause in prefill steps."""
        run, spec = self.running, self.spec
        if self.window_left:
            self.window_left -= 1
            self.run_batch(run.decoding.copy())
            return
        budget = spec.max_num_batched_tokens
        room = self.max_seqs - len(run) - len(self.unseen)
        prefilling = run.decoding == 0
        num = np.zeros(len(run), np.int64)
        if prefilling.any():
            need = np.where(prefilling, run.target - run.computed, 0)
            num = np.minimum(np.maximum(budget - (np.cumsum(need) - need), 0), need)
            # (a decoding row keeps its blocks: holding drafts' slots, more than its context's)
            grown = np.where(prefilling, (run.computed + num + self.block - 1) // self.block, run.blocks)
            if int((grown - run.blocks).sum()) <= self.free_blocks:
                self.take(int((grown - run.blocks).sum()))
                run.blocks[:] = grown
                self.cache_computed(zip(run.ids[prefilling], (run.computed + num)[prefilling]))
                if self.waiting and (num == need).all():
                    admitted = self.admit_waiting(budget - int(num.sum()), room)
                    num = np.concatenate([num, np.array(admitted, np.int64)])
                self.run_batch(num)
                return
        elif self.waiting:
            admitted = self.admit_waiting(budget, room)
            if admitted:
                self.run_batch(np.concatenate([num, np.array(admitted, np.int64)]))
                return
        # A decode window: every decoding sequence, with the blocks for all its steps (speculative
        # decoding: for the tokens its one step may gain; holding drafts' slots, for its hold).
        ahead = run.decoding * (self.window * self.advance)
        no_prompt = np.zeros(len(run), np.int64)
        self.grow(ahead, None if self.hold is None else self.reach(no_prompt, run.decoding * self.width))
        run = self.running
        self.window_left = self.window - 1 if run.decoding.any() else 0
        self.run_batch(run.decoding.copy())

    # -- KV blocks and admission -------------------------------------------------------------------

    def park(self, rows: np.ndarray) -> None:
        """Write running rows' accounts back to the per-request arrays."""
        run = self.running
        ids = run.ids[rows]
        self.generated[ids] = self.out[ids] - run.left[rows]
        self.acc_compute[ids] = run.compute[rows]
        self.acc_traffic[ids] = run.traffic[rows]
        self.acc_delivery[ids] = run.delivery[rows]

    def reach(self, num: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Holding drafts' slots: where each running row's block table reaches in this step: a decoding row that
        runs `query` tokens its hold (one that does not run, where it was), a prompt's chunk and the chunk
        lookahead (a prompt not run this step, where it was)."""
        run, hold = self.running, self.hold
        decoding, runs = run.decoding == 1, query > 0
        lagged = decoding & (run.ran > 0) if self.lagged else np.zeros(len(run), bool)
        base = np.where(lagged, run.decoded_from, run.computed)
        if hold.counts_scheduled:
            base = base + np.where(lagged, run.ran, 0) + query
        prompt = np.where(num > 0, run.computed + num + hold.chunk_lookahead, 0)
        return np.where(decoding, np.where(runs, base + hold.lookahead, 0), prompt)

    def grow(self, ahead: np.ndarray, reach: np.ndarray | None = None) -> bool:
        """Give each running sequence the KV blocks for `ahead` more tokens in its cache (`reach`: for that
        many tokens in all, where more); when they do not fit, preempt from the tail first. Returns whether
        it preempted."""
        run, block = self.running, self.block
        grown = (run.computed + ahead + (block - 1)) // block
        if reach is not None:
            grown = np.maximum(np.maximum(grown, (reach + (block - 1)) // block), run.blocks)
        extra = grown - run.blocks
        preempting = int(extra.sum()) > self.free_blocks
        if preempting:
            # Preempt from the tail (SGLang: its decoding sequences by the fewest tokens made, then the
            # longest prompt, then the newest), one sequence at a time, until the growth of those left fits
            # in the free blocks. Each gives back what it frees: with prefix caching, not the shared
            # blocks a sequence left running still references. The preempted lose their cache and
            # wait at the front (SGLang: the back).
            alive = np.ones(len(run), bool)
            victims: list[int] = []
            while int(extra[alive].sum()) > self.free_blocks:
                row = self.next_victim(alive)
                alive[row] = False
                victims.append(row)
                self.give(run.ids[row], run.blocks[row], self.kept_tokens(row))
            rows = np.array(victims, np.int64)
            self.shut = False
            self.park(rows)
            self.cached[run.ids[rows]] = 0
            preempted = run.ids[rows].tolist()  # in the order preempted: the newest first
            if RULES[self.spec.scheduler].requeue_back:
                self.waiting.extend(preempted)
            else:
                self.waiting.extendleft(preempted)
            self.preemptions += len(victims)
            self.times_preempted[run.ids[rows]] += 1
            run.keep(alive)
            grown, extra, ahead = grown[alive], extra[alive], ahead[:len(alive)][alive]
            self.preempted_in_step = True
            if self.ratio is not None:
                rows = run.decoding == 1
                out = self.out[run.ids[rows]]
                self.ratio.retracted(int((out - run.left[rows]).sum()), int(out.sum()), int(rows.sum()))
        run.blocks[:] = grown
        self.take(int(extra.sum()))
        prefilling = run.decoding == 0
        self.cache_computed(zip(run.ids[prefilling], (run.computed + ahead[:len(run)])[prefilling]))
        return preempting

    def next_victim(self, alive: np.ndarray) -> int:
        """The running row preempted next of those `alive`: the newest, but a prompt in progress first and,
        under prefill-first (SGLang's retract_decode), the decoding row that has made the fewest tokens,
        then the one of the longest prompt, then the newest."""
        run = self.running
        rows = np.flatnonzero(alive)
        if not RULES[self.spec.scheduler].fewest_outputs_first or (run.decoding[rows] == 0).any():
            return int(rows[-1])  # (a prompt in progress is the newest)
        made = self.out[run.ids[rows]] - run.left[rows]
        order = np.lexsort((-rows, -self.prompt[run.ids[rows]], made))  # the last key sorts first
        return int(rows[order[0]])

    def kept_tokens(self, row: int) -> int:
        """What running row `row`, preempted, leaves cached: all it computed, or the tokens of its last
        prefill (a prompt in progress: what it computed), or none."""
        keeps, run = RULES[self.spec.scheduler].keeps if self.spec.prefix_caching else None, self.running
        if keeps == "computed" or (keeps == "prefilled" and run.decoding[row] == 0):
            return int(run.computed[row])
        return int(self.prefilled[run.ids[row]]) if keeps == "prefilled" else 0

    def reservation(self, i: int) -> int:
        """Reserving, the blocks request i holds from admission: its prompt, its output and, speculating, the
        drafts a verify step runs past them."""
        return -(-int(self.prompt[i] + self.out[i] + self.width - 1) // self.block)

    def admit_waiting(self, budget: int, room: int) -> list[int]:
        """Admit waiting sequences first come first served while the step has room; their token counts."""
        spec, block = self.spec, self.block
        admitted: list[tuple[int, ...]] = []
        admitted_num: list[int] = []
        unreserved = self.total_blocks - int(self.running.reserved.sum()) - sum(held for *_, held in self.unseen)
        if self.ratio is not None:
            # each running request's outputs to come, clipped as SGLang's PrefillAdder clips them
            to_come = int(np.minimum(self.running.left, CLIP_MAX_NEW_TOKENS_ESTIMATION).sum())
            spare = self.ratio.spare_tokens(self.free_blocks * block, to_come)
        waits = RULES[spec.scheduler].waits_for_a_leave
        while self.waiting and len(admitted_num) < room and budget > 0 and not self.shut:
            i = self.waiting[0]
            target = int(self.prompt[i] + self.generated[i])
            cached = int(self.cached[i])  # the KV that came with the request, or the prefix cache's
            queued = hit_blocks = 0
            if self.prefix is not None and i in self.prefix.segments:
                found, hit_blocks, queued = self.prefix.lookup(i, target)
                cached = max(cached, hit_blocks * block)  # (a decode replica's request brings its prompt's KV)
            need = num = target - cached
            if (need == budget and admitted_num and not spec.chunked_prefill
                    and RULES[spec.scheduler].below_budget):
                break
            if need > budget:
                if not spec.chunked_prefill:
                    break
                num = budget // self.chunk_unit * self.chunk_unit
                if num == 0:
                    break
            blocks = -(-(cached + num) // block)
            free_for = -(-target // block) if self.whole_prompt else blocks  # the blocks that must be free
            if self.ratio is not None:
                estimate = new_request_tokens(need, int(self.out[i] - self.generated[i]), self.total_blocks * block)
                if estimate >= spare:
                    self.shut = waits and bool(len(self.running) or admitted_num)
                    break
                spare -= estimate
            reserved = self.reservation(i) if self.reserve else 0
            if reserved > unreserved or (not self.reserve and free_for - hit_blocks + queued > self.free_blocks):
                self.shut = waits and not self.reserve and bool(len(self.running) or admitted_num)
                break
            self.waiting.popleft()
            self.prefilled[i] = target
            if self.prefix is not None and i in self.prefix.segments:
                self.prefix.acquire(i, found, hit_blocks)
                self.free_blocks -= queued
                self.cached[i] = cached
            self.take(blocks - hit_blocks)
            if self.prefix is not None:
                self.prefix.computed(i, cached + num)
            unreserved -= reserved
            budget -= num
            admitted.append((i, target, cached, blocks, int(self.out[i] - self.generated[i]), int(self.sent[i]),
                             int(self.acc_compute[i]), int(self.acc_traffic[i]), int(self.acc_delivery[i]),
                             0, reserved, -1, 0))
            admitted_num.append(num)
            if num < need:
                break
        if admitted_num:
            self.running.append(admitted)
        return admitted_num

    # -- one step of a given batch -----------------------------------------------------------------

    def run_batch(self, num: np.ndarray, verify: np.ndarray | None = None) -> None:
        """Run the running sequences for `num` tokens each (0: not in this step). Decoding sequences and
        prompts that complete sample a token; one that already has all its tokens (mid-window) is
        computed but sends nothing and is not accounted. Under speculative decoding a decoding sequence
        runs `width` query tokens instead of its one (`verify`, where given: its own, trimmed to the budget)
        and gains `advance` tokens, or the fewer its query tokens or the tokens it has left make."""
        if self.unseen:  # the batch is formed: the outputs are taken in
            self.release_unseen()
            if not num.any():  # nothing to run without them: it takes them in, then forms the batch
                self.formed, self.ahead_s = self.now, 0.0
                self.through_front(self.now)
                while self.arrivals and self.arrivals[0][0] <= self.now:
                    self.waiting.append(heapq.heappop(self.arrivals)[1])
                (self.step_prefill_first if self.pauses else self.step_mixed)()
                return
        run = self.running
        part = num > 0
        if self.ratio is not None and part.any() and (run.decoding[part] == 1).all() and not self.preempted_in_step:
            self.ratio.decoded()
        decoding = run.decoding == 1
        samples = part & (decoding | (run.computed + num == run.target))
        done = run.left == 0
        emits = samples & ~done
        charged = part & ~done
        sampling = int(samples.sum())
        # Per sequence: the tokens it runs, adds to its cache and samples, and the LM head's rows.
        query, grown, gained, num_logits = num, num, emits, sampling
        emitters = run.ids[emits]  # the request of each token sampled, and its place in the output
        token_index = self.out[emitters] - run.left[emits]
        if self.acceptance is not None:
            decoders = part & decoding
            verify = np.full(len(run), self.width, np.int64) if verify is None else verify
            query = np.where(decoders, verify, num)
            grown = np.where(decoders, np.minimum(np.minimum(self.advance, verify), run.left), num)
            gained = np.where(decoders, grown, emits)
            num_logits += int((verify - 1)[decoders].sum())  # a row for each query token of a decode
            emitters = np.repeat(run.ids, gained)
            token_index = (np.repeat(self.out[run.ids] - run.left, gained)
                           + np.arange(len(emitters)) - np.repeat(np.cumsum(gained) - gained, gained))
        if self.hold is not None:  # where each decoding row's step started, and the tokens it ran (0: none)
            run.decoded_from[decoders] = run.computed[decoders]
            run.ran[decoding] = np.where(decoders, query, 0)[decoding]
        q, p = query[part], run.computed[part]
        num_tokens = int(q.sum())
        attn_pairs = int(np.dot(q, p) + np.dot(q, q + 1) // 2)
        kv_read = int(p.sum()) + num_tokens
        chunk_context = int(p[~decoding[part]].sum())  # prompt chunks' cached positions
        starting = run.ids[charged][self.first_start[run.ids[charged]] < 0]
        self.first_start[starting] = self.now
        compute_ns, traffic_ns, blocking_ns, end = self.account(
            num_tokens, int(part.sum()), num_logits, attn_pairs, kv_read, chunk_context, emitters, token_index,
            sampling)
        run.compute[charged] += compute_ns
        run.traffic[charged] += traffic_ns
        run.delivery[charged] += blocking_ns
        run.computed += grown
        run.target += gained
        run.left -= gained
        run.decoding[samples] = 1
        if self.acceptance is None:
            self.finish()
            return
        # A sequence that finished short of the step's advance gives back the blocks taken for the
        # tokens it did not make; those that finished leave in the order of their last tokens in the
        # step, a prompt's first token after the decodes'.
        kept = -(-run.computed // self.block) if self.hold is None else run.blocks  # (holding: all it took)
        for row in np.flatnonzero(decoders & (run.left == 0) & (run.blocks > kept)).tolist():
            self.give_back(int(run.blocks[row] - kept[row]))
            run.blocks[row] = kept[row]
        self.finish(np.where(decoders, grown, self.width + 1))

    def account(self, num_tokens: int, num_seqs: int, num_logits: int, attn_pairs: int, kv_read: int,
                chunk_context: int, emitters: np.ndarray, token_index: np.ndarray,
                sampling: int) -> tuple[int, int, int, int]:
        """Cost one step, record it and advance time: (compute_ns, traffic_ns, blocking_ns, end_ns).
        `emitters`: the request of each token sampled, `token_index` its place in its output;
        `sampling`: the sequences that sample. Inside a multi-step window the host takes nothing until
        the window's last step, which hands it every token of the window at once."""
        traffic_s = self.costs.traffic_s(num_tokens, num_logits == num_tokens)
        # Speculating, the host's work and the decode graphs count the sequences that sample, not the
        # LM head's verify rows.
        sequences = sampling if self.width > 1 else None
        if sequences is None:
            compute_s = self.costs.compute_s(num_tokens, num_logits, attn_pairs, kv_read, chunk_context,
                                             self.scheduled, traffic_s, self.ahead_s)
        else:
            compute_s = self.costs.compute_s(num_tokens, num_logits, attn_pairs, kv_read, chunk_context,
                                             self.scheduled, traffic_s, self.ahead_s, None, sequences)
        compute_ns = _ns(compute_s)
        if self.costs.draft_s is not None:  # the drafter's passes
            compute_ns += _ns(self.costs.draft_s(num_tokens, sampling, attn_pairs, kv_read, chunk_context))
        traffic_ns = _ns(traffic_s)
        gpu_end = self.now + compute_ns + traffic_ns
        if self.width > 1:  # each sequence's tokens of a verify step leave in one event
            events = sampling
        else:
            events = int(np.count_nonzero(closes_event(token_index, self.out[emitters], self.host.stream_interval)))
        self.through_front(gpu_end)
        if self.window_left:
            self.window_tokens += len(emitters)
            self.window_events += events
            blocking_ns, leave_ns, front_wait_ns, front_work_ns = 0, -1, 0, 0
        else:
            blocking_ns, leave_ns, front_wait_ns, front_work_ns = self.host.on_step(
                gpu_end, len(emitters) + self.window_tokens, events + self.window_events)
            self.window_tokens = self.window_events = 0
        end = gpu_end + blocking_ns
        self.steps.append((self.now, compute_ns, traffic_ns, blocking_ns, leave_ns, num_tokens, num_seqs,
                           attn_pairs, kv_read, chunk_context, num_logits, front_wait_ns, front_work_ns,
                           int(self.scheduled), _ns(self.ahead_s)))
        self.emitted.append(emitters)
        # Every token's step is recorded, so a request ended early (aborted) has its last one too.
        self.last_end[emitters] = end
        self.last_step[emitters] = len(self.steps) - 1
        self.formed = self.now
        if self.lagged:
            self.ahead_s = max(0.0, (compute_ns + traffic_ns) / 1e9
                               - self.costs.host_busy_s(num_tokens, num_logits, self.scheduled, sequences))
        self.now = end
        return compute_ns, traffic_ns, blocking_ns, end

    def finish(self, within: np.ndarray | None = None) -> None:
        """Retire the sequences that got their last token (mid-window: when the window ends), in the
        order of their last tokens (`within`: per running row, the place of its last token in the
        step, where a step makes several); a closed loop sends the next requests."""
        run = self.running
        finished = run.left == 0
        if self.window_left or not finished.any():
            return
        rows = np.flatnonzero(finished)
        rows = rows[np.argsort(self.last_step[run.ids[rows]], kind="stable")]
        if within is not None:
            rows = rows[np.argsort(within[rows], kind="stable")]
        self.park(rows)
        ids = run.ids[rows]
        if self.finish_lag:
            self.unseen += [(int(run.ids[r]), int(run.computed[r]), int(run.blocks[r]), int(run.reserved[r]))
                            for r in rows.tolist()]
        else:
            self.retire(rows)
        run.keep(~finished)
        self.done += len(rows)
        leave_ns = self.steps[-1][4]
        for f in ids.tolist():
            if f + 1 < self.n and self.think_ns[f + 1] >= 0:  # the session's next turn
                at_ns = self.host.last_event_arrival_ns(leave_ns, int(self.out[f])) + int(self.think_ns[f + 1])
                self.send(f + 1, at_ns)
            elif self.next_to_send < self.n:
                freed_at = self.host.last_event_arrival_ns(leave_ns, int(self.out[f]))
                self.send(self.next_to_send, max(int(self.scheduled_ns[self.next_to_send]), freed_at))
                self.next_to_send += 1
        if self.progress is not None:
            self.progress(len(rows))

    # -- stretches of pure decode ------------------------------------------------------------------

    def decode_run(self) -> int:
        """Advance through consecutive decode-only steps; the number of steps taken (0 if none apply).

        Applies while every running sequence decodes one token within the token budget, no waiting
        request can be admitted, and the cache has room for every block the stretch will add (and not
        with multi-step windows or speculative decoding). It stops before the step in which a sequence
        finishes, and after any step that ends once a request has arrived, so the general step handles
        every event exactly as it would have.
        """
        run, spec = self.running, self.spec
        batch = len(run)
        if (batch == 0 or batch > spec.max_num_batched_tokens or self.window > 1 or self.acceptance is not None
                or self.unseen):
            return 0
        if self.waiting and batch < self.max_seqs and not self.head_waits():
            return 0
        if not run.decoding.all():  # some sequence is still prefilling
            return 0
        length = int(run.left.min()) - 1  # the step after these finishes a sequence
        if self.aborts:  # and none runs into a step that an abort comes before
            length = min(length, min(self.aborts) - len(self.steps))
        if length < 1:
            return 0
        grown_blocks = (run.computed + length + (self.block - 1)) // self.block
        if int((grown_blocks - run.blocks).sum()) > self.free_blocks:
            return 0

        kv_before = int(run.computed.sum())
        emitters = run.ids
        token_index = self.out[emitters] - run.left
        compute_sum = traffic_sum = blocking_sum = 0
        taken = 0
        while taken < length:
            # Each sequence attends to its cache plus its new token: pairs = positions read.
            kv_read = kv_before + batch * (taken + 1)
            compute_ns, traffic_ns, blocking_ns, end = self.account(
                batch, batch, batch, kv_read, kv_read, 0, emitters, token_index + taken, batch)
            compute_sum += compute_ns
            traffic_sum += traffic_ns
            blocking_sum += blocking_ns
            taken += 1
            if self.ratio is not None:
                self.ratio.decoded()
            if (self.arrivals and self.arrivals[0][0] <= end) or (self.at_front and self.at_front[0][0] <= end):
                break
        grown_blocks = (run.computed + taken + (self.block - 1)) // self.block
        self.take(int((grown_blocks - run.blocks).sum()))
        run.blocks[:] = grown_blocks
        run.computed += taken
        run.target += taken
        run.left -= taken
        run.compute += compute_sum
        run.traffic += traffic_sum
        run.delivery += blocking_sum
        return taken

    def head_waits(self) -> bool:
        """Whether the queue's head cannot be admitted in any step of a decode-only stretch: until a sequence
        finishes, the free blocks only shrink and the budget, the room and the reservations stay as they are
        (not with SGLang's new-token ratio, which eases every decode step, nor for a prompt that finds cached
        segments, whose eviction by the stretch's growth may leave it needing fewer blocks; its own kept run,
        preempted, loses a block it would take back for each block taken)."""
        if self.shut:
            return True
        if self.ratio is not None:
            return False
        i, block = self.waiting[0], self.block
        budget = self.spec.max_num_batched_tokens - (0 if self.pauses else len(self.running))
        target, cached = int(self.prompt[i] + self.generated[i]), int(self.cached[i])
        hit_blocks = queued = 0
        if self.prefix is not None and i in self.prefix.segments:
            found, hit_blocks, queued = self.prefix.lookup(i, target)
            if found:
                return False
            cached = max(cached, hit_blocks * block)
        num = target - cached
        if num > budget:
            num = budget // self.chunk_unit * self.chunk_unit if self.spec.chunked_prefill else 0
            if num == 0:
                return True
        if self.reserve:
            return self.reservation(i) > self.total_blocks - int(self.running.reserved.sum())
        held = target if self.whole_prompt else cached + num
        return -(-held // block) - hit_blocks + queued > self.free_blocks

    def trace(self) -> EngineTrace:
        step_rows = np.array(self.steps, dtype=np.int64).reshape(-1, 15)
        leave = step_rows[:, 4]
        for k in range(len(leave) - 2, -1, -1):  # a step inside a window leaves with the window's last
            if leave[k] < 0:
                step_rows[k, [4, 11, 12]] = step_rows[k + 1, [4, 11, 12]]
        # The front end's time for each request on its way in, and for its last tokens on their way out.
        last = np.maximum(self.last_step, 0)
        has_tokens = self.last_step >= 0
        front_wait = self.front_request[:, 0] + np.where(has_tokens, step_rows[last, 11] if len(step_rows) else 0, 0)
        front_work = self.front_request[:, 1] + np.where(has_tokens, step_rows[last, 12] if len(step_rows) else 0, 0)
        counts = [len(e) for e in self.emitted]
        emit_ids = np.concatenate(self.emitted) if self.emitted else np.empty(0, np.int64)
        emit_steps = np.repeat(np.arange(len(self.emitted)), counts)
        order = np.argsort(emit_ids, kind="stable")
        spans = np.stack([emit_ids[order], emit_steps[order], np.ones(len(order), np.int64)], axis=1)
        return EngineTrace(
            sent_ns=self.sent,
            arrival_ns=self.arrival,
            compute_ns=self.acc_compute,
            traffic_ns=self.acc_traffic,
            delivery_ns=self.acc_delivery,
            last_step_end_ns=self.last_end,
            spans=spans,
            tick_steps=None,
            token_offsets=np.concatenate([[0], np.cumsum(self.out)]).astype(np.int64),
            step_start_ns=step_rows[:, 0],
            step_compute_ns=step_rows[:, 1],
            step_traffic_ns=step_rows[:, 2],
            step_blocking_ns=step_rows[:, 3],
            step_leave_ns=leave,
            step_tokens=step_rows[:, 5],
            step_seqs=step_rows[:, 6],
            step_attn_pairs=step_rows[:, 7],
            step_kv_read_tokens=step_rows[:, 8],
            step_chunk_context_tokens=step_rows[:, 9],
            step_logits=step_rows[:, 10],
            kv_capacity_tokens=self.kv_capacity_tokens,
            preemptions=self.preemptions,
            prefix_hit_tokens=np.array([0 if self.prefix is None else self.prefix.hit_tokens.get(i, 0)
                                        for i in range(self.n)], np.int64),
            first_step_start_ns=self.first_start,
            times_preempted=self.times_preempted,
            step_front_queue_ns=step_rows[:, 11],
            step_front_work_ns=step_rows[:, 12],
            step_scheduled=step_rows[:, 13],
            step_ahead_ns=step_rows[:, 14],
            front_queue_ns=front_wait,
            front_work_ns=front_work,
            upload_ns=self.upload,
            network_in_ns=self.upload - self.front_request.sum(axis=1),
            host_busy_ns=self.host.busy_ns(),
        )
