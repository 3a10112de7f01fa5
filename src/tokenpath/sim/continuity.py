"""Continuity as a reader feels it: stalls after the first visible text, and a QoE score.

Stalls: a gap between successive arrivals at the client, after the first visible character has
arrived, longer than `stall_threshold_s` (default 250 ms). Per request: how many, and their summed
length (each whole gap).

QoE, as Andes defines it (Liu et al. 2024, "Andes: Defining and Enhancing Quality-of-Experience in
LLM-Based Text Streaming Services", arXiv 2404.16283, section 3.1): QoE = 1 - S_delay / S_whole.
The *expected* timeline has the reader's first token at the expected TTFT and one more token every
1/TDS after it (TDS: the expected token delivery speed, here a reading speed). The *actual* timeline
is what the reader has digested: a reader cannot read faster than TDS, so tokens that arrive early
wait in a buffer (Andes' client-side token buffer) and are read one every 1/TDS. S_delay is the area
between the two timelines where the reader is behind the expected one; S_whole is the area under the
expected timeline, both up to when the response is fully read (the later of the two timelines'
ends). QoE is 1.0 when the reader is never behind, and falls towards 0 as the text comes late.

Token counts are step functions of time, so the areas are exact sums over tokens: with token k
(0-based) expected at e_k = sent + TTFT_exp + k/TDS and read at d_k = max(a_k, d_{k-1} + 1/TDS)
(a_k its arrival; nothing is shown before the first visible character),
S_delay = sum_k max(0, d_k - e_k) and S_whole = sum_k (t_end - e_k), t_end = max(d_last, e_last).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from tokenpath.config.errors import quoted
from tokenpath.config.units import Duration

# Brysbaert, M. (2019). "How many words do we read per minute? A review and meta-analysis of reading
# rate." Journal of Memory and Language 109, 104047 (doi:10.1016/j.jml.2019.104047): silent reading
# of English non-fiction by adults, 238 words per minute.
READING_WORDS_PER_MIN = 238.0
# OpenAI, "What are tokens and how to count them?" (help.openai.com): one token is about 3/4 of an
# English word, so 4/3 tokens per word.
TOKENS_PER_WORD = 4.0 / 3.0
READING_TOKENS_PER_S = READING_WORDS_PER_MIN / 60.0 * TOKENS_PER_WORD  # 5.29 tokens/s
# Nielsen, J. (1993). Usability Engineering, ch. 5 "Response times: the three important limits":
# about 1.0 s is the limit for the user's flow of thought to stay uninterrupted.
EXPECTED_TTFT_S = 1.0
# The gap a reader notices as a stall (issue #15's default).
STALL_THRESHOLD_S = 0.25


@dataclass(frozen=True)
class ContinuitySpec:
    stall_threshold_s: float = STALL_THRESHOLD_S
    reading_tokens_per_s: float = READING_TOKENS_PER_S
    expected_ttft_s: float = EXPECTED_TTFT_S

    @staticmethod
    def of_block(block: dict | None) -> ContinuitySpec:
        """The spec a summary's continuity block (summary_block) was judged by; the default without one."""
        if not isinstance(block, dict):
            return DEFAULT
        return ContinuitySpec(block["stall_threshold_s"], block["reading_tokens_per_s"], block["expected_ttft_s"])


def read_s(arrivals_s: np.ndarray, first_visible_s: float, spec: ContinuitySpec) -> np.ndarray:
    """When a reader has read each token of one request, as QoE counts it (_qoe_exact's timeline, in
    seconds): the first at the later of its arrival, the first visible character and the expected TTFT,
    each next one a reading time after the one before, never before it arrives."""
    period_s = 1 / spec.reading_tokens_per_s
    k = np.arange(len(arrivals_s))
    ready = np.maximum.accumulate(np.asarray(arrivals_s, np.float64) - k * period_s)
    return k * period_s + np.maximum(ready, max(first_visible_s, spec.expected_ttft_s))


DEFAULT = ContinuitySpec()

