"""The batched stream: one id per sequence per engine step in, each sequence's new visible text out.

Every id has a precomputed text and a flag saying whether that text is final on its own. A step
gathers the texts of the whole batch at once (numpy for the flags, one C-level gather for the strings);
only sequences whose token is not final alone, or that still hold unfinished bytes or have not
passed their first piece, take the per-sequence slow path of their tokenizer family.

Tables are indexed by id + 1 and gathered with clipping: a negative id ("no token this step") lands on
entry 0, an id past the vocabulary on a last entry that marks it invalid, so one `take` both gathers
and checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tokenpath.config.errors import UserError

FAST, SLOW, INVALID = 0, 1, 2
# Prompt tokens an output stream starts after (`BatchStream.prime`): SGLang decodes from 5 prompt tokens
# back (INIT_INCREMENTAL_DETOKENIZATION_OFFSET, Req.init_incremental_detokenize in
# srt/managers/schedule_batch.py); vLLM from 4 or more (FastIncrementalDetokenizer.__init__ in
# vllm/v1/engine/detokenizer.py). Enough for the leading-space rules, which only ask whether the
# prompt showed anything.
CONTEXT_TOKENS = 5


class TokenIdError(UserError):
    """Ids outside the vocabulary. `sequences` and `ids` say which; the stream is left unchanged."""

    def __init__(self, tokenizer: str, size: int, sequences: list[int], ids: list[int]) -> None:
        self.sequences, self.ids = sequences, ids
        shown = ", ".join(f"id {t} at sequence {s}" for s, t in list(zip(sequences, ids))[:3])
        more = f" (and {len(ids) - 3} more)" if len(ids) > 3 else ""
        super().__init__(
            f"{tokenizer}: {shown}{more} outside the vocabulary (ids 0..{size - 1}); "
            "send ids the model's tokenizer produced, or -1 for no token"
        )


@dataclass(eq=False)
class Table:
    """What every family shares: per-id text in the normal state and the fast/slow/invalid code."""

    name: str
    size: int
    text: list[str]        # index id + 1; entry 0 is "no token"
    code: np.ndarray       # uint8, index id + 1; last entry catches out-of-range ids
    starts_slow: bool      # sequences begin in a state the fast path does not cover

    @property
    def strings(self) -> np.ndarray:
        """`text` as an object array: numpy's take gathers a batch of strings fastest."""
        if not hasattr(self, "_strings"):
            self._strings = np.array(self.text, dtype=object)
        return self._strings

    @staticmethod
    def shifted(texts: Sequence[str], slow: np.ndarray,
                invalid: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
        """Tables for ids 0..n-1 in the id + 1 layout, with the "no token" and out-of-range entries."""
        code = np.full(len(texts) + 2, INVALID, np.uint8)
        code[0] = FAST
        code[1:-1] = np.where(slow, SLOW, FAST)
        if invalid is not None:
            code[1:-1][invalid] = INVALID
        return ["", *texts, ""], code


class BatchStream:
    """n sequences decoded step by step. Subclasses add their family's slow path."""

    def __init__(self, table: Table, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batch needs at least one sequence, got {n}")
        self.n = n
        self._table = table
        self._strings = table.strings
        self._code = table.code
        self._start = SLOW if table.starts_slow else FAST
        # Per-sequence state, 1 where the fast path does not apply. A bytearray viewed by numpy: the slow
        # paths set single entries cheaply, the fast path ORs the whole array in one call.
        self._flags = bytearray([self._start]) * n
        self._state = np.frombuffer(self._flags, np.uint8)
        self._index = np.empty(n, np.int64)
        self._codes = np.empty(n, np.uint8)
        self._all_fast = bytes(n)

    def step(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        """New visible text of each sequence after one more id each (-1 or any negative: none)."""
        ids = np.asarray(ids)
        if ids.shape != (self.n,):
            raise ValueError(f"step takes one id per sequence: shape ({self.n},), got {ids.shape}")
        if ids.dtype != np.int64:
            if ids.dtype.kind not in "iu":
                raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
            ids = ids.astype(np.int64)
        index, codes = self._index, self._codes
        np.add(ids, 1, out=index)                        # negatives clip to entry 0, too large to the last
        self._code.take(index, out=codes, mode="clip")
        np.bitwise_or(codes, self._state, out=codes)
        out = self._strings.take(index, mode="clip").tolist()
        if codes.tobytes() == self._all_fast:
            return out
        rows = codes.nonzero()[0]
        if codes.tobytes().translate(None, b"\x00\x01"):  # some code is INVALID (2, or 3 with a state)
            self._check(ids)
        self._slow_rows(rows.tolist(), ids[rows].tolist(), out)
        return out

    def _slow_rows(self, rows: list[int], tokens: list[int], out: list[str]) -> None:
        """Fill out[i] for the slow rows; tokens[k] is row k's id (negative: none)."""
        slow = self._slow
        for i, token in zip(rows, tokens):
            out[i] = slow(i, token)

    def _check(self, ids: np.ndarray) -> None:
        """Raise for ids outside the vocabulary, before any state has changed."""
        bad = [(i, t) for i, t in enumerate(ids.tolist())
               if t >= self._table.size or t >= 0 and self._code[t + 1] == INVALID]
        if bad:
            raise TokenIdError(self._table.name, self._table.size, [i for i, _ in bad], [t for _, t in bad])

    def prime(self, i: int, ids: Sequence[int]) -> None:
        """Start sequence i after `ids`, the prompt's last tokens, as an engine's detokenizer starts an
        output: in context. What the prompt shows is dropped; the output then streams as decode(prompt +
        output) shows it past decode(prompt), so with SentencePiece or Metaspace its first piece keeps its
        leading space, and a character the prompt left unfinished completes in the output. vLLM feeds the
        prompt's tail into its DecodeStream (FastIncrementalDetokenizer.__init__ in
        vllm/v1/engine/detokenizer.py); SGLang decodes from the prompt's tail (Req.init_incremental_detokenize
        in srt/managers/schedule_batch.py). Call it on a new or finished sequence; a stream never primed
        decodes a whole text from its start, as `Detokenizer.decode` does."""
        ids = [int(t) for t in ids]
        bad = [t for t in ids if not 0 <= t < self._table.size or self._code[t + 1] == INVALID]
        if bad:
            raise TokenIdError(self._table.name, self._table.size, [i] * len(bad), bad)
        scratch = [""] * self.n
        for token in ids:
            if self._code[token + 1] | self._flags[i]:
                self._slow_rows([i], [token], scratch)

    def finish(self, which: int | Iterable[int] | None = None) -> list[str]:
        """End sequences (all, or those in `which`): their held tails, flushed as the full decode shows them.

        Their slots start fresh sequences afterwards.
        """
        rows = range(self.n) if which is None else [which] if isinstance(which, (int, np.integer)) else list(which)
        tails = []
        for i in rows:
            i = int(i)
            tails.append(self._flush(i))
            self._reset(i)
            self._flags[i] = self._start
        return tails

    # Family hooks -------------------------------------------------------------------------------
    def _slow(self, i: int, token: int) -> str:
        """Text of sequence i after `token` (-1: none) when the fast path does not apply."""
        raise NotImplementedError

    def _flush(self, i: int) -> str:
        """What sequence i still holds, as the full decode of the finished sequence shows it."""
        raise NotImplementedError

    def _reset(self, i: int) -> None:
        raise NotImplementedError
