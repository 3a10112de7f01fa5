"""Hugging Face tokenizer.json files, read with the `tokenizers` library, also the reference.

Two decoder families are supported: ByteLevel (GPT-2, Llama 3, Qwen: tokens are bytes spelled with a
printable alphabet) and the SentencePiece-style chain (Replace or Metaspace, then ByteFallback, Fuse,
Strip). Other decoders (WordPiece, BPE suffixes, CTC) are refused with a clear message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config.errors import UserError
from tokenpath.delivery.bytestream import ByteTable
from tokenpath.delivery.piecestream import PieceTable
from tokenpath.delivery.stream import Table

SUPPORTED = "ByteLevel, or Replace/Metaspace followed by ByteFallback, Fuse and Strip"


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable spelling of the 256 bytes: character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _token_bytes(token: str, alphabet: dict[str, int]) -> bytes:
    """ByteLevel's decoder: a token spelled in the alphabet is those bytes, any other is its UTF-8."""
    try:
        return bytes([alphabet[c] for c in token])
    except KeyError:
        return token.encode()


def _piece_maps(steps: list[dict], path: Path) -> tuple[list[Callable[[str, bool], str]], bool, str, int]:
    """Per-token maps, then whether ByteFallback runs, and Strip's (character, count)."""
    maps: list[Callable[[str, bool], str]] = []
    byte_fallback, strip_char, strip_count = False, " ", 0
    stage = 0  # 0: maps, 1: ByteFallback seen, 2: Fuse seen, 3: Strip seen
    for step in steps:
        kind = step.get("type")
        if kind == "Replace" and stage == 0 and isinstance(step.get("pattern"), dict) and "String" in step["pattern"]:
            old, new = step["pattern"]["String"], step.get("content", "")
            maps.append(lambda s, first, old=old, new=new: s.replace(old, new))
        elif kind == "Metaspace" and stage == 0:
            char = step.get("replacement", "\u2581")
            scheme = step.get("prepend_scheme", "always" if step.get("add_prefix_space", True) else "never")
            drop_first = scheme != "never"
            maps.append(lambda s, first, c=char, d=drop_first: s.replace(c, "") if first and d else s.replace(c, " "))
        elif kind == "ByteFallback" and stage == 0:
            byte_fallback, stage = True, 1
        elif kind == "Fuse" and stage <= 1:  # the stream always joins pieces; Fuse only orders the steps
            stage = 2
        elif kind == "Strip" and stage == 2 and int(step.get("stop", 0)) == 0:
            strip_char, strip_count, stage = step.get("content", " "), int(step.get("start", 0)), 3
        else:
            raise UserError(f"tokenizer {path}: decoder step {_describe(step)} is not supported here; "
                            f"supported decoders: {SUPPORTED}")
    return maps, byte_fallback, strip_char, strip_count


def _describe(step: dict) -> str:
    return repr(step.get("type")) + (" (with a regex pattern)" if step.get("type") == "Replace" else "")


def hf_table(path: Path, skip_special_tokens: bool) -> tuple[Table, Any]:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # the library raises a bare Exception for any malformed file
        raise UserError(f"tokenizer {path}: the tokenizers library cannot read it ({str(error).strip()}); "
                        "pass a valid tokenizer.json") from None
    decoder = json.loads(tokenizer.to_str()).get("decoder")
    if decoder is None:
        raise UserError(f"tokenizer {path}: has no decoder; supported decoders: {SUPPORTED}")
    steps = decoder["decoders"] if decoder.get("type") == "Sequence" else [decoder]
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    size = max(vocab.values(), default=-1) + 1
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    invalid = np.array([t is None for t in tokens], bool)
    specials = {a.content for a in tokenizer.get_added_tokens_decoder().values() if a.special}
    skipped = [skip_special_tokens and t in specials for t in tokens]
    tokens = [t or "" for t in tokens]
    if any(step.get("type") == "ByteLevel" for step in steps):
        if len(steps) != 1:
            raise UserError(f"tokenizer {path}: ByteLevel combined with other decoder steps is not supported; "
                            f"supported decoders: {SUPPORTED}")
        alphabet = byte_level_alphabet()
        raw = [b"" if skip else _token_bytes(t, alphabet) for t, skip in zip(tokens, skipped)]
        return ByteTable.build(path.name, raw, [False] * size, invalid), tokenizer
    maps, byte_fallback, strip_char, strip_count = _piece_maps(steps, path)

    def mapped(token: str, first: bool) -> str:
        for apply in maps:
            token = apply(token, first)
        return token

    piece = [mapped(t, False) for t in tokens]
    first_piece = [mapped(t, True) for t in tokens]
    table = PieceTable.build(path.name, piece, first_piece, skipped, invalid, byte_fallback, strip_char, strip_count)
    return table, tokenizer


class HfReference:
    """The tokenizers library's encode (no added special tokens) and full decode."""

    def __init__(self, tokenizer, skip_special_tokens: bool) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.library = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=self.skip)
