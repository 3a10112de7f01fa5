"""SentencePiece models, decoded as the sentencepiece library does.

Pieces show with U+2581 as a space. Byte pieces (<0xE4>) gather into runs, decoded with one U+FFFD
per invalid byte when any other piece (control tokens included) ends the run. The first piece that
starts with U+2581 loses it, as long as nothing visible came before it (the "dummy prefix" rule; with
`remove_extra_whitespaces` every leading U+2581 piece loses it). Control pieces show as nothing, or
as their piece when special tokens are shown.
"""

from __future__ import annotations

from codecs import utf_8_decode
from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.stream import BatchStream, Table
from tokenpath.delivery.utf8 import REPLACEMENT, decode_per_byte

NORMAL, BYTE, CONTROL, UNKNOWN = 0, 1, 2, 3
SPACE_SYMBOL = "\u2581"


@dataclass(eq=False)
class SpmTable(Table):
    kind: list[int]
    piece_text: list[str]      # U+2581 shown as a space
    stripped: list[str]        # the same, without one leading U+2581
    starts_space: list[bool]
    byte: list[bytes]          # the byte of a byte piece
    strip_first: bool          # the model strips the leading space of the first piece
    strip_all_leading: bool    # ... of every piece until something is visible (remove_extra_whitespaces)

    @classmethod
    def build(cls, name: str, pieces: list[str], kind: list[int], unknown_text: str, show_control: bool,
              strip_first: bool, strip_all_leading: bool) -> SpmTable:
        n = len(pieces)
        piece_text, stripped, starts, byte = [], [], [], []
        normal_text, slow = [], np.zeros(n, bool)
        for i, (piece, k) in enumerate(zip(pieces, kind)):
            b = bytes([int(piece[3:5], 16)]) if k == BYTE else b""
            piece_text.append(piece.replace(SPACE_SYMBOL, " "))
            stripped.append(piece[1:].replace(SPACE_SYMBOL, " ") if piece.startswith(SPACE_SYMBOL) else piece_text[-1])
            starts.append(piece.startswith(SPACE_SYMBOL))
            byte.append(b)
            if k == NORMAL:
                text = piece_text[-1]
            elif k == CONTROL:
                text = piece if show_control else ""
            elif k == UNKNOWN:
                text = unknown_text
            else:
                value = b[0]
                slow[i] = 0xC2 <= value <= 0xF4  # could start a character: held until the run decides
                text = "" if slow[i] else chr(value) if value < 0x80 else REPLACEMENT
            normal_text.append(text)
        text, code = Table.shifted(normal_text, slow)
        return cls(name=name, size=n, text=text, code=code, starts_slow=strip_first or strip_all_leading,
                   kind=list(kind), piece_text=piece_text, stripped=stripped, starts_space=starts, byte=byte,
                   strip_first=strip_first, strip_all_leading=strip_all_leading)

    def stream(self, n: int) -> SpmStream:
        return SpmStream(self, n)


class SpmStream(BatchStream):
    """Per sequence: the held bytes of an open run, and sentencepiece's leading-space state."""

    def __init__(self, table: SpmTable, n: int) -> None:
        super().__init__(table, n)
        self._t = table
        self._bos_start = table.strip_first or table.strip_all_leading
        self._held = [b""] * n
        self._bos = [self._bos_start] * n   # the next piece may still lose its leading space
        self._seen = [False] * n     # the previous piece lost one
        self._shown = [False] * n    # the decoded text is not empty

    def _slow_rows(self, rows: list[int], tokens: list[int], out: list[str]) -> None:
        flags, held, byte, kind, bos, shown = (self._flags, self._held, self._t.byte, self._t.kind,
                                               self._bos, self._shown)
        for i, token in zip(rows, tokens):
            if token < 0:
                continue
            if not flags[i]:             # the normal state: only a byte that starts a character is slow
                held[i] = byte[token]
                flags[i] = 1
                shown[i] = True
                bos[i] = False
            elif kind[token] == BYTE and not bos[i]:   # the next byte of a held character
                data = held[i] + byte[token]
                text, used = utf_8_decode(data, "replace", False)
                if REPLACEMENT in text:
                    text, rest = decode_per_byte(data, False)
                else:
                    rest = data[used:]
                out[i], held[i] = text, rest
                flags[i] = 1 if rest else 0
            else:
                out[i] = self._slow(i, token)

    def _slow(self, i: int, token: int) -> str:
        if token < 0:
            return ""
        t = self._t
        kind = t.kind[token]
        if kind == BYTE:
            self._shown[i] = True
            self._bos[i] = False
            text, held = decode_per_byte(self._held[i] + t.byte[token], False)
            self._held[i] = held
            self._flags[i] = 1 if held else 0
            return text
        out = decode_per_byte(self._held[i], True)[0] if self._held[i] else ""
        self._held[i] = b""
        if self._seen[i] or self._shown[i]:
            self._bos[i] = False
        seen = False
        if kind == CONTROL:
            out += t.text[token + 1]
        elif kind == NORMAL and self._bos[i] and t.starts_space[token]:
            piece = t.stripped[token]
            seen = not t.strip_all_leading
            out += piece
            self._shown[i] = self._shown[i] or bool(piece)
        else:
            piece = t.piece_text[token] if kind == NORMAL else t.text[token + 1]
            out += piece
            self._shown[i] = self._shown[i] or bool(piece)
        self._seen[i] = seen
        if self._bos[i] and (seen or self._shown[i]):
            self._bos[i] = False
        self._flags[i] = 1 if self._bos[i] else 0
        return out

    def _flush(self, i: int) -> str:
        return decode_per_byte(self._held[i], True)[0]

    def _reset(self, i: int) -> None:
        self._held[i] = b""
        self._bos[i] = self._bos_start
        self._seen[i] = False
        self._shown[i] = False
