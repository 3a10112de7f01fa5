"""The time a stage served by a model takes per request: its forward pass from the roofline
(compute/served.py) and, on CPU cores or a chip of its own, its wait in the queue in front of them
(queues.py). A stage on the shared GPU is timed by the engine's steps instead (sim/shared_stage.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tokenpath.application.queues import batches_end_ns, servers_end_ns
from tokenpath.application.served import SHARED
from tokenpath.application.spec import ApplicationSpec, StageSpec
from tokenpath.compute.chip import ChipSpec, load_chip
from tokenpath.compute.served import ChipForward, cpu_forward_s
from tokenpath.config.assumptions import DEFAULTS, Assumptions
from tokenpath.config.errors import UserError

# A served stage's queue ends within 2^62 ns (146 years) of the run's start: int64 nanoseconds, with room
# for the stages and the model call after it.
MAX_QUEUE_NS = 2**62


def request_tokens(stage: StageSpec, question_tokens: np.ndarray) -> np.ndarray:
    """Per request, the tokens its forward pass takes: an embedder's `tokens` or the question; a
    reranker's documents, each with the query (`query_tokens` or the question)."""
    served, n = stage.served, len(question_tokens)
    if stage.kind == "embed":
        return np.full(n, served.tokens, np.int64) if served.tokens else question_tokens.astype(np.int64)
    query = np.full(n, served.query_tokens, np.int64) if served.query_tokens else question_tokens.astype(np.int64)
    return served.documents * (served.document_tokens + query)


def chip_forward(stage: StageSpec, chip: ChipSpec, assumptions: Assumptions = DEFAULTS) -> ChipForward:
    served = stage.served
    return ChipForward(served.size, served.precision, chip, assumptions,
                       f"application stage {stage.name!r} served.precision")


def batch_ns(forward: ChipForward, tokens: np.ndarray, max_batch: int) -> Callable[[np.ndarray], int]:
    """The time of the forward passes of requests `rows`, in batches of up to `max_batch`, one after another."""
    def run(rows: np.ndarray) -> int:
        return sum(round(forward.time_s(float(tokens[rows[k:k + max_batch]].sum())) * 1e9)
                   for k in range(0, len(rows), max_batch))
    return run


def queued(stage: StageSpec, send_ns: np.ndarray, tokens: np.ndarray,
           assumptions: Assumptions = DEFAULTS) -> Callable[[np.ndarray], np.ndarray]:
    """For a stage on CPU cores or a chip of its own: the function from each request's start in the stage
    (after its send) to its time there, its wait for a core or a batch included."""
    served = stage.served
    if served.on == "cpu":
        service_s = cpu_forward_s(served.size, served.precision, tokens, assumptions)
        # a queue ends at most every service time after the last arrival
        if len(send_ns) and float(send_ns.max()) + float(service_s.sum()) * 1e9 > MAX_QUEUE_NS:
            raise _too_long(stage)
        service = np.rint(service_s * 1e9).astype(np.int64)
        return lambda begin: servers_end_ns(send_ns + begin, service, served.cores) - send_ns - begin
    run = batch_ns(chip_forward(stage, load_chip(served.on, assumptions), assumptions), tokens, served.batch)

    def ends(begin: np.ndarray) -> np.ndarray:
        try:
            end = batches_end_ns(send_ns + begin, served.batch, run)
        except OverflowError:  # past int64 nanoseconds
            raise _too_long(stage) from None
        if len(end) and int(end.max()) > MAX_QUEUE_NS:
            raise _too_long(stage)
        return end - send_ns - begin
    return ends


def _too_long(stage: StageSpec) -> UserError:
    where = "its cores" if stage.served.on == "cpu" else f"one {stage.served.on}"
    return UserError(f"application stage {stage.name!r}: its requests would take more than 146 years on {where} "
                     "(past int64 nanoseconds); lower served.documents, document_tokens, tokens or max_batch, or "
                     "serve it on more or faster hardware")


def queues(spec: ApplicationSpec, send_ns: np.ndarray, question_tokens: np.ndarray,
           assumptions: Assumptions = DEFAULTS) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """`queued` for every stage on CPU cores or a chip of its own, by name."""
    return {stage.name: queued(stage, send_ns, request_tokens(stage, question_tokens), assumptions)
            for stage in spec.stages if stage.served is not None and stage.served.on != SHARED}
