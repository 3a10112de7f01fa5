"""The tokenizer prompts are measured with: anything with `encode(text)` and `decode(ids)`.

`load_tokenizer(None)` gives the project's default (Tekken, as the delivery layer embeds it);
`load_tokenizer("tokenizer.json")` reads a Hugging Face `tokenizer.json` or a Tekken file.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from typing import Any, Protocol

from tokenpath.config.errors import UserError


class Tokenizer(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class _HfTokenizer:
    """A Hugging Face `tokenizers.Tokenizer`, without special tokens."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self.name = name

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids), skip_special_tokens=False)


class _Tekken:
    """mistral-common's Tekkenizer, without BOS/EOS."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self.name = name

    def encode(self, text: str) -> list[int]:
        return self._inner.encode(text, bos=False, eos=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids))


def _tekken_default_path() -> str:
    try:
        import mistral_common
    except ImportError:
        raise UserError("the default tokenizer needs mistral-common; `pip install mistral-common` "
                        "or pass --tokenizer tokenizer.json") from None
    return os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")


def _from_file(path: str) -> Tokenizer:
    try:
        with open(path, "rb") as file:
            head = json.load(file)
    except FileNotFoundError:
        raise UserError(f"--tokenizer: {path} not found; give the path to a tokenizer.json") from None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise UserError(f"--tokenizer: {path} is not a readable tokenizer.json ({error.__class__.__name__}); "
                        "give a Hugging Face or Tekken tokenizer.json") from None
    if not isinstance(head, dict):
        raise UserError(f"--tokenizer: {path} is not a tokenizer.json (top level is not an object)")
    if "config" in head and "vocab" in head:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        try:
            return _Tekken(Tekkenizer.from_file(path), os.path.basename(path))
        except Exception as error:  # noqa: BLE001 - a broken file, reported in one line
            raise UserError(f"--tokenizer: {path}: cannot load as a Tekken tokenizer: {error}") from None
    if "model" in head:
        from tokenizers import Tokenizer as HfTokenizer

        try:
            return _HfTokenizer(HfTokenizer.from_file(path), os.path.basename(path))
        except Exception as error:  # noqa: BLE001
            raise UserError(f"--tokenizer: {path}: cannot load as a Hugging Face tokenizer: {error}") from None
    raise UserError(f"--tokenizer: {path} is neither a Hugging Face tokenizer.json (no 'model') "
                    "nor a Tekken file (no 'config'/'vocab')")


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> Tokenizer:
    """The tokenizer at `path` (a `tokenizer.json`), or the default Tekken for None."""
    if path is not None and os.path.isdir(path):
        raise UserError(f"--tokenizer: {path} is a folder; give the path to the tokenizer.json in it")
    if path is not None and not os.path.isfile(path):
        raise UserError(f"--tokenizer: {path} not found; give the path to a tokenizer.json")
    try:
        from tokenpath.delivery import Detokenizer  # type: ignore[attr-defined]
    except ImportError:
        Detokenizer = None
    if Detokenizer is not None and hasattr(Detokenizer, "load"):
        try:
            return Detokenizer.load(path)
        except UserError:
            if path is None:
                raise
            # The streaming detokenizer supports fewer decoders than prompts need (encode and decode
            # only): read the file with its own library instead, and keep the first error if that fails.
            try:
                return _from_file(path)
            except UserError:
                pass
            raise
    if path is None:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        return _Tekken(Tekkenizer.from_file(_tekken_default_path()), "tekken")
    return _from_file(path)


def tokenizer_name(tokenizer: Tokenizer, path: str | None) -> str:
    return getattr(tokenizer, "name", None) or (os.path.basename(path) if path else "tekken")
