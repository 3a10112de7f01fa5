"""What an engine replica needs from the layers around it, as protocols: the cost of a step (engine/costs.py
implements it over compute and fabric) and the delivery path (delivery.LastMile), which the engine reaches
only through `Host`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from tokenpath.engine.speculative import Speculation


class StepCosts(Protocol):
    def compute_s(self, num_tokens: int, num_logits: int, attn_pairs: float, kv_read_tokens: float,
                  chunk_context_tokens: float, scheduled: bool, traffic_s: float, ahead_s: float,
                  prompt_on_busiest: float | None = None, sequences: int | None = None) -> float:
        """A step's compute time, the host's in its path included; `scheduled`: the step calls the
        scheduler (every step but those of a multi-step window after its first); `traffic_s`: the step's
        traffic_s, whose collectives run between its kernels (and hide launches as kernels do);
        `ahead_s`: how long before the step starts its host began launching its kernels;
        `prompt_on_busiest`: with attention data-parallel, the prompt tokens of the rank holding the most;
        `sequences`: the sequences sampled, where they are not the LM head's rows (speculative verify steps)."""
        ...
    def traffic_s(self, num_tokens: int, decode_only: bool) -> float: ...

    # compute_s of a run of decode steps at once (compute/roofline.py's ComputeModel.decode_steps_s): each
    # step's time, exactly compute_s's, from its attention pairs and KV reads; None where it cannot.
    decode_steps_s: Callable[[int, np.ndarray, np.ndarray], np.ndarray | None]

    # The host's own time in a step, host_busy_s(num_tokens, num_logits, scheduled, sequences) (its scheduling,
    # and its launches when it replays no graph): an overlapped host launches the next step's kernels in the
    # rest of it. None where no step's time depends on that lead (every step replays a graph, or launching
    # costs the host nothing).
    host_busy_s: Callable[[int, int, bool, int | None], float] | None

    # Speculative decoding (engine/speculative.py): the drafts and their acceptance, or None; and the
    # drafter's time in a step, draft_s(num_tokens, sequences, attn_pairs, kv_read_tokens,
    # chunk_context_tokens) as compute/drafter.py's DraftCost.step_s, or None where it does no GPU work.
    speculation: Speculation | None
    # Attention data-parallel ranks of a replica (1 without): each holds the requests sent to it.
    attention_ranks: int
    draft_s: Callable[[int, int, float, float, float], float] | None


class Host(Protocol):
    """What the engine needs from the delivery path (implemented by delivery.LastMile)."""

    stream_interval: int  # tokens per SSE event: the first token alone, then groups, the last flushed
    # Whether requests pass through a front end that takes time (`request`) before the engine sees them.
    queues_requests: bool

    def requests(self, arrival_ns: list[int], input_tokens: list[int]) -> list[tuple[int, int, int]]:
        """(when the engine sees it, its wait, its work) of each request reaching the server at
        `arrival_ns` (in order), those the engine loop passes on at one moment; called interleaved in
        time order with `on_step`."""
        ...

    def on_step(self, gpu_end_ns: int, emitted: int, events: int) -> tuple[int, int, int, int]:
        """(blocking_ns, leave_ns, front_queue_ns, front_work_ns) of a step that sampled `emitted` tokens
        closing `events` events: how long it blocks the engine, when its tokens leave the server, and
        their wait and work in the front end on the way."""
        ...

    def steps_blocking_ns(self, emitted: int, events: int) -> int | None:
        """on_step's blocking_ns for steps that each sample `emitted` tokens in `events` events, where `on_steps`
        can account a run of them at once (the same for each); None where it cannot."""
        ...

    def on_steps(self, gpu_end_ns: np.ndarray, emitted: int, events: int) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
        """on_step for a run of steps ending on the GPU at `gpu_end_ns` (in order), each as steps_blocking_ns
        allows: each one's (leave_ns, front_queue_ns, front_work_ns), exactly as on_step, step by step."""
        ...

    def busy_ns(self) -> dict[str, int]:
        """How long each serial resource of the host has been busy so far (its busiest instance), by name."""
        ...
