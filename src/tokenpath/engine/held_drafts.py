"""A replica's account of the KV blocks its decoding sequences hold for their drafts, under an engine that
keeps them from step to step (engine/draft_slots.py: vLLM V1 with a drafter, SGLang's V2 worker).

A decoding sequence's block table then ends `steady_tokens` past its context at a reference tick: the
step being composed, or lagged the one before (where the decoding sequences last ran). Every sequence that
decoded in the steps since that reference took part in all of them and gained the same tokens, so the
blocks they need in a step follow from the decoding sequences' aggregate (running.py's `block_due`),
shifted by those tokens: no work per sequence. The others are counted one by one (`counted`): a sequence
new to decoding over its first steps (one; two lagged), whose tables end elsewhere (its prompt's, then its
first reach), one that takes no part in a step (`sit_out`: the token budget left it none; `pause`: its
attention rank runs a prompt) and one that runs fewer verify tokens (`trim`: the budget's end trims its
drafts), until it has run full steps enough again.
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
        self.ticks: list[int] = []  # the decode clock at the last two steps run, the latest last
        # A sequence counted alone -> [its blocks, the full steps it has run since it entered, sat out or was trimmed,
        # the tokens it scheduled in the step before (0: it took no part), its context at that step's start].
        self.counted: dict[int, list[int]] = {}
        self.need: dict[int, int] = {}      # ... the blocks the step being composed takes for each that runs
        self.started: dict[int, int] = {}   # ... and its context at that step's start
        self.out: set[int] = set()          # ... those that take no part in it
        self.trimmed: dict[int, int] = {}   # ... those that run fewer verify tokens in it: their tokens
        # The others' tables in the step being composed: from `start` (a tick, shifted by the held tokens) over
        # `span` ticks, the positions of the reference before (`reference`: where their tables reached at the last
        # step that ran them; a step without decodes, as prefill-first's prompt steps, leaves it) and the
        # reference now (`reaching`, the next step's `reference` once this one has run them).
        self.start, self.span, self.reference, self.reaching = 0, 0, None, None

    def _position(self, i: int, tick: int) -> int:
        """Sequence i's context at `tick` (any tick, before its first too: its context grows a token a tick)."""
        first, context0, _, _ = self.states[i]
        return context0 + tick - first

    def _crossed(self, i: int) -> int:
        """The blocks the aggregate counts for sequence i in the step being composed, as if it followed the rule."""
        x, block = self._position(i, self.start), self.block
        return (x + self.span - 1) // block - (x - 1) // block

    def due(self, d: int, blocks_due: Callable[[int, int], int]) -> int:
        """The blocks the decoding sequences take in the step composed at tick d, `blocks_due(start, ticks)`
        being the replica's aggregate (Replica._blocks_due): the blocks its decoding sequences need over those
        ticks, one token a tick."""
        hold, ticks = self.hold, self.ticks
        lag = hold.lagged
        now = ticks[-1] if lag and ticks else d      # the reference the tables reach in this step
        before = now if self.reference is None else self.reference
        self.start, self.span, self.reaching = before + hold.steady_tokens, now - before, now
        due = blocks_due(self.start, self.span)
        need, started, block, width = {}, {}, self.block, hold.width
        for i, (blocks, _, scheduled_before, context_before) in self.counted.items():
            if i not in self.out:
                context = self._position(i, d)
                if not (lag and scheduled_before):
                    context_before, scheduled_before = context, 0
                reach = hold.reach(context_before, self.trimmed.get(i, width), scheduled_before)
                need[i] = max(-(-reach // block) - blocks, 0)  # (a table never shrinks)
                started[i] = context
                due += need[i]
            due -= self._crossed(i)
        self.need, self.started = need, started
        return due

    def held(self, i: int) -> int:
        """The blocks decoding sequence i holds once the step composed last has taken its own."""
        counted = self.counted.get(i)
        if counted is not None:
            return counted[0] + self.need.get(i, 0)
        return -(-(self._position(i, self.start) + self.span) // self.block)

    def preempted(self, i: int) -> tuple[int, int]:
        """Decoding sequence i leaves before the step composed last takes its blocks: (the blocks that step
        would have taken for it, the blocks it holds)."""
        counted = self.counted.get(i)
        if counted is not None:
            taken = self.need.get(i, 0)
            self.leave(i)
            return taken, counted[0]
        return self._crossed(i), -(-self._position(i, self.start) // self.block)

    def _alone(self, i: int, scheduled_before: int) -> None:
        """Sequence i, counted alone from now on if it was not: it followed the rule, so it ran the step before
        (`scheduled_before` its tokens there), and holds the blocks of its table then."""
        if i not in self.counted:
            self.counted[i] = [self.held(i), 0, scheduled_before, self._position(i, self.ticks[-1])]

    def sit_out(self, i: int) -> None:
        """Decoding sequence i takes no part in the step about to be composed (before `due`): its table stays."""
        self._alone(i, 0)
        self.out.add(i)

    def trim(self, i: int, tokens: int) -> None:
        """Decoding sequence i runs `tokens` verify tokens in the step about to be composed (before `due`)."""
        self._alone(i, self.hold.width)
        self.trimmed[i] = tokens

    def pause(self, i: int) -> int:
        """Decoding sequence i takes no part in the step composed last after all (after `due`): returns the
        blocks that step took for it, which it gives back, its table staying where it was."""
        counted = self.counted.get(i)
        if counted is not None:
            taken = self.need.pop(i, 0)
        else:  # (counted alone from now on, holding its table before the step)
            taken = self._crossed(i)
            self.counted[i] = [-(-self._position(i, self.start) // self.block), 0, 0, 0]
        self.out.add(i)
        return taken

    def enter(self, i: int, blocks: int) -> None:
        """Request i decodes from the next step on, holding `blocks` (its prompt's)."""
        self.counted[i] = [blocks, 0, 0, 0]

    def leave(self, i: int) -> None:
        """Request i no longer decodes (finished, preempted or aborted), its blocks given back."""
        self.counted.pop(i, None)
        self.need.pop(i, None)
        self.trimmed.pop(i, None)
        self.out.discard(i)

    def stepped(self, d: int) -> None:
        """The step composed at tick d has run: the sequences counted alone that took part hold its blocks; those
        that have run full steps enough back to back follow the rule again."""
        entry_steps, width, need = self.hold.entry_steps, self.hold.width, self.need
        for i, counted in list(self.counted.items()):
            taken = need.get(i)
            if taken is None:  # (it took no part: out, or a step without decodes)
                counted[1] = counted[2] = 0
                continue
            scheduled = self.trimmed.get(i, width)
            counted[0] += taken
            counted[1] = counted[1] + 1 if scheduled == width else 0
            counted[2], counted[3] = scheduled, self.started[i]
            if counted[1] >= entry_steps:
                del self.counted[i]
        self.need, self.started, self.trimmed, self.out = {}, {}, {}, set()
        if self.reaching is not None:  # (the step ran decodes)
            self.reference, self.reaching = self.reaching, None
        self.ticks = [*self.ticks[-1:], d]
