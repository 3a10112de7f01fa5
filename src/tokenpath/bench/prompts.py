"""Prompts of exact token lengths, cut from the text corpus the project ships.

The corpus is encoded once (repeated as often as the longest prompt needs); a prompt of `n` tokens is
a slice of those ids that starts at a word, decoded to text and re-encoded to check the count. Where
the slice's edges re-tokenize differently, the slice is lengthened or shortened until the text
encodes to exactly `n` tokens.

Shared prefixes (prefixes.py) are sent for real: each segment key has one text, cut from a corpus
position the key selects, so requests that share a key share byte-identical text for the tokens its
segment covers; the request's own text follows. Where one text joins the next, the tokens on either
side must encode as they do apart (a clean join, checked on the characters around it), so the
shared text is also the same tokens in every prompt that carries it; a start that joins badly is
passed over for the next.

Unique prompts (the default) put a short tag unique to the request at the head of its own text, so
no two requests share more than the workload says (a server's prefix cache cannot make one look
faster than it is), and a tag naming the run and the key at the head of each shared segment, so a
second run against the same server starts with a cold cache, as a simulation does.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from tokenpath.bench.tokenizer import Tokenizer
from tokenpath.prefixes import Prefixes

# Prompts shorter than this get no tag: the tag would be most of the prompt.
_MIN_TAGGED_TOKENS = 8
_FIX_ROUNDS = 12
_STARTS_TRIED = 64
# Characters either side of a join re-encoded to check it: longer than any token of the corpus (its
# longest word is under 20 characters), so every token a join could merge is inside the window.
_JOIN_CHARS = 64
# Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4): spreads a segment key over the corpus positions.
_GOLDEN_64 = 0x9E3779B97F4A7C15


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
            if self._ids == self._unit * copies:  # the copies join cleanly: one copy's pieces, repeated
                pieces = self._pieces * copies
            else:
                pieces = [self.tokenizer.decode([token]) for token in self._ids]
            if "".join(pieces) == tiled:
                self._tiled = tiled
                self._offsets = np.concatenate(([0], np.cumsum([len(piece) for piece in pieces]))).tolist()
            else:
                self._offsets = None

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def joins_cleanly(self, left: str, right: str) -> bool:
        """Whether `left + right` encodes as `left` then `right` do apart, around the join."""
        if not left or not right:
            return True
        a, b = left[-_JOIN_CHARS:], right[:_JOIN_CHARS]
        encode = self.tokenizer.encode
        return list(encode(a + b)) == list(encode(a)) + list(encode(b))

    def starts(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` random starting positions (at word starts) for `n` prompts."""
        return self._starts[rng.integers(0, len(self._starts), size=n)]

    def build(self, length: int, start: int = 0, tag: str = "", prefix: str = "", prefix_tokens: int = 0,
              after: str = "") -> str:
        """Text that encodes to exactly `length` tokens: `prefix` (`prefix_tokens` of them), `tag`, then
        corpus text from token `start`; returned without `prefix`. The new text joins `prefix` (or, with
        no prefix, `after`: text it will follow, not counted) cleanly where any start tried allows."""
        if length < 1:
            raise ValueError(f"a prompt needs at least 1 token, got {length}")
        own = length - prefix_tokens
        if own < 1:
            raise ValueError(f"a prompt of {length} tokens has no room after a prefix of {prefix_tokens}")
        left = prefix or after
        self._ensure(own + 2 * _FIX_ROUNDS)
        marker = tag if tag and own >= _MIN_TAGGED_TOKENS else ""
        if marker and left:
            marker = " " + marker  # a tag's "[" would merge with punctuation before it
        marker_tokens = self.count(marker) if marker else 0
        if marker_tokens >= own:  # a tag as long as the prompt: leave it out, as for short prompts
            marker, marker_tokens = "", 0
        position = int(np.searchsorted(self._starts, start % len(self._unit)))
        for clean in ((True, False) if left else (False,)):  # a join that merges only if no start avoids it
            for attempt in range(_STARTS_TRIED):
                begin = int(self._starts[(position + attempt) % len(self._starts)])
                take = max(own - marker_tokens, 0)
                seen: set[int] = set()
                for _ in range(_FIX_ROUNDS):
                    if take in seen:
                        break
                    seen.add(take)
                    text = marker + self._slice(begin, take)
                    if clean and not self.joins_cleanly(left, text):
                        break
                    got = self.count(prefix + text)
                    if got == length:
                        return text
                    take += length - got
                    if take < 0:
                        break
        raise RuntimeError(f"no corpus slice encodes to exactly {length} tokens")

    def build_many(self, lengths: np.ndarray, rng: np.random.Generator, tag: str = "",
                   prefixes: Prefixes | None = None, unique: bool = True) -> list[str]:
        """One prompt per length, each from its own random start; with `unique`, tagged `tag` + its
        index. With `prefixes`, each prompt starts with its shared segments' texts (see the module)."""
        self._ensure(int(lengths.max()) + 2 * _FIX_ROUNDS if len(lengths) else 1)
        starts = self.starts(len(lengths), rng)
        if prefixes is None:
            return [
                self.build(int(length), int(start), f"[{tag}{i}]" if unique else "")
                for i, (length, start) in enumerate(zip(lengths.tolist(), starts.tolist()))
            ]
        segments = SegmentTexts(self, int(rng.integers(0, 2**62)), tag if unique else None)
        prompts = []
        for i, (length, start) in enumerate(zip(lengths.tolist(), starts.tolist())):
            shared, shared_tokens = segments.prefix(*prefixes.segments(i))
            if shared_tokens >= length:  # the whole prompt is shared
                prompts.append(shared)
                continue
            own = self.build(int(length), int(start), f"[{tag}{i}]" if unique else "", shared, shared_tokens)
            prompts.append(shared + own)
        return prompts


class SegmentTexts:
    """The text of each segment key, made once: corpus text from a position the key selects (with
    `tag`, headed by a tag naming the run and the key), of exactly the segment's tokens, joining
    cleanly onto the text of the segments before it."""

    def __init__(self, builder: PromptBuilder, salt: int, tag: str | None) -> None:
        self.builder, self.salt, self.tag = builder, salt, tag
        self.texts: dict[int, str] = {}

    def _start(self, key: int) -> int:
        return ((key * _GOLDEN_64 + self.salt) % 2**64) % len(self.builder._unit)

    def prefix(self, keys: list[int], ends: list[int]) -> tuple[str, int]:
        """The shared text of a request whose segments are `keys`, ending at tokens `ends`, and its tokens."""
        parts: list[str] = []
        done, tail = 0, ""
        for key, end in zip(keys, ends):
            text = self.texts.get(key)
            if text is None:
                label = f"[{self.tag}s{key}]" if self.tag is not None else ""
                text = self.texts[key] = self.builder.build(end - done, self._start(key), label, after=tail)
            parts.append(text)
            tail = (tail + text)[-_JOIN_CHARS:]
            done = end
        return "".join(parts), done
