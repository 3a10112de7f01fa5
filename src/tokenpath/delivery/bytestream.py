"""Byte-level tokenizers (Tekken, Hugging Face ByteLevel): every token is a string of bytes.

The full decode is the concatenation of the tokens' bytes decoded with replacement. Tekken decodes
the runs between special tokens separately, so a special token also ends the run: an unfinished
character before it shows as U+FFFD. A Hugging Face special token that is skipped is simply absent.
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenpath.delivery.stream import BatchStream, Table


@dataclass(eq=False)
class ByteTable(Table):
    raw: list[bytes]       # per id: the bytes it adds
    breaks: list[bool]     # per id: ends the byte run before it (Tekken special tokens)
    tails: list[bytes]     # per id: its trailing unfinished character (shown text is the rest)

    @classmethod
    def build(cls, name: str, raw: Sequence[bytes], breaks: Sequence[bool],
              invalid: np.ndarray | None = None) -> ByteTable:
        texts, tails, slow = [], [], np.zeros(len(raw), bool)
        for i, data in enumerate(raw):
            text, used = utf_8_decode(data, "replace", False)
            texts.append(text)
            tails.append(data[used:])
            slow[i] = used != len(data)
        text, code = Table.shifted(texts, slow, invalid)
        return cls(name=name, size=len(raw), text=text, code=code, starts_slow=False,
                   raw=list(raw), breaks=list(breaks), tails=tails)

    def stream(self, n: int) -> ByteStream:
        return ByteStream(self, n)


class ByteStream(BatchStream):
    def __init__(self, table: ByteTable, n: int) -> None:
        super().__init__(table, n)
        self._raw, self._breaks, self._shown, self._tails = table.raw, table.breaks, table.text, table.tails
        self._held = [b""] * n

    def _slow_rows(self, rows: list[int], tokens: list[int], out: list[str]) -> None:
        held, raw, tails, breaks, flags = self._held, self._raw, self._tails, self._breaks, self._flags
        for i, token in zip(rows, tokens):
            if token < 0:
                continue                                   # out[i] is already ""
            if not flags[i]:                               # out[i] is already the token's finished part
                held[i] = tails[token]
                flags[i] = 1
            elif breaks[token]:
                out[i] = self._slow(i, token)
            else:
                data = held[i] + raw[token]
                text, used = utf_8_decode(data, "replace", False)
                out[i] = text
                if used == len(data):
                    held[i] = b""
                    flags[i] = 0
                else:
                    held[i] = data[used:]

    def _slow(self, i: int, token: int) -> str:
        if token < 0:
            return ""
        if self._breaks[token]:
            text = utf_8_decode(self._held[i], "replace", True)[0] + self._shown[token + 1]
            self._held[i] = b""
            self._flags[i] = 0
            return text
        data = self._held[i] + self._raw[token]
        text, used = utf_8_decode(data, "replace", False)
        held = self._held[i] = data[used:]
        self._flags[i] = 1 if held else 0
        return text

    def _flush(self, i: int) -> str:
        return utf_8_decode(self._held[i], "replace", True)[0]

    def _reset(self, i: int) -> None:
        self._held[i] = b""