# Reading speeds a scenario may give, in tokens/s: from 0.1 (a word every 7.5 s) to 10,000, far
# beyond any reader (speed readers claim ~1,000 words/min, 22 tokens/s), to catch unit mistakes.
MIN_READING_TOKENS_PER_S, MAX_READING_TOKENS_PER_S = 0.1, 10_000.0
_SPEED = re.compile(r"^\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                    r"(?:(?P<what>tokens?|words?)\s*/\s*(?P<per>s|sec|min))?\s*$")


def parse_reading_speed(value: object) -> float:
    """'238 words/min', '5.3 tokens/s' or a number of tokens/s -> tokens per second (words count as
    TOKENS_PER_WORD tokens)."""
    example = "'238 words/min' or '5.3 tokens/s'"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a reading speed such as {example}, got {quoted(value)}")
    if isinstance(value, str):
        match = _SPEED.match(value)
        if not match or (match["what"] is None and value.strip() != match["num"]):
            raise ValueError(f"cannot read {quoted(value)} as a reading speed; write {example}")
        number = float(match["num"])
        if match["what"] is not None:
            number *= ((TOKENS_PER_WORD if match["what"].startswith("word") else 1.0)
                       / (60.0 if match["per"] == "min" else 1.0))
    else:
        number = float(value)
    if not (math.isfinite(number) and MIN_READING_TOKENS_PER_S <= number <= MAX_READING_TOKENS_PER_S):
        raise ValueError(f"{quoted(value)} is out of range: a reading speed runs from {MIN_READING_TOKENS_PER_S:g} to "
                         f"{MAX_READING_TOKENS_PER_S:,.0f} tokens/s (4.5 to 450,000 words/min); write {example}")
    return number


ReadingSpeed = Annotated[float, BeforeValidator(parse_reading_speed),
                         PlainSerializer(lambda v: f"{v!r} tokens/s", when_used="json")]


class ContinuitySettings(BaseModel):
    """A scenario's optional `[continuity]` table: what counts as a stall and the reader QoE is judged
    against. Defaults: 250 ms (issue #15), Brysbaert's 238 words/min, Nielsen's 1 s."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    stall_threshold: Duration = Field(STALL_THRESHOLD_S, gt=0.0, description="a gap longer than this after the "
                                                                             "first visible text is a stall")
    reading_speed: ReadingSpeed = Field(READING_TOKENS_PER_S, description="the reader's pace: words/min or tokens/s")
    expected_ttft: Duration = Field(EXPECTED_TTFT_S, description="when the reader expects the first token")

    def spec(self) -> ContinuitySpec:
        return ContinuitySpec(self.stall_threshold, self.reading_speed, self.expected_ttft)


def spec_of(table: Any) -> ContinuitySpec:
    """The spec of a scenario table's `continuity` entry as a results header records it (already
    validated when the run was made); the defaults where it has none."""
    if not isinstance(table, dict):
        return DEFAULT
    return ContinuitySettings.model_validate(table, strict=False).spec()


def per_request(client_ns: np.ndarray, offsets: np.ndarray, sent_ns: np.ndarray, visible_ns: np.ndarray,
                spec: ContinuitySpec = DEFAULT) -> dict[str, np.ndarray]:
    """Per request: `stalls` (count), `stall_ns` (summed gaps) and `qoe` (NaN for a request with no
    tokens). `client_ns`: every token's arrival (flat, request i's at offsets[i]:offsets[i+1]);
    `sent_ns`: each request's send; `visible_ns`: when its first visible character arrived; all in one
    clock."""
    client_ns = np.asarray(client_ns, np.int64)
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    stalls = np.zeros(n, np.int64)
    stall_ns = np.zeros(n, np.int64)
    qoe = np.full(n, np.nan)
    if len(client_ns) == 0:
        return {"stalls": stalls, "stall_ns": stall_ns, "qoe": qoe}
    period_ns = int(round(1e9 / spec.reading_tokens_per_s))
    expected_ns = int(round(spec.expected_ttft_s * 1e9))
    visible_rel = np.asarray(visible_ns, np.int64) - sent_ns

    # Gaps between successive tokens; the one crossing into the next request is no gap (0).
    gaps = np.empty(len(client_ns), np.int64)
    np.subtract(client_ns[1:], client_ns[:-1], out=gaps[:-1])
    ends = offsets[1:] - 1
    gaps[ends[lengths > 0]] = 0

    has = lengths > 0
    starts = offsets[:-1]
    max_gap = np.zeros(n, np.int64)
    max_gap[has] = np.maximum.reduceat(gaps, starts[has])

    # Stalls are rare: look for them only in the requests whose longest gap is long enough.
    stalled = np.flatnonzero(max_gap > spec.stall_threshold_s * 1e9)
    if len(stalled):
        count = lengths[stalled]
        owner = np.repeat(stalled, count)
        index = (np.repeat(starts[stalled], count)
                 + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)))
        stall = ((gaps[index] > spec.stall_threshold_s * 1e9)
                 & (client_ns[index] >= np.asarray(visible_ns, np.int64)[owner]))
        stalls += np.bincount(owner[stall], minlength=n)
        stall_ns += np.bincount(owner[stall], weights=gaps[index[stall]], minlength=n).astype(np.int64)

    # A reader is never behind when the first visible text comes by the expected TTFT and no gap is
    # longer than a token's reading time: QoE 1 without the exact sum.
    first_rel = np.maximum(client_ns[np.minimum(starts, len(client_ns) - 1)] - sent_ns, visible_rel)
    maybe_late = has & ((first_rel > expected_ns) | (max_gap > period_ns))
    qoe[has & ~maybe_late] = 1.0
    late = np.flatnonzero(maybe_late)
    if has.all() and lengths[late].sum() * 2 > len(client_ns):
        late = np.arange(n)  # cheaper than gathering their tokens; the rest come out exactly 1.0 too
    if len(late):
        qoe[late] = _qoe_exact(client_ns, offsets, sent_ns, visible_rel, late, period_ns, expected_ns)
    return {"stalls": stalls, "stall_ns": stall_ns, "qoe": qoe}


def _qoe_exact(client_ns: np.ndarray, offsets: np.ndarray, sent_ns: np.ndarray, visible_rel: np.ndarray,
               rows: np.ndarray, period_ns: int, expected_ns: int) -> np.ndarray:
    """Andes' QoE of the requests `rows` (ascending, each with at least one token), by the sums in the
    module's docstring. Relative to its send, a request's token k is read at k*p + max(V, max_{j<=k}(a_j - j*p))
    (p: a token's reading time; V: the first visible character's arrival) and expected at T + k*p, so
    its delay is max(V, T, running max) - T: one segmented running maximum, in integer ns."""
    lengths = offsets[rows + 1] - offsets[rows]
    seg = np.cumsum(lengths) - lengths            # each request's first token in the gathered arrays
    tokens = client_ns[offsets[0]:offsets[-1]]
    if len(rows) < len(offsets) - 1:              # only these requests' tokens, in order
        chosen = np.zeros(len(offsets) - 1, bool)
        chosen[rows] = True
        tokens = tokens[np.repeat(chosen, np.diff(offsets))]
    # w = a - (index among the gathered tokens)*p, built in place; a request's a_k - k*p is w plus
    # its seg*p. Bounds of a_k - k*p (not sent-relative) give the lift that makes the running maximum
    # restart at each request: lift request r by r*span, so no earlier request's values reach it.
    w = np.arange(len(tokens), dtype=np.int64)
    w *= -period_ns
    w += tokens
    floor = sent_ns[rows] + np.maximum(visible_rel[rows], expected_ns)
    low = min(int(tokens.min()) - int(lengths.max() - 1) * period_ns, int(floor.min()))
    span = max(int(tokens.max()), int(floor.max())) - low + 1
    # Before the running maximum each request's values are raised to max(V, T) (in sent-relative
    # terms, by its first value alone: a running maximum carries it on), and afterwards every value
    # is taken back to its delay behind the expected timeline. Requests go in batches small enough
    # for the lift to stay inside int64.
    batch = max(1, 2**62 // span)
    for first in range(0, len(rows), batch):
        last = min(len(rows), first + batch)
        part = slice(int(seg[first]), int(seg[last - 1] + lengths[last - 1]))
        lift = np.arange(last - first, dtype=np.int64) * span - low
        view = w[part]
        view += np.repeat(lift + seg[first:last] * period_ns, lengths[first:last])
        starts = seg[first:last] - seg[first]
        view[starts] = np.maximum(view[starts], floor[first:last] + lift)
        np.maximum.accumulate(view, out=view)
        view -= np.repeat(lift + sent_ns[rows[first:last]] + expected_ns, lengths[first:last])
    s_delay = np.add.reduceat(w, seg).astype(np.float64)
    behind = w[seg + lengths - 1]                 # how far behind the last token is read
    count = lengths.astype(np.float64)
    s_whole = period_ns * count * (count - 1) / 2 + count * behind
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s_delay > 0, 1.0 - s_delay / s_whole, 1.0)


def summary_block(stalls: np.ndarray, stall_ns: np.ndarray, qoe: np.ndarray,
                  spec: ContinuitySpec = DEFAULT) -> dict:
    """The summary's `continuity` block over the given (completed, measured) requests."""
    n = len(stalls)
    known = qoe[~np.isnan(qoe)] if n else qoe
    stall_s = stall_ns / 1e9
    return {
        "stall_threshold_s": spec.stall_threshold_s,
        "reading_tokens_per_s": spec.reading_tokens_per_s,
        "expected_ttft_s": spec.expected_ttft_s,
        "stalls_per_request": float(stalls.mean()) if n else None,
        "stall_s_per_request": float(stall_s.mean()) if n else None,
        "requests_with_stalls": float((stalls > 0).mean()) if n else None,
        "stall_s_max": float(stall_s.max()) if n else None,
        "qoe": {
            "mean": float(known.mean()) if len(known) else None,
            **{key: (float(np.percentile(known, q)) if len(known) else None)
               for key, q in (("p1", 1.0), ("p10", 10.0), ("p50", 50.0))},
            "below_0_9": float((known < 0.9).mean()) if len(known) else None,
        },
    }
