"""What a replica's steps did, kept as rows while it runs, and the per-step and per-request arrays
assembled from them afterwards (engine/replica.py explains ticks and spans).

Nor is each request's share of the step costs added up while stepping: the replica records which
ticks each request sampled in (spans of consecutive ticks) and `accounts` sums the step columns over
them afterwards, in numpy. Rows are buffered as Python ints and moved into numpy in blocks (`Rows`):
writing one item of an `array("q")` goes through argument parsing, about a thousand machine
instructions, where appending to a list takes a few dozen.
"""

from __future__ import annotations

from array import array

import numpy as np

STEP_FIELDS = ("start_ns", "compute_ns", "traffic_ns", "blocking_ns", "leave_ns", "tokens", "seqs",
               "attn_pairs", "kv_read_tokens", "chunk_context_tokens", "logits", "front_queue_ns", "front_work_ns",
               "scheduled", "ahead_ns")


class Rows:
    """A growing int64 table: rows are appended to `buffer` (a flat list of Python ints) and moved
    into numpy blocks by `flush`, so memory stays at 8 bytes per value however long the run."""

    FLUSH_VALUES = 1 << 16

    def __init__(self, width: int, keep: bool = True) -> None:
        self.width = width
        self.keep = keep  # False: rows are dropped at each flush (a server that never reads them back)
        self.buffer: list[int] = []  # callers extend it in place: its identity never changes
        self.blocks: list[np.ndarray] = []

    def flush(self) -> None:
        if self.buffer:
            if self.keep:
                self.blocks.append(np.fromiter(self.buffer, np.int64, len(self.buffer)).reshape(-1, self.width))
            self.buffer.clear()

    def append(self, rows: np.ndarray) -> None:
        """Rows given at once, an int64 (rows, width) array, after those in the buffer."""
        self.flush()
        if self.keep:
            self.blocks.append(rows)

    def array(self) -> np.ndarray:
        """Every row so far, as a (rows, width) array."""
        if not self.keep:
            raise RuntimeError("this replica was built with keep_rows=False: its step rows were not kept")
        self.flush()
        if len(self.blocks) != 1:
            self.blocks = [np.concatenate(self.blocks) if self.blocks else np.empty((0, self.width), np.int64)]
        return self.blocks[0]


