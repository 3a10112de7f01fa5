"""The requests of one run, as struct-of-arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpath.prefixes import Prefixes


@dataclass(frozen=True)
class Sessions:
    """Multi-turn conversations: a session's turns are consecutive rows, in order. Turn k > 0 is sent
    `think_s` after the previous row's answer has fully reached the client (its scheduled time is only
    a lower bound)."""

    session: np.ndarray  # int64: each request's session
    turn: np.ndarray     # int64: its turn in the session, 0 for the first
    think_s: np.ndarray  # float64: the wait before it, after the previous turn's last byte (0 for a first turn)

    def take(self, index: np.ndarray) -> Sessions:
        """The rows at `index`; every session must be taken whole (a session stays on one replica)."""
        return Sessions(self.session[index], self.turn[index], self.think_s[index])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sessions):
            return NotImplemented
        return all(np.array_equal(getattr(self, name), getattr(other, name)) for name in ("session", "turn", "think_s"))


@dataclass(frozen=True)
class Requests:
    """One row per request, struct-of-arrays.

    `arrival_s` is the scheduled send time in seconds after the run's start (the first may be > 0),
    non-decreasing; token counts are at least 1. `input_tokens` are the prompt the engine prefills: on a
    chat endpoint, the client's messages and the `template_tokens` the server's chat template adds to them
    (`client_input_tokens` leaves those out). Treat the arrays as read-only.
    """

    arrival_s: np.ndarray  # float64
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    prefixes: Prefixes | None = None  # which prompt tokens requests share (None: every prompt is its own)
    sessions: Sessions | None = None  # multi-turn conversations (None: every request stands alone)
    template_tokens: np.ndarray | None = None  # int64: of input_tokens, the chat template's (None: none)

    def __post_init__(self) -> None:
        columns = {"arrival_s": np.float64, "input_tokens": np.int64, "output_tokens": np.int64}
        for name, dtype in columns.items():
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype != dtype:
                raise TypeError(f"Requests.{name} must be a 1-D numpy array of {np.dtype(dtype).name}")
        n = len(self.arrival_s)
        if len(self.input_tokens) != n or len(self.output_tokens) != n:
            raise ValueError(
                f"Requests columns differ in length: arrival_s {n}, input_tokens {len(self.input_tokens)}, "
                f"output_tokens {len(self.output_tokens)}"
            )
        arrival_s = self.arrival_s
        if n and not (np.isfinite(arrival_s).all() and arrival_s[0] >= 0 and (np.diff(arrival_s) >= 0).all()):
            raise ValueError("Requests.arrival_s must be finite, >= 0 and non-decreasing")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("Requests token counts must be >= 1")
        # Prefix keys may cover the answer too (prefixes.py), up to its last token, whose KV is never computed.
        if self.prefixes is not None and not (
                len(self.prefixes) == n and (self.prefixes.tokens < self.input_tokens + self.output_tokens).all()):
            raise ValueError("Requests.prefixes must have one row per request, covering at most its prompt and answer")
        if self.sessions is not None and len(self.sessions.turn) != n:
            raise ValueError("Requests.sessions must have one row per request")
        template = self.template_tokens
        if template is not None and not (
                isinstance(template, np.ndarray) and template.dtype == np.int64 and template.shape == (n,)
                and (template >= 0).all() and (template < self.input_tokens).all()):
            raise ValueError("Requests.template_tokens must be int64, one per request, each below its input_tokens")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def client_input_tokens(self) -> np.ndarray:
        """Each prompt as the client counts it: its messages' text, without the chat template's tokens."""
        return self.input_tokens if self.template_tokens is None else self.input_tokens - self.template_tokens

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Requests):
            return NotImplemented
        return (
            np.array_equal(self.arrival_s, other.arrival_s)
            and np.array_equal(self.input_tokens, other.input_tokens)
            and np.array_equal(self.output_tokens, other.output_tokens)
            and self.prefixes == other.prefixes
            and self.sessions == other.sessions
            and (self.template_tokens is None) == (other.template_tokens is None)
            and (self.template_tokens is None or np.array_equal(self.template_tokens, other.template_tokens))
        )

    def take(self, index: np.ndarray) -> Requests:
        """The rows at `index` (increasing integer positions or a boolean mask), e.g. one replica's share."""
        prefixes = None if self.prefixes is None else self.prefixes.take(index)
        sessions = None if self.sessions is None else self.sessions.take(index)
        template = None if self.template_tokens is None else self.template_tokens[index]
        return Requests(self.arrival_s[index], self.input_tokens[index], self.output_tokens[index], prefixes, sessions,
                        template)
