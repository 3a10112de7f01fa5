"""Tekken tokenizer files (mistral-common's tekken*.json): tiktoken-style base64 token bytes.

Ids 0..N-1 are the special tokens; id N + r is the vocabulary entry of rank r (read from
mistral-common's `Tekkenizer`, which is also the reference decoder).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenpath.config.errors import UserError
from tokenpath.delivery.bytestream import ByteTable


def is_tekken(document: Any) -> bool:
    return (isinstance(document, dict) and isinstance(document.get("vocab"), list)
            and isinstance(document.get("config"), dict))


def _special_names(document: dict, count: int) -> list[str]:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    listed = document.get("special_tokens")
    if listed is None:
        listed = Tekkenizer.DEPRECATED_SPECIAL_TOKENS
    names = [entry["token_str"] for entry in listed][:count]
    names += [Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i) for i in range(len(names), count)]
    return names


def tekken_table(path: Path, document: dict, skip_special_tokens: bool) -> ByteTable:
    name = path.name
    try:
        config = document["config"]
        size = int(config["default_vocab_size"])
        specials = int(config["default_num_special_tokens"])
        vocab = document["vocab"][: size - specials]
        if len(vocab) < size - specials or specials < 0:
            raise ValueError(f"{len(vocab)} vocabulary entries for {size - specials} regular ids")
        raw = [b""] * specials if skip_special_tokens else [s.encode() for s in _special_names(document, specials)]
        raw += [base64.b64decode(entry["token_bytes"]) for entry in vocab]
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"tokenizer {path}: not a valid Tekken file ({error}); "
                        "pass a tekken*.json from mistral-common or a tokenizer.json") from None
    breaks = [True] * specials + [False] * (size - specials)
    return ByteTable.build(name, raw, breaks)


@lru_cache(maxsize=4)
def _tekkenizer(path: Path, mtime_ns: int):
    """One Tekkenizer per file: building its tiktoken encoder takes seconds."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(path)


class TekkenReference:
    """mistral-common's own Tekken encode and full decode."""

    def __init__(self, path: Path, skip_special_tokens: bool) -> None:
        self.path, self.skip = path, skip_special_tokens

    @property
    def library(self):
        return self._tokenizer

    @property
    def _tokenizer(self):
        return _tekkenizer(self.path, self.path.stat().st_mtime_ns)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, bos=False, eos=False)

    def decode(self, ids: Sequence[int]) -> str:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        policy = SpecialTokenPolicy.IGNORE if self.skip else SpecialTokenPolicy.KEEP
        return self._tokenizer.decode(list(ids), special_token_policy=policy)
