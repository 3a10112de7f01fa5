"""The serving front end as a CPU resource: API-server processes shared, first come first served, by
every request and every token.

An engine's API server is a Python process (or a few) apart from the engine's own. Each request's
path runs there before the engine sees it: the HTTP body parsed and validated, the chat template
rendered, the prompt tokenized (in proportion to its length), the request handed to the engine's
process. So does each step's token path: the step's outputs received, detokenized where the engine
detokenizes in its API server, each chunk built, serialized and framed as an SSE event and written
to its socket. Both kinds of work take turns on one CPU per process, in the order they become ready:
a burst of requests makes the first tokens of earlier ones wait, and a busy token stream delays new
requests. Where detokenization runs in a process of its own (SGLang's detokenizer manager), a step's
tokens pass through it first.

`Layout` says, for one engine replica, how many processes serve it and what share of each it has
(`sim/front_end.py` builds it from the engine's profile and the deployment). Requests go to the
processes in turn, and each process takes the tokens of its own requests (vLLM's engine core sends each
API server the outputs of the requests it sent): a step's tokens are dealt as its requests were, its
work shared in proportion, and its tokens leave when the last process is done with its share.

A process several engines share (SGLang's one TokenizerManager over its data-parallel schedulers, a
pipeline's batches in flight) is simulated beside each engine apart from the others. Each piece of an
engine's work runs at one CPU's speed, as the process runs it, and the process is then busy for the
other engines' like share of work as well: a share s of a process holds it 1/s as long as the work
itself. A request alone is served as fast as on a process of its own, and the process's capacity is
shared: exact at light load and at saturation. (Running the work at s of a CPU instead, the engines'
processes of old, made a lone request's front end 1/s times as long: eight replicas under one
TokenizerManager, 1.6 ms of a default request's front-end work read 13 ms.)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

import numpy as np

Placement = Literal["engine", "api-server", "detokenizer"]
PLACEMENTS: tuple[Placement, ...] = ("engine", "api-server", "detokenizer")


@dataclass(frozen=True)
class Layout:
    """Where one replica's last-mile work runs.

    `detokenizes_in`: the engine's own process (its steps wait for it), its API server, or a
    detokenizer process of its own. `api_processes` API-server processes serve the replica, each a
    single CPU of which the replica has `api_cpus` (a deployment's processes shared by several replicas
    give each a fraction; never more than one: a process is one Python interpreter); of the detokenizer
    process it has `detokenizer_cpus`. `outputs_per_event`: the engine hands on a request's tokens only
    as its SSE event closes (Profile.outputs_per_event), so the processes after it take outputs per event.
    `tokenizes_in_thread`: each API server tokenizes prompts in a thread of its own, off the loop that does
    the rest of its work (Profile.tokenizes_in_thread). `merges_events`: a request's outputs that come
    before its stream has framed the ones before go out in one event with them (Profile.merges_events).
    """

    detokenizes_in: Placement = "engine"
    api_processes: int = 1
    api_cpus: float = 1.0
    detokenizer_cpus: float = 1.0
    outputs_per_event: bool = False
    tokenizes_in_thread: bool = False
    merges_events: bool = False

    def __post_init__(self) -> None:
        if self.detokenizes_in not in PLACEMENTS:
            raise ValueError(f"detokenizes_in must be one of {PLACEMENTS}, not {self.detokenizes_in!r}")
        if self.api_processes < 1 or self.api_cpus <= 0 or self.detokenizer_cpus <= 0:
            raise ValueError("a front end needs at least one process and a positive share of a CPU")
        if self.api_cpus > 1 or self.detokenizer_cpus > 1:
            raise ValueError("a front-end process runs on one CPU at most: add processes, not CPU per process")


# A piece of front-end work done: (when it ended, how long it waited for a CPU, how long it ran on one). A
# plain tuple: one is made for every request and every engine step.
Wait = tuple[int, int, int]


class FrontEnd:
    """One replica's share of the front end: its API-server processes (and detokenizer process), each a
    single CPU that takes work first come first served. Callers hand it work in the order it becomes
    ready (the engine loop does: requests by their arrival, steps by their end)."""

    def __init__(self, layout: Layout, tokenizer_batch_wait_s: float = 0.0, tokenizer_batch_max: int = 1) -> None:
        """`tokenizer_batch_wait_s`, `tokenizer_batch_max`: each process's tokenizer batches prompts, a
        batch open that long after its first prompt for at most that many (`_tokenized_from`); 0: none."""
        self.layout = layout
        # How long a piece of this replica's work holds its process or detokenizer process, per ns of the work
        # itself: 1 / its share of the process (the module's docstring).
        self._api_held, self._detokenizer_held = 1 / layout.api_cpus, 1 / layout.detokenizer_cpus
        self._api_free_ns = [0] * layout.api_processes
        self._api_busy_ns = [0] * layout.api_processes
        # Each process's last step's token work: when it became ready, its work, and when the process was
        # free before it. A request handed in after it that reached the server before it (a cluster routes a
        # request once the step under way on its replica has run) goes first, as it would have (`_ahead`).
        self._tokens_ready_ns = [0] * layout.api_processes
        self._tokens_held_ns = [0] * layout.api_processes
        self._free_before_tokens_ns = [0] * layout.api_processes
        self._next_process = 0
        self._detokenizer_free_ns = 0
        self.detokenizer_busy_ns = 0
        # Each process's tokenizer batch: when the open one closes, and the prompts it holds.
        self._batch_wait_ns, self._batch_max = round(tokenizer_batch_wait_s * 1e9), tokenizer_batch_max
        self._batch_closes_ns = [-1] * layout.api_processes
        self._batch_prompts = [0] * layout.api_processes
        # Until when each process's next step's outputs join those of the step before (`_merged`).
        self._merges_until_ns = [-1] * layout.api_processes
        # Each process's tokenizer thread (Layout.tokenizes_in_thread): when it is free, and its busy time.
        self._thread_free_ns = [0] * layout.api_processes
        self._thread_busy_ns = [0] * layout.api_processes

    @property
    def api_busy_ns(self) -> int:
        """The busiest API-server process's busy time so far (with the other engines' share, where it is
        shared: the time this replica's work held it)."""
        return max(self._api_busy_ns)

    def requests(self, arrival_ns: list[int], first_s: float, then_s: list[float],
                 tokenize_s: list[float] | None = None) -> list[Wait]:
        """Requests that reached the server by one moment of the engine loop, in arrival order: each
        costs `first_s` of CPU once it has arrived (reading and parsing it), then its `then_s` once that is
        done (its template, the hand-off), and its `tokenize_s` (tokenizing its prompt: with `then_s` on the
        loop, or after it in the process's tokenizer thread, `_tokenize_in_thread`). Each stage waits its
        turn by the time it became ready, as an asyncio server's tasks do: a burst's requests are all read
        and parsed before the first is tokenized, while a request alone runs its stages back to back. Where
        the tokenizer batches prompts, a request also waits for its batch to close (`_tokenized_from`)."""
        thread = self.layout.tokenizes_in_thread
        if tokenize_s is None:
            tokenize_s = [0.0] * len(arrival_ns)
        if len(arrival_ns) == 1:
            return [self.request(arrival_ns[0], first_s, then_s[0], tokenize_s[0])]
        if not thread:
            then_s = [then + tokenize for then, tokenize in zip(then_s, tokenize_s)]
        free, busy = self._api_free_ns, self._api_busy_ns
        count = len(free)
        # Stages ready to run: (ready, order handed in, request, its process, stage).
        ready = []
        for k, at_ns in enumerate(arrival_ns):
            ready.append((at_ns, k, k, self._next_process, 0))
            self._next_process = (self._next_process + 1) % count
        heapq.heapify(ready)
        worked = [0] * len(arrival_ns)
        tokenized_ns = [0] * len(arrival_ns)  # when each one's tokenizer batch closes
        waits: list[Wait] = [(0, 0, 0)] * len(arrival_ns)
        order, first_ns = len(arrival_ns), round(first_s * 1e9)
        while ready:
            ready_ns, _, k, p, stage = heapq.heappop(ready)
            work_ns = round(then_s[k] * 1e9) if stage else first_ns
            held_ns = round(work_ns * self._api_held)
            if ready_ns < self._tokens_ready_ns[p]:
                start_ns, _ = self._ahead(p, ready_ns, work_ns, held_ns)
            else:
                start_ns = free[p] if free[p] > ready_ns else ready_ns
                free[p] = start_ns + held_ns
            busy[p] += held_ns
            worked[k] += work_ns
            if stage:
                if thread:
                    tokenize_ns = round(tokenize_s[k] * 1e9)
                    done_ns = self._tokenize_in_thread(p, start_ns + work_ns, tokenize_ns)
                    worked[k] += tokenize_ns
                else:
                    done_ns = max(start_ns, tokenized_ns[k]) + work_ns
                waits[k] = (done_ns, done_ns - arrival_ns[k] - worked[k], worked[k])
            else:
                if self._batch_wait_ns and not thread:
                    tokenized_ns[k] = self._tokenized_from(p, start_ns + work_ns)
                heapq.heappush(ready, (start_ns + work_ns, order, k, p, 1))
                order += 1
        return waits

    def request(self, at_ns: int, first_s: float, then_s: float, tokenize_s: float = 0.0) -> Wait:
        """`requests` for one request that reached the server alone at `at_ns` (the common case): its
        stages back to back, without the heap."""
        free = self._api_free_ns
        p = self._next_process
        self._next_process = (p + 1) % len(free)
        thread = self.layout.tokenizes_in_thread
        if not thread:
            then_s += tokenize_s
        first_ns, then_ns = round(first_s * 1e9), round(then_s * 1e9)
        held_ns = round((first_ns + then_ns) * self._api_held)
        if at_ns < self._tokens_ready_ns[p]:
            start_ns, end_ns = self._ahead(p, at_ns, first_ns + then_ns, held_ns)
        else:
            start_ns = free[p] if free[p] > at_ns else at_ns
            end_ns = start_ns + first_ns + then_ns
            free[p] = start_ns + held_ns
        self._api_busy_ns[p] += held_ns
        worked_ns = first_ns + then_ns
        if thread:
            tokenize_ns = round(tokenize_s * 1e9)
            done_ns = self._tokenize_in_thread(p, end_ns, tokenize_ns)
            worked_ns += tokenize_ns
        else:
            done_ns = end_ns if not self._batch_wait_ns else self._tokenized_from(p, start_ns + first_ns) + then_ns
        return (done_ns, done_ns - at_ns - worked_ns, worked_ns)

    def _tokenize_in_thread(self, p: int, ready_ns: int, work_ns: int) -> int:
        """When a prompt handed to process p's tokenizer thread at `ready_ns` (its loop work done) is
        tokenized, `work_ns` of it: once its tokenizer batch closes, where prompts are batched, and the
        thread is done with the prompts before it, first come first served. (A batch's prompts are taken
        one after another here, where the batcher tokenizes them in one call and hands them all back at
        its end: the first of a batch of k is back up to k - 1 prompts' tokenizing early.)"""
        if self._batch_wait_ns:
            ready_ns = self._tokenized_from(p, ready_ns)
        free_ns = self._thread_free_ns[p]
        start_ns = free_ns if free_ns > ready_ns else ready_ns
        held_ns = round(work_ns * self._api_held)
        self._thread_free_ns[p] = start_ns + held_ns
        self._thread_busy_ns[p] += held_ns
        return start_ns + work_ns

    @property
    def tokenizer_busy_ns(self) -> int:
        """The busiest tokenizer thread's busy time so far, where the API servers tokenize in one."""
        return max(self._thread_busy_ns)

    def _note_tokens(self, p: int, ready_ns: int, held_ns: int) -> None:
        """Process p takes a step's token work, ready at `ready_ns` and holding it `held_ns` (`_ahead` reads
        it)."""
        self._tokens_ready_ns[p], self._tokens_held_ns[p] = ready_ns, held_ns
        self._free_before_tokens_ns[p] = self._api_free_ns[p]

    def _ahead(self, p: int, ready_ns: int, work_ns: int, held_ns: int) -> tuple[int, int]:
        """Request work ready at `ready_ns` on process p (`work_ns` of it, holding the process `held_ns`), ahead
        of the last step's token work, which became ready after it and was handed in first only because the
        engine loop ran that step before it handed the request in: the request's (start, end), and the token
        work runs after it (the process's time from then on is as if they had come in order; the step's
        tokens already left at the time given)."""
        before = self._free_before_tokens_ns[p]
        start_ns = before if before > ready_ns else ready_ns
        held_until_ns = self._free_before_tokens_ns[p] = start_ns + held_ns
        after_tokens = max(held_until_ns, self._tokens_ready_ns[p]) + self._tokens_held_ns[p]
        self._api_free_ns[p] = max(self._api_free_ns[p], after_tokens)
        return start_ns, start_ns + work_ns

    def _tokenized_from(self, p: int, ready_ns: int) -> int:
        """When a prompt handed to process p's tokenizer at `ready_ns` (in order of readiness) is tokenized:
        as its batch closes, `tokenizer_batch_wait_s` after the batch's first prompt came; a prompt that
        finds the batch closed, or full, opens the next. The process's CPU is free while a batch waits, so
        the model runs a request's work in its turn and hands the request on once both are done (the work
        runs before the wait, where the server tokenizes after it: the same CPU time, the same hand-off).
        A full batch closes at its deadline here, where the server tokenizes it at once: its prompts would
        have to come faster than one per wait / max, which the parsing before them does not allow."""
        if ready_ns <= self._batch_closes_ns[p] and self._batch_prompts[p] < self._batch_max:
            self._batch_prompts[p] += 1
        else:
            self._batch_closes_ns[p], self._batch_prompts[p] = ready_ns + self._batch_wait_ns, 1
        return self._batch_closes_ns[p]

    def detokenize(self, ready_ns: int, cost_s: float) -> Wait:
        """A step's detokenization in the detokenizer process, its ids there at `ready_ns`."""
        work_ns = round(cost_s * 1e9)
        held_ns = round(work_ns * self._detokenizer_held)
        start_ns = max(ready_ns, self._detokenizer_free_ns)
        self._detokenizer_free_ns = start_ns + held_ns
        self.detokenizer_busy_ns += held_ns
        return (start_ns + work_ns, start_ns - ready_ns, work_ns)

    @property
    def single_process(self) -> bool:
        """One API-server process (tokens_run accounts runs of steps only there)."""
        return len(self._api_free_ns) == 1

    def _merged(self, p: int, ready_ns: int, work_ns: int, frame_s: float) -> int:
        """Process p's work on a step's outputs, `work_ns` with `frame_s` of framing, there at `ready_ns`,
        where the engine merges outputs not yet framed (Layout.merges_events): without the framing if they
        come before the step before's have been handed to their requests' streams (`_merges_until_ns`:
        vLLM V1's output handler takes every output waiting before the streams run, and each stream frames
        what has gathered for it once, RequestOutputCollector in vllm/v1/engine/output_processor.py; SGLang's
        TokenizerManager streams a request's latest output, `_wait_one_response`). Notes when the next
        step's outputs would still join these."""
        if not self.layout.merges_events:
            return work_ns
        start_ns = max(ready_ns, self._api_free_ns[p])
        if ready_ns < self._merges_until_ns[p]:
            work_ns -= round(frame_s * 1e9)
            self._merges_until_ns[p] = start_ns + work_ns
        else:
            self._merges_until_ns[p] = start_ns + work_ns - round(frame_s * 1e9)
        return work_ns

    def tokens_run(self, ready_ns: np.ndarray, cost_s: float,
                   frame_s: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`tokens` for a run of steps on the one API-server process, each `cost_s` of token work (`frame_s`
        of it framing), their outputs there at `ready_ns` (in order): (done, queue, work) of each, as `tokens`
        gives them one by one."""
        work_ns = round(cost_s * 1e9)
        held_ns = round(work_ns * self._api_held)
        steps = len(ready_ns)
        start_ns = _starts_in_turn(ready_ns, self._api_free_ns[0], held_ns)
        unframed_ns = work_ns - round(frame_s * 1e9)
        if self.layout.merges_events and (ready_ns[0] < self._merges_until_ns[0] or (
                steps > 1 and bool((ready_ns[1:] < start_ns[:-1] + unframed_ns).any()))):
            # (outputs that come while the step before still waits to be framed join it: one at a time)
            each = [self.tokens(int(t), cost_s, 1, frame_s) for t in ready_ns.tolist()]
            return tuple(np.array(column, np.int64) for column in zip(*each))  # type: ignore[return-value]
        self._merges_until_ns[0] = int(start_ns[-1]) + unframed_ns
        self._note_tokens(0, int(ready_ns[-1]), held_ns)
        if steps > 1:
            self._free_before_tokens_ns[0] = int(start_ns[-2]) + held_ns
        self._api_free_ns[0] = int(start_ns[-1]) + held_ns
        self._api_busy_ns[0] += steps * held_ns
        return start_ns + work_ns, start_ns - ready_ns, np.full(steps, work_ns, np.int64)

    def detokenize_run(self, ready_ns: np.ndarray, cost_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`detokenize` for a run of steps, each `cost_s` of it, their ids there at `ready_ns` (in order):
        (done, queue, work) of each, as `detokenize` gives them one by one."""
        work_ns = round(cost_s * 1e9)
        held_ns = round(work_ns * self._detokenizer_held)
        start_ns = _starts_in_turn(ready_ns, self._detokenizer_free_ns, held_ns)
        self._detokenizer_free_ns = int(start_ns[-1]) + held_ns
        self.detokenizer_busy_ns += len(ready_ns) * held_ns
        return start_ns + work_ns, start_ns - ready_ns, np.full(len(ready_ns), work_ns, np.int64)

    def tokens(self, ready_ns: int, cost_s: float, tokens: int, frame_s: float = 0.0) -> Wait:
        """A step's token work in the API servers (`cost_s` in all, for its `tokens` tokens, at least one;
        `frame_s` of it building and writing its SSE events), its outputs there at `ready_ns`. Each process
        takes its own requests' tokens: the step's are dealt as requests are, in turn, so where they do not
        divide evenly the processes dealt the latest requests take one more (a lone request's token, all its
        work on the process that took it in) and a process with none does no work; the step's tokens have
        left when the last is done. Where the engine merges a request's outputs that its API server has not
        yet framed (Layout.merges_events), a step whose outputs come while the step before still waits to be
        framed costs no framing of its own: its tokens go out in the events of the step before's requests
        (`_merged`)."""
        free, busy = self._api_free_ns, self._api_busy_ns
        count = len(free)
        if count == 1:  # the common case, without the loop
            work_ns = self._merged(0, ready_ns, round(cost_s * 1e9), frame_s)
            held_ns = round(work_ns * self._api_held)
            self._note_tokens(0, ready_ns, held_ns)
            start_ns = free[0] if free[0] > ready_ns else ready_ns
            free[0] = start_ns + held_ns
            busy[0] += held_ns
            return (start_ns + work_ns, start_ns - ready_ns, work_ns)
        each, extra = divmod(tokens, count)
        latest = self._next_process - 1  # the process dealt the latest request
        done_ns, queue_ns, last_work_ns = ready_ns, 0, 0
        for p, free_ns in enumerate(free):
            share = each + ((latest - p) % count < extra)
            if not share:
                continue
            work_ns = self._merged(p, ready_ns, round(cost_s * share / tokens * 1e9), frame_s * share / tokens)
            held_ns = round(work_ns * self._api_held)
            self._note_tokens(p, ready_ns, held_ns)
            start_ns = max(ready_ns, free_ns)
            free[p] = start_ns + held_ns
            busy[p] += held_ns
            if start_ns + work_ns > done_ns:
                done_ns, queue_ns, last_work_ns = start_ns + work_ns, start_ns - ready_ns, work_ns
        return (done_ns, queue_ns, last_work_ns)


def _starts_in_turn(ready_ns: np.ndarray, free_ns: int, work_ns: int) -> np.ndarray:
    """When each of a run of jobs of `work_ns` starts on one server free from `free_ns`, taken in turn as they
    become ready at `ready_ns` (in order): job k starts at max(ready_k, start_(k-1) + work), which is k x
    work + the largest of the free time and every ready_j - j x work up to k."""
    before_ns = np.arange(len(ready_ns), dtype=np.int64) * work_ns
    return before_ns + np.maximum(np.maximum.accumulate(ready_ns - before_ns), free_ns)
