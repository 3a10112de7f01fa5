"""Independent pieces of a simulation run side by side in forked worker processes.

Data-parallel replicas share nothing while they run (requests are routed to them up front), so each
can be simulated in its own process. Workers are forked rather than spawned: they inherit the
resolved deployment and workload instead of unpickling them, and start in milliseconds rather than
re-importing numpy and pydantic. Only results travel back, pickled.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from tokenpath.config.errors import UserError

Item = TypeVar("Item")
Result = TypeVar("Result")
Progress = Callable[[int], None]

# Workers add to the shared counter once this many units of progress have piled up.
_PROGRESS_BATCH = 256

# What the forked workers run: set just before the pool forks them, read in the children.
_task: tuple[Callable, Sequence, object] | None = None


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_forked(work: Callable[[Item, Progress], Result], items: Sequence[Item], workers: int,
               progress: Progress | None = None) -> list[Result]:
    """[work(item, progress) for item in items], computed by up to `workers` forked processes.

    Each call reports progress through its second argument; the parent forwards the total to
    `progress` as it grows. An exception raised by `work` is raised here; a worker that dies (the
    kernel's out-of-memory killer is the usual cause) becomes a one-line UserError.
    """
    global _task
    context = multiprocessing.get_context("fork")
    counter = context.Value("q", 0)
    _task = (work, items, counter)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(_run_one, index) for index in range(len(items))]
            pending, reported = set(futures), 0
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                done = counter.value
                if progress is not None and done > reported:
                    progress(done - reported)
                    reported = done
            return [future.result() for future in futures]
    except BrokenProcessPool:
        raise UserError(f"--workers: a worker process died before it finished (most often the system ran out "
                        f"of memory with {workers} workers at once); rerun with fewer workers, or --workers 1 "
                        "to simulate in this process") from None
    finally:
        _task = None


def _run_one(index: int):
    work, items, counter = _task
    unreported = 0

    def report(done: int) -> None:
        nonlocal unreported
        unreported += done
        if unreported >= _PROGRESS_BATCH:
            flush()

    def flush() -> None:
        nonlocal unreported
        with counter.get_lock():
            counter.value += unreported
        unreported = 0

    result = work(items[index], report)
    flush()
    return result
