"""Which prompt tokens requests share: prefix identities, as a hash chain over segments of tokens.

Request i's first `tokens[i]` prompt tokens are cut into segments of `segment_tokens` tokens (the
last may be shorter); segment k is named by `keys[offsets[i] + k]`, and a key stands for the whole
prefix up to its segment's end (a hash chain, as vLLM names KV blocks by the hash of their tokens and
their parent's hash): two requests with the same key at segment k have the same first
`min((k+1) * segment_tokens, tokens)` tokens. The prompt tokens past `tokens[i]` are the request's
own. Keys are small ints handed out by `chain` in the order prefixes are first seen.

The segment is the workload's unit of identity (a Mooncake trace's `hash_ids` name 512-token
blocks); the engine maps segments to its own, smaller KV blocks. Segments may instead end where the
workload says (`ends`): a multi-turn session cuts its history at each turn's message and answer.

Keys may run past the prompt into the request's answer (`tokens` up to prompt + output - 1, the tokens
whose KV the engine computes): those segments are cached when the request finishes, so that a
session's next turn, whose prompt repeats the answer, finds them.

`warm` names the segments the server holds cached before the first request arrives, least recently used
first: a server that earlier runs or a client's warm-up request left holding prompts that the run sends
again (validate/client_draws.py: SGLang's bench_serving sends the same prompts run after run).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Tokens per segment: the block of the Mooncake traces' hash_ids (kvcache-ai/Mooncake
# FAST25-release/README.md: "The block size is 512 tokens"), used for generated prefixes too.
SEGMENT_TOKENS = 512


@dataclass(frozen=True)
class Prefixes:
    keys: np.ndarray     # int64, flat: every request's segment keys, request after request
    offsets: np.ndarray  # int64, n + 1: request i's keys are keys[offsets[i]:offsets[i + 1]]
    tokens: np.ndarray   # int64, n: prompt tokens the keys cover
    segment_tokens: int = SEGMENT_TOKENS
    ends: np.ndarray | None = None  # int64, flat like keys: the token each segment ends at (None: every segment_tokens)
    warm: np.ndarray | None = None  # int64: keys cached before the run starts, least recently used first (None: none)

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, index: np.ndarray) -> Prefixes:
        """The rows at `index` (integer positions or a boolean mask)."""
        rows = np.arange(len(self))[index]
        counts = (self.offsets[1:] - self.offsets[:-1])[rows]
        starts = self.offsets[:-1][rows]
        flat = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        return Prefixes(self.keys[flat], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        self.tokens[rows], self.segment_tokens, None if self.ends is None else self.ends[flat],
                        self.warm)

    def segments(self, i: int) -> tuple[list[int], list[int]]:
        """Request i's segment keys and the token at which each segment ends."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        keys = self.keys[lo:hi].tolist()
        if self.ends is not None:
            return keys, self.ends[lo:hi].tolist()
        step, end = self.segment_tokens, int(self.tokens[i])
        return keys, [min((k + 1) * step, end) for k in range(len(keys))]

    def warm_tokens(self) -> np.ndarray:
        """Per request, the prompt tokens its leading warm segments cover: what it finds cached at the start."""
        covered = np.zeros(len(self), np.int64)
        if self.warm is None:
            return covered
        warm = set(self.warm.tolist())
        for i in np.flatnonzero(self.offsets[1:] > self.offsets[:-1]).tolist():
            for key, end in zip(*self.segments(i)):
                if key not in warm:
                    break
                covered[i] = end
        return covered

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Prefixes):
            return NotImplemented
        return (self.segment_tokens == other.segment_tokens and np.array_equal(self.keys, other.keys)
                and np.array_equal(self.offsets, other.offsets) and np.array_equal(self.tokens, other.tokens)
                and (self.ends is None) == (other.ends is None)
                and (self.ends is None or np.array_equal(self.ends, other.ends))
                and (self.warm is None) == (other.warm is None)
                and (self.warm is None or np.array_equal(self.warm, other.warm)))


def chain(ids: Iterable[Sequence[Hashable]], tokens: Sequence[int], segment_tokens: int = SEGMENT_TOKENS) -> Prefixes:
    """Prefixes from each request's segment ids (ids that name one segment's tokens, or already chained
    ones such as Mooncake's) and the prompt tokens they cover. The key of segment k is handed out per
    distinct (key of segment k-1, id, segment length), so equal keys mean equal prefixes."""
    interned: dict[tuple, int] = {}
    keys: list[int] = []
    counts: list[int] = []
    for request_ids, covered in zip(ids, tokens):
        parent = -1
        for k, segment_id in enumerate(request_ids):
            length = min(segment_tokens, covered - k * segment_tokens)
            parent = interned.setdefault((parent, segment_id, length), len(interned))
            keys.append(parent)
        counts.append(len(request_ids))
    return Prefixes(np.array(keys, np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    np.asarray(tokens, np.int64), segment_tokens)


def cached_prompts(prompt_tokens: np.ndarray, held: np.ndarray) -> Prefixes:
    """Prefixes of requests whose prompts the server holds before the run starts (`warm`), those where
    `held` (bool, per request) is true: each of them one segment of its prompt but the last token (which
    an engine always computes, to sample from), found by it alone; the other requests name none."""
    prompt_tokens = np.asarray(prompt_tokens, np.int64)
    covered = np.where(held, prompt_tokens - 1, 0).astype(np.int64)
    named = np.flatnonzero(covered > 0).astype(np.int64)
    counts = (covered > 0).astype(np.int64)
    return Prefixes(named, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), covered,
                    ends=covered[named], warm=named)
