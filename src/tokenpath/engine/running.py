"""A replica's running sequences: at most one part-way through its prompt (`Prefill`; one an attention
rank under attention data-parallel), and the decoding ones, kept as aggregates keyed by the decode clock
(`Decoding`).

Why: a step costs O(1) Python work plus O(1) per request that joins, finishes or is preempted (or waits
for the token budget), never O(batch). That holds because no prompt is admitted behind one still in
progress, nor beside decodes that pass the token budget (vLLM requires max_num_batched_tokens >=
max_num_seqs; decodes whose drafts pass it wait, Profile.decodes_past_budget), so at most one sequence is
part-way through its prompt, and it is the one admitted last (under attention data-parallel, one a rank:
each rank's scheduler's).
Decoding sequences are then described by aggregates (their count and summed context) plus, per
sequence, the tick it started decoding at: its context, its KV blocks and its token index at any
later tick follow from that.

Ticks count the steps in which decoding sequences advance (the decode clock). Under vllm-v1 and
trtllm they advance in every step, so a tick is a step; under prefill-first they pause in prefill
steps, and the clock stops there. The aggregates (first tick, block_due, event_due, finishing_at)
are keyed by tick, so a paused decoder costs nothing per step; the step of each tick is recorded
(engine/trace_rows.py) only when the two differ.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

State = tuple[int, int, int, int]  # (first tick it decodes in, its context then, its last tick, request)


def closes_event(token_index: int, output_tokens: int, interval: int) -> bool:
    """Whether token `token_index` of a sequence is the last of its SSE event (see delivery.lastmile)."""
    return token_index % interval == 0 or token_index == output_tokens - 1


@dataclass(slots=True)  # (read and written in every step that runs a prompt)
class Prefill:
    """A sequence part-way through its prompt (or its recompute after preemption)."""

    request: int
    computed: int  # tokens in its KV cache
    blocks: int
    target: int    # tokens it needs in its KV cache to sample: its prompt and the tokens already sent


class Decoding:
    """The decoding sequences of a replica. It reads the replica's per-request columns `out` (output
    lengths) and `generated` (tokens sampled so far, which it advances when a sequence stops) and
    appends a (request, first tick, tokens) row to `spans` for the tokens each sampled."""

    def __init__(self, block_size: int, interval: int, out: array, generated: list[int], spans: list[int],
                 clip_tokens: int | None = None) -> None:
        """`clip_tokens`: keep what `clipped_to_come` needs, each sequence's outputs to come counted up to it."""
        self.block, self.interval = block_size, interval  # tokens per KV block, per SSE event
        self.out, self.generated, self.spans = out, generated, spans
        self.states: dict[int, State] = {}  # in admission order, request -> its state
        self.context_sum = 0                # summed context of the decoding sequences
        self.last_tick_sum = 0              # summed last ticks (outputs to come)
        self.out_sum = 0                    # summed output lengths
        self.block_due = [0] * block_size   # sequences that need a new block at tick % block
        # With several tokens per SSE event: sequences whose token closes an event at tick % interval.
        self.event_due = [0] * interval
        # States by the tick of their last token; a preempted request's entry goes stale.
        self.finishing_at: dict[int, list[State]] = {}
        # finishing_at's ticks, a heap (a tick goes stale once passed, or with a preempted request's entry).
        self.finish_ticks: list[int] = []
        # Multi-step: sequences that sampled their last token in the decode window still open (still
        # computed until it ends).
        self.zombies: list[int] = []
        # With `clip_tokens`: the sequences with more than that many outputs to come at the tick last asked
        # (`clipped_to_come`), by request, their last ticks summed, and a heap of (last tick, request) whose
        # entries go stale as the dict moves on.
        self.clip = clip_tokens
        self.long_last: dict[int, int] = {}
        self.long_last_sum = 0
        self.long_heap: list[tuple[int, int]] = []

    def start(self, i: int, first_tick: int, context: int) -> None:
        """Request i decodes from `first_tick` on, with `context` tokens in its KV cache then."""
        last_tick = first_tick + self.out[i] - self.generated[i] - 1
        self.states[i] = state = (first_tick, context, last_tick, i)
        self.context_sum += context
        self.last_tick_sum += last_tick
        self.out_sum += self.out[i]
        self.block_due[(first_tick - context) % self.block] += 1
        if self.interval > 1:
            self.event_due[(first_tick - self.generated[i]) % self.interval] += 1
        due = self.finishing_at.get(last_tick)
        if due is None:
            self.finishing_at[last_tick] = [state]
            heap = self.finish_ticks
            while heap and heap[0] < first_tick:  # (passed: kept no longer than the sequences it stands for)
                heapq.heappop(heap)
            heapq.heappush(heap, last_tick)
        else:
            due.append(state)
        if self.clip is not None and last_tick - first_tick + 1 > self.clip:
            self._hold_long(i, last_tick)

    def ticks_to_finish(self, tick: int) -> int | None:
        """How many ticks from `tick` on pass before the first that may finish a sequence (an entry of
        finishing_at, perhaps stale: fewer at worst); None where none is due."""
        heap = self.finish_ticks
        while heap and heap[0] < tick:
            heapq.heappop(heap)
        return heap[0] - tick if heap else None

    def _hold_long(self, i: int, last_tick: int) -> None:
        self.long_last[i] = last_tick
        self.long_last_sum += last_tick
        heapq.heappush(self.long_heap, (last_tick, i))

    def clipped_to_come(self, tick: int) -> int:
        """The tokens the decoding sequences will still generate from `tick` on, each counted up to
        `clip_tokens` (SGLang's headroom clips each running request's at CLIP_MAX_NEW_TOKENS_ESTIMATION:
        engine/new_token_ratio.py). `tick` never goes back between calls."""
        long_last, heap, edge = self.long_last, self.long_heap, tick - 1 + self.clip
        while heap and heap[0][0] <= edge:  # no longer more than the clip to come (or stale)
            last_tick, i = heapq.heappop(heap)
            if long_last.get(i) == last_tick:
                del long_last[i]
                self.long_last_sum -= last_tick
        to_come = self.last_tick_sum - len(self.states) * (tick - 1)
        return to_come - (self.long_last_sum - len(long_last) * edge)

    def leave(self, i: int, ticks_taken: int) -> tuple[int, int]:
        """Take request i out of the sums after `ticks_taken` decode ticks: (the tick it started
        decoding at, its context)."""
        first, context0, last_tick, _ = self.states.pop(i)
        context = context0 + ticks_taken
        self.context_sum -= context
        self.last_tick_sum -= last_tick
        if i in self.long_last:
            self.long_last_sum -= self.long_last.pop(i)
        self.out_sum -= self.out[i]
        self.block_due[(first - context0) % self.block] -= 1
        return first, context

    def sampled(self, i: int, first: int, ticks: int) -> None:
        """Request i sampled a token in each of `ticks` ticks from `first`, and samples no more."""
        if self.interval > 1:
            self.event_due[(first - self.generated[i]) % self.interval] -= 1
        if ticks:
            self.spans.extend((i, first, ticks))
        self.generated[i] += ticks

    def stop(self, i: int, ticks_taken: int) -> int:
        """Request i stops decoding after `ticks_taken` ticks (finished, preempted or aborted); its context."""
        first, context = self.leave(i, ticks_taken)
        self.sampled(i, first, ticks_taken)
        return context

    def pause(self, i: int, d: int, ticks: int) -> int:
        """Request i, decoding, makes no token in the `ticks` ticks from d (SGLang's attention rank running a
        prompt): it decodes again from d + ticks with the context it has, in its place in admission order.
        Returns that context."""
        first, context0, last_tick, _ = self.states[i]
        taken = d - first
        context = context0 + taken
        block_due = self.block_due
        block_due[(first - context0) % self.block] -= 1
        block_due[(first - context0 + ticks) % self.block] += 1
        if self.interval > 1:  # (both grids' keys move on by `ticks`)
            self.event_due[(first - self.generated[i]) % self.interval] -= 1
            self.event_due[(first - self.generated[i] + ticks) % self.interval] += 1
        if taken:
            self.spans.extend((i, first, taken))
            self.generated[i] += taken
        self.last_tick_sum += ticks
        self.states[i] = state = (d + ticks, context, last_tick + ticks, i)
        if i in self.long_last:  # (its outputs to come stay as many, the clock moving on)
            self.long_last_sum += ticks
            self.long_last[i] = last_tick + ticks
            heapq.heappush(self.long_heap, (last_tick + ticks, i))
        due = self.finishing_at.get(last_tick + ticks)
        if due is None:
            self.finishing_at[last_tick + ticks] = [state]
            heapq.heappush(self.finish_ticks, last_tick + ticks)
        else:
            due.append(state)
        return context

    def finish(self, d: int, finishing: Sequence[int], window_open: bool,
               release: Callable[[int, int], None]) -> list[int]:
        """The sequences that leave after tick d, each handed to `release(request, context)`, in the
        order of their last tokens: `finishing`, whose last token it sampled (under speculative decoding,
        one of the ticks of the step that ends at d). Under multi-step those
        stay in the batch, computed but sampling nothing more, until the window ends (`window_open` is
        false); then every such sequence leaves."""
        states = self.states
        if window_open:
            for i in finishing:
                first = states[i][0]
                self.sampled(i, first, d - first + 1)
                self.zombies.append(i)
            return []
        for i in self.zombies:  # their spans, events and tokens were counted when they sampled their last
            release(i, self.leave(i, d + 1 - states[i][0])[1])
        for i in finishing:  # (each at its last tick: d, or under speculative decoding one of the step's ticks)
            first, _, last_tick, _ = states[i]
            release(i, self.stop(i, last_tick - first + 1))
        finished, self.zombies = self.zombies, []
        finished += finishing
        return finished

    def emitters(self, tick: int, decode: int, completing: list[tuple[int, int]]) -> list[int]:
        """The requests that got a token in a step at `tick`: the decoding ones taking part (`decode`: all of
        them decoding by then, but those already done in a multi-step window) and those that finished their
        prompt."""
        zombies = set(self.zombies)
        emitters = [i for i, state in self.states.items() if state[0] <= tick and i not in zombies] if decode else []
        return emitters + [i for i, _ in completing]

    def still_due(self, due: list[State]) -> list[int]:
        """The requests of `due` (states entered to finish at this tick) that still do: one preempted
        since is not decoding, or decoding again under a new state (which, recomputed at once, can
        be due at the same tick: its new entry is the one that counts)."""
        states = self.states
        return [state[3] for state in due if states.get(state[3]) is state]

    def events(self, d: int, decode: int, finishing: Sequence[int], completing: list[tuple[int, int]]) -> int:
        """SSE events closed by tick d's tokens (only needed when events group several tokens), with
        `completing` (request, context) the sequences whose first token it also samples."""
        interval, out = self.interval, self.out
        events = self.event_due[d % interval] if decode else 0
        for i in finishing:  # a last token always closes its event; count those off the grid
            if (out[i] - 1) % interval:
                events += 1
        for i, _ in completing:
            events += closes_event(self.generated[i], out[i], interval)
        return events
