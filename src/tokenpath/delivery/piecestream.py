"""Hugging Face piece decoders: Replace / Metaspace, then ByteFallback, Fuse and Strip.

This is the decoder chain of SentencePiece-style tokenizer.json files (Llama 2, Mistral, Gemma).
Token strings pass through the per-token replacements (Metaspace drops its replacement character
from the first token instead). Consecutive "<0xAB>" tokens form a byte run that the full decode shows
as its text if the whole run is valid UTF-8, else as one U+FFFD per byte. Strip after Fuse removes up
to `start` leading copies of a character from the whole text.

The stream releases text as the tokenizers library's DecodeStream does (vLLM's detokenizer; SGLang's
detokenizer_manager.py makes the same test): as soon as the text not yet shown is not empty and does
not end in U+FFFD. A byte run shows its characters as they complete ("<0x0A>" at once, an emoji at its
last byte) and holds only an unfinished character, or, once a byte makes it invalid, the rest of the
run until a token ends it. Its text equals the full decode, but for a run that turns invalid after part
of it has shown: the part shown stays, the bytes held show one U+FFFD each (DecodeStream raises there,
and vLLM starts a new one: its issue 17448).
"""

from __future__ import annotations

from codecs import utf_8_decode
from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.stream import BatchStream, Table
from tokenpath.delivery.utf8 import REPLACEMENT


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
        # In the normal state (nothing held) an ASCII byte shows at once; any other byte starts or breaks a
        # character, and a piece ending in U+FFFD is held as DecodeStream holds it.
        texts = ["" if skip or b >= 0x80 else chr(b) if b >= 0 else p for p, b, skip in zip(piece, byte, skipped)]
        slow = np.array([not skip and (b >= 0x80 or b < 0 and p.endswith(REPLACEMENT))
                         for p, b, skip in zip(piece, byte, skipped)], bool)
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


def _run_text(run: bytes) -> str:
    """ByteFallback's text of a run: the run decoded if it is all valid UTF-8, else U+FFFD per byte."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return REPLACEMENT * len(run)


class PieceStream(BatchStream):
    """Per sequence: whether the decoder has seen a token, the open run's bytes not yet shown, whether they
    can no longer become text, the text of ended tokens not yet shown, what Strip may still take."""

    def __init__(self, table: PieceTable, n: int) -> None:
        super().__init__(table, n)
        self._t = table
        self._first = [True] * n
        self._held = [b""] * n
        self._broken = [False] * n
        self._pending = [""] * n
        self._strip = [table.strip_count] * n

    def _slow_rows(self, rows: list[int], tokens: list[int], out: list[str]) -> None:
        flags, held, broken, byte = self._flags, self._held, self._broken, self._t.byte
        for i, token in zip(rows, tokens):
            if token < 0:
                continue
            b = byte[token]
            if not flags[i] and b >= 0x80:  # the normal state: a byte that is no character alone opens a run
                held[i] = bytes((b,))
                broken[i] = not 0xC2 <= b <= 0xF4
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
            held = self._held[i] = self._held[i] + bytes((byte,))
            self._flags[i] = 1
            if self._broken[i]:
                return ""
            try:
                text, used = utf_8_decode(held, "strict", False)
            except UnicodeDecodeError:   # no later byte makes the run text: held until a token ends it
                self._broken[i] = True
                return ""
            if used < len(held):         # an unfinished character
                return ""
            return self._release(i, self._pending[i] + text, True)
        text = self._pending[i] + (_run_text(self._held[i]) if self._held[i] else "") + piece
        self._held[i], self._broken[i] = b"", False
        return self._release(i, text, False)

    def _release(self, i: int, text: str, in_run: bool) -> str:
        """Show `text` (all not yet shown) unless Strip leaves nothing or it ends in U+FFFD: then hold it,
        as DecodeStream does; a run's bytes stay held with it, so a later byte may still break them."""
        left = self._strip[i]
        shown, rest = self._stripped(text, left) if left else (text, 0)
        if not shown or shown.endswith(REPLACEMENT):
            if not in_run:
                self._pending[i] = text
            self._flags[i] = 1 if self._pending[i] or self._held[i] or left else 0
            return ""
        self._strip[i], self._pending[i], self._held[i] = rest, "", b""
        self._flags[i] = 1 if rest else 0
        return shown

    def _stripped(self, text: str, left: int) -> tuple[str, int]:
        """Strip's cut of up to `left` leading characters: the rest of the text, and what it may still take."""
        char, cut = self._t.strip_char, 0
        while cut < left and cut < len(text) and text[cut] == char:
            cut += 1
        return text[cut:], 0 if cut < len(text) else left - cut

    def _flush(self, i: int) -> str:
        text = self._pending[i] + (_run_text(self._held[i]) if self._held[i] else "")
        return self._stripped(text, self._strip[i])[0] if self._strip[i] else text

    def _reset(self, i: int) -> None:
        self._first[i] = True
        self._held[i], self._broken[i], self._pending[i] = b"", False, ""
        self._strip[i] = self._t.strip_count
