"""Run a sweep's missing points on local processes or a Ray cluster, keeping each row as it finishes."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tokenpath.config.errors import UserError, quoted
from tokenpath.sim.forked import available_cpus
from tokenpath.sweep.point import simulate_point
from tokenpath.sweep.spec import SweepSpec, point_id
from tokenpath.sweep.store import ResultStore

RAY_INSTALL = "pip install 'tokenpath[ray]'"


@dataclass(frozen=True)
class SweepRun:
    total: int        # points in the spec
    already: int      # found finished in the output before this run
    ran: int          # simulated in this run
    out: Path


def _context() -> multiprocessing.context.BaseContext:
    """forkserver where the platform has it (clean workers, unlike fork; started once), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _local(spec: SweepSpec, todo: list[dict[str, Any]], workers: int) -> Iterator[dict[str, Any]]:
    context = _context()
    parent_alive, alive = context.Pipe(duplex=False)  # only this process holds `alive`, the writing end
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_exit_with_parent,
                               initargs=(parent_alive,))
    try:
        pending = {pool.submit(simulate_point, spec.scenario, spec.overrides, values, spec.fingerprint): index
                   for index, values in enumerate(todo)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            yield from _in_order(done, pending)
    except BrokenProcessPool:
        raise UserError("a worker process died before its point finished (most often the system ran out of "
                        "memory, or Ctrl-C reached it); rerun the same command to run the missing points, with "
                        "fewer --workers if memory is short") from None
    finally:  # stopped (Ctrl-C, or a point's error): start no more points
        pool.shutdown(wait=True, cancel_futures=True)
        alive.close()
        parent_alive.close()


def _in_order(done: set[Future], pending: dict[Future, int]) -> Iterator[dict[str, Any]]:
    """The rows of the `done` points (taken out of `pending`, which maps each to its place in the spec),
    in the spec's order rather than the set's, which varies from run to run; then the first error
    among them, if any. So the rows kept before a failing point do not depend on which finished first."""
    finished = sorted(done, key=pending.__getitem__)
    for future in finished:
        del pending[future]
    for future in finished:
        if future.exception() is None:
            yield future.result()
    for future in finished:
        future.result()


def _exit_with_parent(parent_alive: Connection) -> None:
    """In each worker: exit when the sweep's process dies, however it dies (SIGKILL included), rather
    than wait idle for work forever. The sweep holds the only writing end of the `parent_alive` pipe;
    the kernel closes it when the process dies, and the read waiting on it in a thread here ends.
    (A worker's parent is the forkserver, which outlives the sweep while workers remain, so neither
    PR_SET_PDEATHSIG nor watching getppid() would tell.)"""

    def watch() -> None:
        try:
            parent_alive.recv_bytes()  # nothing is ever sent: this returns only at the end of the pipe
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


_RAY_ADDRESS = re.compile(r"^(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})$")


def check_ray_address(address: str) -> None:
    """Refuse `address` unless it reads as a Ray cluster's address: 'auto', 'local', HOST:PORT or
    ray://HOST:PORT."""
    if address in ("auto", "local"):
        return
    match = _RAY_ADDRESS.match(address)
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise UserError(f"--ray-address: {quoted(address)} is not a Ray cluster's address; give 'auto' (the "
                        "cluster this machine is in) or HOST:PORT, e.g. 10.0.0.5:6379")


def join_ray(address: str | None) -> tuple[Any, bool]:
    """Ray, joined to the cluster at `address` (None: a local one) unless this process already is: (the
    module, whether this call started it). A Ray not installed or a cluster that cannot be joined is a
    one-line UserError."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray: Ray is not installed; install it with {RAY_INSTALL}") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except (ValueError, ConnectionError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"--ray-address: cannot join the Ray cluster at {quoted(address)} ({reason}); give "
                            "'auto' or HOST:PORT of a running cluster's head") from None
    return ray, started


def _ray(spec: SweepSpec, todo: list[dict[str, Any]], address: str | None) -> Iterator[dict[str, Any]]:
    ray, started = join_ray(address)
    try:
        task = ray.remote(simulate_point)
        pending = [task.remote(spec.scenario, spec.overrides, values, spec.fingerprint) for values in todo]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    row = ray.get(done[0])
                except ray.exceptions.RayTaskError as error:  # the point's own error, without Ray's wrapping
                    if isinstance(error.cause, UserError):
                        raise UserError(str(error.cause)) from None
                    raise
                yield row
        finally:
            for ref in pending:
                ray.cancel(ref)
    finally:
        if started:
            ray.shutdown()


def run_sweep(spec: SweepSpec, out: Path, workers: int | None = None, ray: bool = False,
              ray_address: str | None = None, started: Callable[[int, int], None] | None = None,
              finished: Callable[[dict[str, Any]], None] | None = None) -> SweepRun:
    """Simulate every point of `spec` not yet in `out`, keeping each row as it finishes.

    `started(done, total)` is told what was already there before anything runs; `finished(row)` after
    each new row is safe. Whatever stops the run (Ctrl-C, a point's error), the rows kept stay kept and
    the table is rewritten before the exception goes on.
    """
    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1")
    store = ResultStore(out, spec.fingerprint)
    store.load()
    order = [point_id(values) for values in spec.points]
    todo = [values for values, pid in zip(spec.points, order) if pid not in store.rows]
    already = len(spec.points) - len(todo)
    if started is not None:
        started(already, len(spec.points))
    ran = 0
    try:
        if todo:
            rows = (_ray(spec, todo, ray_address) if ray
                    else _local(spec, todo, min(len(todo), workers or available_cpus())))
            try:
                for row in rows:
                    store.add(row)
                    ran += 1
                    if finished is not None:
                        finished(row)
            finally:
                rows.close()
    finally:
        store.write_table(order)
    return SweepRun(len(spec.points), already, ran, out)
