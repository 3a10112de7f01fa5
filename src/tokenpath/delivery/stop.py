"""Stop strings on streaming text, as an OpenAI-compatible server applies them.

While a sequence streams, its last max(len(stop)) - 1 characters are held back: they could be the
start of a stop string that the next token completes, and text once sent cannot be taken back. When a
stop string appears, the text before it is released and the sequence stops; the stop string itself
and anything after it are never shown.

Which stop string ends the text is the engines' choice: the stop strings are tried in the request's
order and the first one found wins, cut where it starts, even if another listed later starts earlier
(vLLM's check_stop_strings in vllm/v1/engine/detokenizer.py; SGLang's Req._check_str_based_finish in
srt/managers/schedule_batch.py loops over the list the same way). A stop string is looked for only where
it could have been completed by this step's new text: the new characters and the len(stop) - 1 before
them, as vLLM's `find` starts there; so text released before a stop, when two are completed by one step,
may hold a stop string listed after the one found.

A request's first `min_tokens` tokens are not searched: their text is held back as any other, and the
search starts with the next token's new characters, as vLLM's detokenizer moves its stop_check_offset
past the text of the tokens up to min_tokens (vllm/v1/engine/detokenizer.py, "Support min_tokens").

Sequences that share a stop list are searched together: their buffers are joined with a separator
no stop string contains and each stop string is looked for once in the joined text (`str.find`, a
C-level scan), so a step costs a few scans for the whole group; only a group with a hit is searched
sequence by sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenpath.config.errors import UserError

SEPARATOR = "\x00"


@dataclass(frozen=True, eq=False)
class StopList:
    """One sequence's stop strings, checked and in the request's order (repeats dropped: the first of
    them is found first), built when a request comes in, not while streaming a batch."""

    stops: tuple[str, ...]
    hold: int       # characters held back: max(len(stop)) - 1
    joinable: bool  # no stop contains the separator


def compile_stops(stops: Sequence[str]) -> StopList:
    stops = tuple(dict.fromkeys(stops))
    if any(not s for s in stops):
        raise UserError("stop: an empty stop string would end every response at once; remove it")
    if not stops:
        return StopList((), 0, True)
    return StopList(stops, max(map(len, stops)) - 1, not any(SEPARATOR in s for s in stops))


def first_stop_at(stops: tuple[str, ...], text: str, new_chars: int) -> int:
    """Where `text`, whose last `new_chars` characters are new, is cut: the start of the first stop
    string in list order found in the new characters or the len(stop) - 1 before them; -1 if none is.
    vLLM's check_stop_strings (vllm/v1/engine/detokenizer.py), with include_stop_str_in_output false."""
    if not new_chars:
        return -1
    end = len(text) - new_chars + 1
    for stop in stops:
        at = text.find(stop, max(0, end - len(stop)))
        if at >= 0:
            return at
    return -1


@dataclass(eq=False)
class _Group:
    stops: tuple[str, ...]
    hold: int                                  # characters held back: max(len(stop)) - 1
    joinable: bool                             # no stop contains the separator
    members: list[int] = field(default_factory=list)


def _absent(stops: tuple[str, ...], text: str) -> bool:
    return all(text.find(stop) < 0 for stop in stops)


class StopStrings:
    """Per-sequence stop strings for a batch of n text streams."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._group_of: list[_Group | None] = [None] * n
        self._held = [""] * n
        self.stopped = [False] * n
        self._quiet = [0] * n  # tokens still to come that are not searched (a request's min_tokens)

    def set(self, i: int, stops: Sequence[str] | StopList, min_tokens: int = 0) -> None:
        """Start a new sequence in slot i with these stop strings (empty: none), given compiled or not,
        searched from the token after its first `min_tokens`."""
        compiled = stops if isinstance(stops, StopList) else compile_stops(stops)
        self._leave(i)
        self._held[i], self.stopped[i], self._quiet[i] = "", False, min_tokens
        if compiled.stops:
            group = self._groups.get(compiled.stops)
            if group is None:
                group = self._groups[compiled.stops] = _Group(compiled.stops, compiled.hold, compiled.joinable)
            group.members.append(i)
            group.members.sort()
            self._group_of[i] = group

    def feed(self, texts: Sequence[str], stepped: Sequence[int] | None = None) -> list[str]:
        """The text each sequence may show now, given its new text; `stepped`: the sequences that got a
        token (None: every one), which counts their tokens against min_tokens."""
        out = list(texts)
        if any(self.stopped):  # sequences that stopped before: nothing more to show
            out = ["" if stopped else text for text, stopped in zip(out, self.stopped)]
        quiet = self._count_quiet(stepped) if any(self._quiet) else None
        for group in list(self._groups.values()):
            self._feed_group(group, texts, out, quiet)
        return out

    def _count_quiet(self, stepped: Sequence[int] | None) -> set[int]:
        """The sequences whose token this step is one of their first min_tokens (not searched)."""
        quiet, counts = set(), self._quiet
        for i in range(self.n) if stepped is None else stepped:
            if counts[i] > 0:
                counts[i] -= 1
                quiet.add(i)
        return quiet

    def finish(self, i: int, tail: str = "") -> str:
        """End sequence i, whose last text is `tail`: what it may still show (nothing if it stopped)."""
        text, group = self._held[i] + tail, self._group_of[i]
        if self.stopped[i]:
            text = ""
        elif group is not None and not self._quiet[i] and (at := first_stop_at(group.stops, text, len(tail))) >= 0:
            text = text[:at]
            self.stopped[i] = True
        self._leave(i)
        self._held[i], self._quiet[i] = "", 0
        return text

    def _feed_group(self, group: _Group, texts: Sequence[str], out: list[str], quiet: set[int] | None) -> None:
        members, held, hold = group.members, self._held, group.hold
        everyone = len(members) == self.n
        buffers = [h + t for h, t in zip(held, texts)] if everyone else [held[i] + texts[i] for i in members]
        if not quiet and group.joinable and _absent(group.stops, SEPARATOR.join(buffers)):
            if everyone:
                out[:] = [b[:-hold] for b in buffers] if hold else buffers
                self._held = [b[-hold:] for b in buffers] if hold else [""] * self.n
            else:
                for i, b in zip(members, buffers):
                    out[i], held[i] = (b[:-hold], b[-hold:]) if hold else (b, "")
            return
        for i, b in zip(list(members), buffers):
            at = -1 if quiet and i in quiet else first_stop_at(group.stops, b, len(texts[i]))
            if at >= 0:
                out[i], self._held[i] = b[:at], ""
                self.stopped[i] = True
                self._leave(i)
            else:
                out[i], self._held[i] = (b[:-hold], b[-hold:]) if hold else (b, "")

    def _leave(self, i: int) -> None:
        group = self._group_of[i]
        if group is not None:
            group.members.remove(i)
            if not group.members:
                del self._groups[group.stops]
            self._group_of[i] = None
