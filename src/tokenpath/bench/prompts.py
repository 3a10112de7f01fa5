"""Prompts of exact token lengths, cut from the text corpus the project ships.

The corpus is encoded once (repeated as often as the longest prompt needs); a prompt of `n` tokens is
a slice of those ids that starts at a word, decoded to text and re-encoded to check the count. Where
the slice's edges re-tokenize differently, the slice is lengthened or shortened until the text
encodes to exactly `n` tokens. Each prompt starts with a short tag unique to the request, so no two
prompts share a prefix (a server's prefix cache cannot make one look faster than it is).
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from tokenpath.bench.tokenizer import Tokenizer

# Prompts shorter than this get no tag: the tag would be most of the prompt.
_MIN_TAGGED_TOKENS = 8
_FIX_ROUNDS = 12
_STARTS_TRIED = 64


def corpus_text() -> str:
    """The shipped corpus: original prose, paragraphs separated by blank lines."""
    return (resources.files("tokenpath.bench") / "data" / "corpus.txt").read_text(encoding="utf-8")


class PromptBuilder:
    """Builds prompt texts that `tokenizer` encodes to an exact number of tokens."""

    def __init__(self, tokenizer: Tokenizer, text: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.text = (text if text is not None else corpus_text()).strip()
        if not self.text:
            raise ValueError("the prompt corpus is empty")
        self._unit = list(tokenizer.encode(self.text + "\n\n"))
        if not self._unit:
            raise ValueError("the tokenizer encodes the prompt corpus to no tokens")
        self._ids: list[int] = []
        self._pieces = [tokenizer.decode([token]) for token in self._unit]
        # Where decoding token by token gives the same text as decoding the whole (byte-level BPE on
        # this ASCII corpus), a slice of ids is a slice of the text: no decode per prompt.
        self._by_offset = "".join(self._pieces) == tokenizer.decode(self._unit)
        self._offsets: np.ndarray | None = None
        self._tiled = ""
        self._starts = self._word_starts()

    def _word_starts(self) -> np.ndarray:
        """Positions in one copy of the corpus whose token begins a word (a space or a new line)."""
        starts = [i for i, piece in enumerate(self._pieces) if piece[:1] in (" ", "\n")]
        return np.asarray(starts or [0], dtype=np.int64)

    def _slice(self, begin: int, take: int) -> str:
        if self._offsets is not None:
            return self._tiled[self._offsets[begin]:self._offsets[begin + take]]
        return self.tokenizer.decode(self._ids[begin:begin + take])

    def _ensure(self, length: int) -> None:
        """Make the encoded corpus long enough to take `length` tokens from any start."""
        need = len(self._unit) + length + 64
        if len(self._ids) >= need:
            return
        copies = -(-need // len(self._unit))
        # Encode the repeated text as a whole, so the joins tokenize as they would in one text.
        tiled = (self.text + "\n\n") * copies
        self._ids = list(self.tokenizer.encode(tiled))
        if self._by_offset:
            pieces = [self.tokenizer.decode([token]) for token in self._ids]
            if "".join(pieces) == tiled:
                self._tiled = tiled
                self._offsets = np.concatenate(([0], np.cumsum([len(piece) for piece in pieces]))).tolist()
            else:
                self._offsets = None

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def starts(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` random starting positions (at word starts) for `n` prompts."""
        return self._starts[rng.integers(0, len(self._starts), size=n)]

    def build(self, length: int, start: int = 0, tag: str = "") -> str:
        """Text that encodes to exactly `length` tokens: `tag`, then corpus text from token `start`."""
        if length < 1:
            raise ValueError(f"a prompt needs at least 1 token, got {length}")
        self._ensure(length + 2 * _FIX_ROUNDS)
        marker = tag if tag and length >= _MIN_TAGGED_TOKENS else ""
        marker_tokens = self.count(marker) if marker else 0
        if marker_tokens >= length:  # a tag as long as the prompt: leave it out, as for short prompts
            marker, marker_tokens = "", 0
        position = int(np.searchsorted(self._starts, start % len(self._unit)))
        for attempt in range(_STARTS_TRIED):
            begin = int(self._starts[(position + attempt) % len(self._starts)])
            take = max(length - marker_tokens, 0)
            seen: set[int] = set()
            for _ in range(_FIX_ROUNDS):
                if take in seen:
                    break
                seen.add(take)
                text = marker + self._slice(begin, take)
                got = self.count(text)
                if got == length:
                    return text
                take += length - got
                if take < 0:
                    break
        raise RuntimeError(f"no corpus slice encodes to exactly {length} tokens")

    def build_many(self, lengths: np.ndarray, rng: np.random.Generator, tag: str = "") -> list[str]:
        """One prompt per length, each from its own random start and tagged `tag` + its index."""
        self._ensure(int(lengths.max()) + 2 * _FIX_ROUNDS if len(lengths) else 1)
        starts = self.starts(len(lengths), rng)
        return [
            self.build(int(length), int(start), f"[{tag}{i}]")
            for i, (length, start) in enumerate(zip(lengths.tolist(), starts.tolist()))
        ]