class TraceRows:
    """One row of STEP_FIELDS per step. Where tokens came from: (request, first tick, tokens) spans,
    a token in each of consecutive ticks, and each prompt's first token (request, step, 1): the same
    table when ticks are steps. Steps a request took part in without sampling (a prompt chunk that
    does not finish its prompt): (request, step). The step of each tick, when they differ (`pauses`:
    decoding sequences pause in prefill steps). The replica appends to the tables' buffers directly
    and calls `flush` when `step_rows.buffer` holds `flush_values`.

    For a live caller, `emitted` keeps the requests that got a token in the last step (`emitters`)
    and those whose tokens left the server with it (`released`)."""

    def __init__(self, ticks_apart: bool, keep: bool) -> None:
        """`ticks_apart`: ticks are not steps (decoders pause in prefill steps, or gain several tokens a
        step under speculative decoding), so the step of each tick is recorded."""
        self.ticks_apart = ticks_apart
        self.step_rows = Rows(len(STEP_FIELDS), keep)
        self.span_rows, self.silent_rows = Rows(3, keep), Rows(2, keep)
        self.first_rows = Rows(3, keep) if ticks_apart else self.span_rows
        self.tick_rows = Rows(1, keep)
        self.flush_values = Rows.FLUSH_VALUES
        self.emitters: list[int] = []
        # Each step's emitters whose tokens left with the last step: that step's alone; with
        # multi-step, every step of the window it ended, or none.
        self.released: list[list[int]] = []
        self._window_emitters: list[list[int]] = []

    def flush(self) -> None:
        for rows in (self.step_rows, self.span_rows, self.silent_rows, self.first_rows, self.tick_rows):
            rows.flush()

    def emitted(self, emitters: list[int], window_ends: bool) -> None:
        """The requests that got a token in the step just run; `window_ends`: its tokens left the server."""
        self.emitters = emitters
        self._window_emitters.append(emitters)
        self.released = self._window_emitters if window_ends else []
        if window_ends:
            self._window_emitters = []

    def drop_window(self) -> None:
        """A multi-step window ended without a last step (every sequence in it aborted): its steps' emitters
        are dropped, none of their tokens to leave."""
        self._window_emitters = []

    def steps(self) -> dict[str, np.ndarray]:
        """Per-step columns as arrays, keyed by STEP_FIELDS; a step inside a multi-step window leaves
        its tokens when the window's last step does, with that step's time in the front end."""
        rows = self.step_rows.array()
        steps = {name: rows[:, k].copy() for k, name in enumerate(STEP_FIELDS)}
        leave = steps["leave_ns"]
        left = np.flatnonzero(leave >= 0)
        if len(left) < len(leave):
            later = np.searchsorted(left, np.arange(len(leave)))
            known = later < len(left)
            for name in ("leave_ns", "front_queue_ns", "front_work_ns"):
                steps[name][known] = steps[name][left[later[known]]]
        return steps

    def tick_steps(self) -> np.ndarray | None:
        """The step of each tick of `spans`, or None where ticks are steps. Ticks [0, ticks) are the
        decode clock's; each prompt's first token is at tick `ticks` + its step."""
        if not self.ticks_apart:
            return None
        num_steps = len(self.step_rows.array())
        return np.concatenate([self.tick_rows.array()[:, 0], np.arange(num_steps, dtype=np.int64)])

    def spans(self) -> np.ndarray:
        """(request, first tick, tokens) rows, a token in each of consecutive ticks (see `tick_steps`),
        sorted by request then step."""
        spans = self.span_rows.array()
        if not self.ticks_apart:
            return spans[np.lexsort((spans[:, 1], spans[:, 0]))]
        ticks = len(self.tick_rows.array())
        firsts = self.first_rows.array() + np.array([0, ticks, 0])
        spans = np.concatenate([spans, firsts])
        return spans[np.lexsort((self.tick_steps()[spans[:, 1]], spans[:, 0]))]

    def accounts(self, steps: dict[str, np.ndarray], spans: np.ndarray, tick_steps: np.ndarray | None,
                 upload_ns: array, times_preempted: array, front_queue_ns: array,
                 front_work_ns: array) -> dict[str, np.ndarray]:
        """Per request (from `steps()`, `spans()` and `tick_steps()`, and the replica's columns of each
        request's upload time, preemptions and front-end wait and work): the summed compute and traffic
        time of the steps it took part in, its delivery time (its upload, then the host time that
        blocked those steps),
        the end of the step that made its last token (0 for a request with none yet), and the time that
        request's last tokens and the request itself waited for and spent in the front end."""
        n = len(upload_ns)
        requests, first, count = spans[:, 0], spans[:, 1], spans[:, 2]
        silent = self.silent_rows.array()
        totals = {}
        # A step of several ticks (speculative decoding) is charged at its first: every span that
        # covers any of its ticks covers that one (a sequence starts decoding at a step's first tick).
        first_of_step = None
        if tick_steps is not None:
            first_of_step = np.ones(len(tick_steps), bool)
            decode_ticks = tick_steps[:len(self.tick_rows.array())]
            first_of_step[1:len(decode_ticks)] = decode_ticks[1:] != decode_ticks[:-1]
        for name in ("compute_ns", "traffic_ns", "blocking_ns"):
            per_step = steps[name]
            per_tick = per_step if tick_steps is None else np.where(first_of_step, per_step[tick_steps], 0)
            cum = np.concatenate([[0], np.cumsum(per_tick)])
            total = np.zeros(n, np.int64)
            np.add.at(total, requests, cum[first + count] - cum[first])
            np.add.at(total, silent[:, 0], per_step[silent[:, 1]])
            totals[name] = total
        step_end = steps["start_ns"] + steps["compute_ns"] + steps["traffic_ns"] + steps["blocking_ns"]
        last = np.searchsorted(requests, np.arange(n), side="right") - 1  # each request's last span
        has_tokens = last >= 0
        has_tokens[has_tokens] = requests[last[has_tokens]] == np.flatnonzero(has_tokens)
        last_step_end = np.zeros(n, np.int64)
        last_queue, last_work = np.zeros(n, np.int64), np.zeros(n, np.int64)
        rows = last[has_tokens]
        last_tick = first[rows] + count[rows] - 1
        last_step = last_tick if tick_steps is None else tick_steps[last_tick]
        last_step_end[has_tokens] = step_end[last_step]
        last_queue[has_tokens] = steps["front_queue_ns"][last_step]
        last_work[has_tokens] = steps["front_work_ns"][last_step]
        # The first step each request took part in: a prompt chunk that sampled nothing, or its first token.
        first_step = np.full(n, len(steps["start_ns"]), np.int64)
        first_row = np.searchsorted(requests, np.arange(n), side="left")
        has_row = first_row < len(requests)
        has_row[has_row] = requests[first_row[has_row]] == np.flatnonzero(has_row)
        ticks = first[first_row[has_row]]
        first_step[has_row] = ticks if tick_steps is None else tick_steps[ticks]
        np.minimum.at(first_step, silent[:, 0], silent[:, 1])
        starts = np.append(steps["start_ns"], -1)  # -1: in no step (a request aborted before it ran)
        return {
            "first_step_start_ns": starts[first_step],
            "times_preempted": np.frombuffer(times_preempted, np.int64).copy(),
            "compute_ns": totals["compute_ns"],
            "traffic_ns": totals["traffic_ns"],
            "delivery_ns": np.frombuffer(upload_ns, np.int64) + totals["blocking_ns"],
            "upload_ns": np.frombuffer(upload_ns, np.int64).copy(),
            "network_in_ns": (np.frombuffer(upload_ns, np.int64) - np.frombuffer(front_queue_ns, np.int64)
                              - np.frombuffer(front_work_ns, np.int64)),
            "last_step_end_ns": last_step_end,
            "front_queue_ns": np.frombuffer(front_queue_ns, np.int64) + last_queue,
            "front_work_ns": np.frombuffer(front_work_ns, np.int64) + last_work,
        }
