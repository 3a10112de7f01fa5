"""A replica's account of the KV blocks its decoding sequences hold for their drafts, under an engine that
keeps them from step to step (engine/draft_slots.py: vLLM V1 with a drafter).

A decoding sequence's block table then ends `steady_tokens` past its context at a reference tick: the
step being composed, or lagged the one before. Every sequence that decoded in the steps since that
reference took part in all of them and gained the same tokens, so the blocks they need in a step follow
from the decoding sequences' aggregate (running.py's `block_due`), shifted by those tokens: no work per
sequence. A sequence new to decoding is counted one by one over its first steps (one; two lagged), whose
tables end elsewhere (its prompt's, then `first_tokens` past its first context), until it follows the rule.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpath.engine.draft_slots import DraftHold
from tokenpath.engine.running import State


class HeldDrafts:
    """The holds of a replica's decoding sequences (`states`, running.py's Decoding.states, read as it
    changes), in blocks of `block` tokens."""

    def __init__(self, hold: DraftHold, block: int, states: dict[int, State]) -> None:
        self.hold, self.block, self.states = hold, block, states
        self.ticks: list[int] = []            # the decode clock at the last two steps run, the latest last
        self.new: dict[int, list[int]] = {}   # a sequence still counted alone -> [its blocks, its decode steps]
        self.need: dict[int, int] = {}        # ... and the blocks the step being composed takes for it
        # The others' tables in the step being composed: from `start` (a tick, shifted by the held tokens) over
        # `ticks` ticks, the positions of those ticks at the reference before and the reference now.
        self.start, self.span = 0, 0

    def _position(self, i: int, tick: int) -> int:
        """Sequence i's context at `tick` (any tick, before its first too: its context grows a token a tick)."""
        first, context0, _, _ = self.states[i]
        return context0 + tick - first

    def _crossed(self, i: int) -> int:
        """The blocks sequence i's table gains in the step being composed, if it follows the rule."""
        x, block = self._position(i, self.start), self.block
        return (x + self.span - 1) // block - (x - 1) // block

    def due(self, d: int, blocks_due: Callable[[int, int], int]) -> int:
        """The blocks the decoding sequences take in the step composed at tick d, `blocks_due(start, ticks)`
        being the replica's aggregate (Replica._blocks_due): the blocks its decoding sequences need over those
        ticks, one token a tick."""
        hold, ticks = self.hold, self.ticks
        lag = 1 if hold.lagged else 0
        now = ticks[-1] if lag and ticks else d      # the reference the tables reach in this step
        before = ticks[-1 - lag] if len(ticks) > lag else now
        self.start, self.span = before + hold.steady_tokens, now - before
        due = blocks_due(self.start, self.span)
        need, block = {}, self.block
        for i, (blocks, steps) in self.new.items():
            reach = self._position(i, d) + hold.first_tokens if steps == 0 else \
                self._position(i, ticks[-1]) + hold.steady_tokens
            need[i] = -(-reach // block) - blocks
            due += need[i] - self._crossed(i)
        self.need = need
        return due

    def held(self, i: int) -> int:
        """The blocks decoding sequence i holds once the step composed last has taken its own."""
        counted = self.new.get(i)
        if counted is not None:
            return counted[0] + self.need.get(i, 0)
        return -(-(self._position(i, self.start) + self.span) // self.block)

    def preempted(self, i: int) -> tuple[int, int]:
        """Decoding sequence i leaves before the step composed last takes its blocks: (the blocks that step
        would have taken for it, the blocks it holds)."""
        counted = self.new.pop(i, None)
        if counted is not None:
            return self.need.pop(i, 0), counted[0]
        return self._crossed(i), -(-self._position(i, self.start) // self.block)

    def enter(self, i: int, blocks: int) -> None:
        """Request i decodes from the next step on, holding `blocks` (its prompt's)."""
        self.new[i] = [blocks, 0]

    def leave(self, i: int) -> None:
        """Request i no longer decodes (finished or aborted), its blocks given back."""
        self.new.pop(i, None)
        self.need.pop(i, None)

    def stepped(self, d: int) -> None:
        """The step composed at tick d has run: the sequences counted alone that took part hold its blocks."""
        entry_steps = self.hold.entry_steps
        for i, taken in self.need.items():
            counted = self.new[i]
            counted[0] += taken
            counted[1] += 1
            if counted[1] >= entry_steps:
                del self.new[i]
        self.need = {}
        self.ticks = [*self.ticks[-1:], d]
