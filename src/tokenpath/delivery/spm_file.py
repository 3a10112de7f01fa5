"""SentencePiece model files (.model), read with the sentencepiece library, also the reference.

The library does not expose its normalizer flags, so the leading-space rule is read off its own
decoder: whether a lone first "▁x" loses its space, and whether a first "▁" does too without stopping
the next piece from losing its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenpath.config.errors import UserError
from tokenpath.delivery.spmstream import BYTE, CONTROL, NORMAL, SPACE_SYMBOL, UNKNOWN, SpmTable


def open_model(path: Path):
    from sentencepiece import SentencePieceProcessor

    processor = SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError) as error:
        raise UserError(f"tokenizer {path}: neither JSON nor a SentencePiece model ({str(error).strip()}); "
                        "pass a tokenizer.json, a tekken*.json or a SentencePiece .model") from None
    return processor


def _leading_space_rule(sp, pieces: list[str], kind: list[int]) -> tuple[bool, bool]:
    """(strip_first, strip_all_leading) as the library's decoder behaves."""
    word = next((i for i, p in enumerate(pieces) if kind[i] == NORMAL and p.startswith(SPACE_SYMBOL)
                 and len(p) > 1 and SPACE_SYMBOL not in p[1:]), None)
    if word is None:
        return False, False
    strip_first = not sp.decode([word]).startswith(" ")
    space = sp.piece_to_id(SPACE_SYMBOL)
    if not strip_first or pieces[space] != SPACE_SYMBOL or kind[space] != NORMAL:
        return strip_first, False
    return True, not sp.decode([space, word]).startswith(" ")


def spm_table(path: Path, skip_special_tokens: bool) -> tuple[SpmTable, object]:
    sp = open_model(path)
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    kind = [BYTE if sp.is_byte(i) else CONTROL if sp.is_control(i) else UNKNOWN if sp.is_unknown(i) else NORMAL
            for i in range(n)]
    unknown = next((i for i in range(n) if kind[i] == UNKNOWN), None)
    unknown_text = sp.decode([unknown]) if unknown is not None else ""
    strip_first, strip_all = _leading_space_rule(sp, pieces, kind)
    table = SpmTable.build(path.name, pieces, kind, unknown_text, not skip_special_tokens, strip_first, strip_all)
    return table, sp


class SpmReference:
    """The sentencepiece library's encode and full decode (what mistral-common's SentencePieceTokenizer
    calls). It never shows control pieces; with special tokens shown they are inserted where they stand,
    which is exact because a control piece ends any byte run before it."""

    def __init__(self, processor, skip_special_tokens: bool) -> None:
        self.sp, self.skip = processor, skip_special_tokens
        self.library = processor

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(t) for t in ids]
        text = self.sp.decode(ids)
        if self.skip:
            return text
        parts, start = [], 0
        for j, t in enumerate(ids):
            if self.sp.is_control(t):
                end = len(self.sp.decode(ids[:j]))
                parts += [text[start:end], self.sp.id_to_piece(t)]
                start = end
        return "".join(parts) + text[start:]
