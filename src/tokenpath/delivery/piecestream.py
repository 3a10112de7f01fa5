"""Hugging Face piece decoders: Replace / Metaspace, then ByteFallback, Fuse and Strip.

This is the decoder chain of SentencePiece-style tokenizer.json files (Llama 2, Mistral, Gemma).
Token strings pass through the per-token replacements (Metaspace drops its replacement character
from the first token instead). Consecutive "<0xAB>" tokens form a byte run that shows as its text if
the whole run is valid UTF-8, else as one U+FFFD per byte, so a run is held until a token ends it.
Strip after Fuse removes up to `start` leading copies of a character from the whole text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.stream import BatchStream, Table


@dataclass(eq=False)
class PieceTable(Table):
    skipped: list[bool]        # removed before the decoder (special tokens, when skipped)
    piece: list[str]           # per id, after the per-token replacements
    first_piece: list[str]     # the same when it is the first token the decoder sees
    byte: list[int]            # the byte of a "<0xAB>" token (after replacement), else -1
    first_byte: list[int]
    strip_char: str
    strip_count: int

    @classmethod
    def build(cls, name: str, piece: list[str], first_piece: list[str], skipped: list[bool],
              invalid: np.ndarray, byte_fallback: bool, strip_char: str, strip_count: int) -> PieceTable:
        byte = [_byte_of(p) if byte_fallback else -1 for p in piece]
        first_byte = [_byte_of(p) if byte_fallback else -1 for p in first_piece]
        texts = ["" if skip or b >= 0 else p for p, b, skip in zip(piece, byte, skipped)]
        slow = np.array([b >= 0 and not skip for b, skip in zip(byte, skipped)], bool)
        text, code = Table.shifted(texts, slow, invalid)
        starts_slow = strip_count > 0 or piece != first_piece or byte != first_byte
        return cls(name=name, size=len(piece), text=text, code=code, starts_slow=starts_slow,
                   skipped=list(skipped), piece=piece, first_piece=first_piece, byte=byte,
                   first_byte=first_byte, strip_char=strip_char, strip_count=strip_count)

    def stream(self, n: int) -> PieceStream:
        return PieceStream(self, n)


def _byte_of(piece: str) -> int:
    """The byte of a ByteFallback token "<0xAB>", else -1 (the same test the decoder makes)."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return -1
    return -1


def _run_text(run: list[int]) -> str:
    data = bytes(run)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)


class PieceStream(BatchStream):
    """Per sequence: whether the decoder has seen a token, the open byte run, what Strip may still take."""

    def __init__(self, table: PieceTable, n: int) -> None:
        super().__init__(table, n)
        self._t = table
        self._first = [True] * n
        self._run: list[list[int]] = [[] for _ in range(n)]
        self._strip = [table.strip_count] * n

    def _slow_rows(self, rows: list[int], tokens: list[int], out: list[str]) -> None:
        flags, run, byte = self._flags, self._run, self._t.byte
        for i, token in zip(rows, tokens):
            if token < 0:
                continue
            if not flags[i]:             # the normal state: only a byte token is slow; it opens a run
                run[i] = [byte[token]]
                flags[i] = 1
            else:
                out[i] = self._slow(i, token)

    def _slow(self, i: int, token: int) -> str:
        t = self._t
        if token < 0 or t.skipped[token]:
            return ""
        if self._first[i]:
            self._first[i] = False
            piece, byte = t.first_piece[token], t.first_byte[token]
        else:
            piece, byte = t.piece[token], t.byte[token]
        if byte >= 0:
            self._run[i].append(byte)
            self._flags[i] = 1
            return ""
        out = piece
        if self._run[i]:
            out = _run_text(self._run[i]) + piece
            self._run[i] = []
        if self._strip[i]:
            out = self._stripped(i, out)
        self._flags[i] = 1 if self._strip[i] else 0
        return out

    def _stripped(self, i: int, text: str) -> str:
        left, char = self._strip[i], self._t.strip_char
        cut = 0
        while cut < left and cut < len(text) and text[cut] == char:
            cut += 1
        self._strip[i] = 0 if cut < len(text) else left - cut
        return text[cut:]

    def _flush(self, i: int) -> str:
        if not self._run[i]:
            return ""
        out = _run_text(self._run[i])
        return self._stripped(i, out) if self._strip[i] else out

    def _reset(self, i: int) -> None:
        self._first[i] = True
        self._run[i] = []
        self._strip[i] = self._t.strip_count
