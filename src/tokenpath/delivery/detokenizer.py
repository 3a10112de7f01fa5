"""`Detokenizer`: load a tokenizer, stream token ids of a batch to visible text, and the reference decode.

Tokenizers come from files only: the embedded default is the Tekken tokenizer in mistral-common's data
folder; the SentencePiece models there can be named the same way; any other path may be a
tekken*.json, a SentencePiece .model or a Hugging Face tokenizer.json. Nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tokenpath.config.errors import UserError
from tokenpath.delivery.stream import INVALID, BatchStream, Table, TokenIdError

DEFAULT_TOKENIZER = "tekken_240911.json"


def embedded_folder() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data"


def embedded_names() -> list[str]:
    return sorted(p.name for p in embedded_folder().iterdir() if "tekken" in p.name or ".model" in p.name)


def resolve(path: str | Path | None) -> Path:
    """A user's path, or the name of a tokenizer file shipped in mistral-common (None: the default)."""
    if path is None:
        path = DEFAULT_TOKENIZER
    given = Path(path).expanduser()
    if given.exists():
        if not given.is_file():
            raise UserError(f"tokenizer {given}: is a folder; pass the tokenizer file itself (tokenizer.json, "
                            "tekken*.json or a SentencePiece .model)")
        return given
    embedded = embedded_folder() / str(path)
    if given.name == str(path) and embedded.is_file():
        return embedded
    raise UserError(f"tokenizer {path}: no such file; pass a tokenizer.json, a tekken*.json or a SentencePiece "
                    f".model, or one of the embedded names: {', '.join(embedded_names())}")


def _read_json(path: Path) -> object | None:
    """The parsed document, or None when the file is not JSON (then it may be a SentencePiece model)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"tokenizer {path}: cannot read it ({error.strerror}); "
                        "check the path and permissions") from None
    if not data.lstrip()[:1] == b"{":
        return None
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"tokenizer {path}: broken JSON ({error}); "
                        "pass a valid tokenizer.json or tekken*.json") from None


@lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int, skip_special_tokens: bool) -> tuple[Table, object, str]:
    from tokenpath.delivery import hf_file, spm_file, tekken_file

    document = _read_json(path)
    if document is None:
        table, processor = spm_file.spm_table(path, skip_special_tokens)
        return table, spm_file.SpmReference(processor, skip_special_tokens), "sentencepiece"
    if tekken_file.is_tekken(document):
        table = tekken_file.tekken_table(path, document, skip_special_tokens)
        return table, tekken_file.TekkenReference(path, skip_special_tokens), "tekken"
    if isinstance(document, dict) and "model" in document:
        del document
        table, tokenizer = hf_file.hf_table(path, skip_special_tokens)
        return table, hf_file.HfReference(tokenizer, skip_special_tokens), "huggingface"
    raise UserError(f"tokenizer {path}: JSON that is neither a Tekken file (config, vocab) nor a Hugging Face "
                    "tokenizer.json (model, decoder); pass one of those or a SentencePiece .model")


class Detokenizer:
    """A tokenizer's per-id tables plus its library's reference encode and decode."""

    def __init__(self, table: Table, reference, path: Path, kind: str, skip_special_tokens: bool) -> None:
        self.table, self._reference = table, reference
        self.path, self.kind, self.skip_special_tokens = path, kind, skip_special_tokens

    @classmethod
    def load(cls, path: str | Path | None = None, *, skip_special_tokens: bool = True) -> Detokenizer:
        """Load a tokenizer file (None: the embedded Tekken default). Special tokens are skipped
        or shown as their text, as the library's decode does with the same option."""
        file = resolve(path)
        table, reference, kind = _load(file.resolve(), file.stat().st_mtime_ns, skip_special_tokens)
        return cls(table, reference, file, kind, skip_special_tokens)

    @property
    def library(self):
        """The tokenizer library's own object: a mistral-common `Tekkenizer`, a sentencepiece
        `SentencePieceProcessor` or a tokenizers `Tokenizer`."""
        return self._reference.library

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to vocab_size - 1 (some may be unused: those are refused)."""
        return self.table.size

    def batch(self, n: int) -> BatchStream:
        """A stream of n sequences: `step(ids)` one id each, `finish()` their tails."""
        return self.table.stream(n)

    def encode(self, text: str) -> list[int]:
        """The library's encoding of `text`, without BOS/EOS or other added special tokens."""
        return list(self._reference.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The library's full decode of `ids`: the reference the stream matches."""
        self._check(ids)
        return self._reference.decode(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The same text through this package's stream, one sequence, one id per step."""
        stream = self.batch(1)
        parts = [stream.step([t])[0] for t in ids]
        return "".join(parts) + stream.finish()[0]

    def _check(self, ids: Sequence[int]) -> None:
        bad = [(j, int(t)) for j, t in enumerate(ids)
               if not 0 <= int(t) < self.table.size or self.table.code[int(t) + 1] == INVALID]
        if bad:
            raise TokenIdError(self.name, self.table.size, [j for j, _ in bad], [t for _, t in bad])
