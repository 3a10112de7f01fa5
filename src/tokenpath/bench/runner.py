"""Send a planned workload to a server and append each finished request to the results file.

The send schedule is computed before the run starts. Requests are shared round-robin between worker
processes (one by default; more when the target rate needs them), each with its own event loop
(uvloop where installed) and connection pool; a concurrency cap is shared out between them. Every
worker appends each finished request to the results JSONL as one line, in one `write` on a file
opened for appending, so whatever happens to the run, every request that finished is on disk. At
its end each worker adds a line of its own CPU and event loop lag over the run (bench/client.py).

Multi-turn sessions are shared round-robin by session, so all of a session's turns are on one
worker. A session runs as one task on its worker's loop: it sends its first turn at the session's
arrival time and each later turn its think time after the previous turn's last byte, with the
previous prompt, the server's answer text and the new message (`SessionPlan`); while it waits, the
loop serves every other session. A turn after a failed one is not sent: it is recorded as failed,
"skipped".

A run may have a time limit (`Plan.run_timeout_s`, from its start): a request in flight when it
passes fails as a timeout, and one not sent by then is recorded as failed, "skipped", unsent.

Ctrl-C (SIGINT) and SIGTERM, in the parent or in a worker, stop sending, record the requests in
flight as interrupted, and keep everything else; the parent passes the stop on to its workers.
Workers never outlive their parent: on Linux the kernel sends them SIGTERM when it exits
(PR_SET_PDEATHSIG), and everywhere they check every second that their parent is still there.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import numpy as np
import orjson

from tokenpath.bench.client import ClientMeter, client_line
from tokenpath.bench.http import Connection, Endpoint, Pool, request_head
from tokenpath.bench.stream import CONNECT, INTERRUPTED, MAX_EVENT_BYTES, SKIPPED, STALLED, TIMEOUT, Exchange

# Streamed events per second one worker process takes while its p99 timestamp error stays under a
# millisecond: benchmarks/bench_client.py measured 10,000 to 29,000 on one CPU of a shared 2-CPU
# machine, from run to run; the automatic worker count plans for the low end.
EVENTS_PER_WORKER = 10_000
# A stream's typical pace, used to guess the event rate when the arrival rate is unbounded.
TOKENS_PER_S_PER_STREAM = 100
_START_DELAY_NS = 20_000_000
# prctl option asking the kernel to signal this process when its parent exits
# (linux/include/uapi/linux/prctl.h).
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class SessionPlan:
    """Multi-turn sessions: what a worker needs to build each turn's request when it is due.

    A session's turns are consecutive rows. Turn k's prompt text is turn k-1's prompt text, the
    server's answer text to it, then row k's message; for chat the same texts go as a history of
    messages (user, assistant, user, ...). Its input tokens are the prompt text's, counted by
    `count_tokens` (for chat: the messages' texts put together, without the chat template)."""

    session: np.ndarray    # int64: each row's session
    turn: np.ndarray       # int64: its turn, 0 for the first
    think_ns: np.ndarray   # int64: the wait after the previous turn's last byte (0 for a first turn)
    messages: list[str]    # each row's new message text (a first turn's whole prompt)
    body: Callable[[Any, int], bytes]   # (prompt text, or chat messages; max_tokens) -> the request body
    count_tokens: Callable[[str], int]
    chat: bool = False


@dataclass
class Plan:
    """Everything a worker needs to send its requests, computed before the run. With `sessions`, the
    bodies are built as each turn is sent (`bodies` is empty)."""

    url: str
    bodies: list[bytes]
    scheduled_ns: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    max_concurrency: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 10.0
    stall_timeout_s: float = 60.0
    request_timeout_s: float | None = 600.0
    run_timeout_s: float | None = None  # the whole run's limit, from its start (see the module's docstring)
    kernel_timestamps: bool = True   # plain http on Linux: the kernel's receive time of each read
    max_event_bytes: int = MAX_EVENT_BYTES  # a larger SSE event fails its request as malformed
    sessions: SessionPlan | None = None

    def __len__(self) -> int:
        return len(self.scheduled_ns)

    def parallel(self) -> int:
        """How many workers could share the plan: one per request, or per session, and no more than the
        concurrency cap (each worker holds at least one of its slots: concurrency_share)."""
        count = len(self) if self.sessions is None else len(np.unique(self.sessions.session))
        return count if self.max_concurrency is None else min(count, self.max_concurrency)

    def share(self, workers: int, worker: int) -> np.ndarray:
        """The rows one of `workers` workers sends: round-robin by request, or by session."""
        if self.sessions is None:
            return np.arange(worker, len(self), workers)
        return np.flatnonzero(self.sessions.session % workers == worker)


@dataclass
class Outcome:
    interrupted: bool   # stopped by a signal, or ended without recording every request
    recorded: int
    failed: int
    t0_ns: int
    signal: int = 0     # the signal that stopped the run (SIGINT, SIGTERM); 0 if none


def auto_workers(rate: float, mean_output_tokens: float, concurrency: int | None, n: int,
                 cpus: int | None = None) -> int:
    """Worker processes for a target event rate: one per EVENTS_PER_WORKER, at most one per CPU."""
    cpus = cpus or os.cpu_count() or 1
    if math.isinf(rate):
        streams = min(concurrency or n, n)
        events_per_s = streams * TOKENS_PER_S_PER_STREAM
    else:
        events_per_s = rate * mean_output_tokens
        if concurrency:
            events_per_s = min(events_per_s, concurrency * TOKENS_PER_S_PER_STREAM)
    return int(max(1, min(cpus, math.ceil(events_per_s / EVENTS_PER_WORKER), n)))


def concurrency_share(concurrency: int | None, workers: int, worker: int) -> int | None:
    if concurrency is None:
        return None
    return max(1, concurrency // workers + (worker < concurrency % workers))


def _raise_fd_limit(wanted: int) -> None:
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if soft < min(wanted, target):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(wanted, soft), target), hard))
        except (ValueError, OSError):
            pass


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Worker:
    """Sends a share of the plan's requests on one event loop."""

    def __init__(self, plan: Plan, indices: np.ndarray, concurrency: int | None, t0_ns: int,
                 write: Callable[[Exchange], None], parent_pid: int | None = None, next_row: Any = None) -> None:
        """`indices`: the rows this worker sends; or, with `next_row` (a shared counter, multiprocessing's
        Value), whichever row of the plan is next when one of its slots frees (`_take`)."""
        endpoint = Endpoint.parse(plan.url)
        self.plan, self.indices, self.concurrency, self.t0_ns = plan, indices, concurrency, t0_ns
        self.next_row = next_row
        self.parent_pid = parent_pid  # a worker process: stop when this process is no longer its parent
        self.task: asyncio.Task | None = None
        self.stopped_by = 0
        self.endpoint, self.path = endpoint, endpoint.path
        self._write = write
        self.active: dict[int, Exchange] = {}
        self.connections: dict[int, Connection] = {}
        self.starting: set[asyncio.Task] = set()
        self.finished = 0
        self.session_tasks: set[asyncio.Task] = set()
        self._ends: dict[int, asyncio.Future] = {}  # a session's turn in flight -> done when it ends
        self.scheduled_all = False
        self._done: asyncio.Future | None = None
        self._slots: asyncio.Semaphore | None = None
        self.deadline_ns = None if plan.run_timeout_s is None else t0_ns + int(plan.run_timeout_s * 1e9)
        self.meter = ClientMeter()
        self.measured: dict[str, Any] | None = None  # the meter's reading at the end of `run`

    def stop(self, signum: int) -> None:
        """Stop sending and end the requests in flight as interrupted (a signal, or the parent gone)."""
        if not self.stopped_by:
            self.stopped_by = signum
        if self.task is not None:
            self.task.cancel()

    def _on_end(self, exchange: Exchange) -> None:
        self.active.pop(exchange.index, None)
        connection = self.connections.pop(exchange.index, None)
        if exchange.error is not None and connection is not None and connection.exchange is exchange:
            connection.exchange = None
            connection.close()
        self.finished += 1
        self._write(exchange)
        if self._slots is not None:
            self._slots.release()
        waiter = self._ends.pop(exchange.index, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if (self.scheduled_all and not self.active and not self.starting and not self.session_tasks
                and not self._done.done()):
            self._done.set_result(None)

    async def _start(self, i: int, sent_ns: int) -> None:
        plan = self.plan
        exchange = Exchange(i, int(plan.scheduled_ns[i]), sent_ns, self._on_end,
                            int(plan.input_tokens[i]), int(plan.output_tokens[i]), plan.max_event_bytes)
        await self._send(exchange, plan.bodies[i])

    async def _send(self, exchange: Exchange, body: bytes) -> None:
        i = exchange.index
        self.active[i] = exchange
        try:
            if self.deadline_ns is not None and perf_counter_ns() >= self.deadline_ns:
                exchange.fail(SKIPPED, f"not sent: the run's time limit of {self.plan.run_timeout_s:g} s had passed",
                              perf_counter_ns())
                return
            connection = await self.pool.acquire()
        except asyncio.TimeoutError:
            exchange.fail(CONNECT, f"no connection within {self.plan.connect_timeout_s:g} s", perf_counter_ns())
            return
        except OSError as error:
            exchange.fail(CONNECT, f"{self.endpoint.host}:{self.endpoint.port}: {error.strerror or error}",
                          perf_counter_ns())
            return
        except asyncio.CancelledError:
            exchange.fail(INTERRUPTED, "stopped before it was sent", perf_counter_ns())
            raise
        finally:
            self.starting.discard(asyncio.current_task())
            self._maybe_done()
        if exchange.finished:
            self.pool.release(connection)
            return
        self.connections[i] = connection
        connection.send(exchange, request_head(self.endpoint, self.path, len(body), self.plan.headers) + body)

    async def _session(self, rows: list[int]) -> None:
        """One session's turns in order: each later one its think time after the previous one's last
        byte, carrying the conversation so far (see SessionPlan)."""
        plan, sessions = self.plan, self.plan.sessions
        loop = asyncio.get_running_loop()
        text, messages = "", []
        previous: Exchange | None = None
        try:
            for i in rows:
                out = int(plan.output_tokens[i])
                if previous is None:
                    scheduled_ns = int(plan.scheduled_ns[i])
                else:
                    due_ns = previous.end_ns + int(sessions.think_ns[i])
                    scheduled_ns = due_ns - self.t0_ns
                    if previous.error is not None:
                        previous = self._skip(i, scheduled_ns, previous)
                        continue
                    # A loop's timer may fire early by up to its resolution (libuv's is 1 ms): sleep again.
                    while (delay_ns := due_ns - perf_counter_ns()) > 0:
                        await asyncio.sleep(delay_ns / 1e9)
                    answer = "".join(previous.answer or ())
                    text += answer
                    messages.append({"role": "assistant", "content": answer})
                if self._slots is not None:
                    await self._slots.acquire()
                text += sessions.messages[i]
                messages.append({"role": "user", "content": sessions.messages[i]})
                body = sessions.body(messages if sessions.chat else text, out)
                tokens = sessions.count_tokens(text)
                exchange = self._turn(Exchange(i, scheduled_ns, perf_counter_ns(), self._on_end, tokens, out,
                                               plan.max_event_bytes))
                exchange.answer = []
                ended = self._ends[i] = loop.create_future()
                await self._send(exchange, body)
                await ended
                previous = exchange
        finally:
            self.session_tasks.discard(asyncio.current_task())
            self._maybe_done()

    def _turn(self, exchange: Exchange) -> Exchange:
        """Mark an exchange as its session's turn, for the results row."""
        sessions, i = self.plan.sessions, exchange.index
        exchange.session, exchange.turn = int(sessions.session[i]), int(sessions.turn[i])
        exchange.think_ns = int(sessions.think_ns[i])
        return exchange

    def _skip(self, i: int, scheduled_ns: int, failed: Exchange) -> Exchange:
        """Record a turn that follows a failed one as failed, without sending it."""
        def record(exchange: Exchange) -> None:
            self.finished += 1
            self._write(exchange)

        now = perf_counter_ns()
        exchange = self._turn(Exchange(i, scheduled_ns, now, record, int(self.plan.input_tokens[i]),
                                       int(self.plan.output_tokens[i]), self.plan.max_event_bytes))
        detail = (failed.detail or "" if failed.error == SKIPPED
                  else f"not sent: turn {failed.turn} of session {failed.session} failed ({failed.error})")
        exchange.fail(SKIPPED, detail, now)
        return exchange

    async def _watchdog(self) -> None:
        stall_ns = int(self.plan.stall_timeout_s * 1e9)
        total_ns = None if self.plan.request_timeout_s is None else int(self.plan.request_timeout_s * 1e9)
        period_s = min(1.0, self.plan.stall_timeout_s / 4, (self.plan.request_timeout_s or 1.0) / 4,
                       (self.plan.run_timeout_s or 1.0) / 4)
        while True:
            await asyncio.sleep(period_s)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self.stop(signal.SIGTERM)  # orphaned: the parent is gone, so is whoever would read the results
                return
            self.pool.clock.sample()
            now = perf_counter_ns()
            for exchange in list(self.active.values()):
                if exchange.finished or exchange.index not in self.connections:
                    continue
                if now - exchange.last_rx_ns > stall_ns:
                    exchange.fail(STALLED, f"no bytes for {self.plan.stall_timeout_s:g} s "
                                           f"after {exchange.events} events", now)
                elif total_ns is not None and now - exchange.sent_ns > total_ns:
                    exchange.fail(TIMEOUT, f"not finished within {self.plan.request_timeout_s:g} s", now)
                elif self.deadline_ns is not None and now > self.deadline_ns:
                    exchange.fail(TIMEOUT, f"not finished within the run's time limit of "
                                           f"{self.plan.run_timeout_s:g} s", now)

    async def run(self) -> bool:
        """Send every request on schedule and wait for them; True if interrupted."""
        loop = asyncio.get_running_loop()
        self.pool = Pool(self.endpoint, self.plan.connect_timeout_s, self.plan.kernel_timestamps)
        self._done = loop.create_future()
        if self.concurrency is not None:
            self._slots = asyncio.Semaphore(self.concurrency)
        watchdog = loop.create_task(self._watchdog())
        self.meter.start()
        scheduled = self.plan.scheduled_ns
        t0 = self.t0_ns
        try:
            if self.plan.sessions is not None:
                await self._start_sessions()
            else:
                for position in itertools.count():
                    if self._slots is not None:
                        await self._slots.acquire()
                    i = self._take(position)
                    if i is None:
                        break
                    due_ns = t0 + int(scheduled[i])
                    if self.deadline_ns is not None:  # past the limit nothing is sent: no waiting for it
                        due_ns = min(due_ns, self.deadline_ns)
                    # A loop's timer may fire early by up to its resolution (libuv's is 1 ms): sleep again.
                    while (delay_ns := due_ns - perf_counter_ns()) > 0:
                        await asyncio.sleep(delay_ns / 1e9)
                    task = loop.create_task(self._start(i, perf_counter_ns()))
                    self.starting.add(task)
            self.scheduled_all = True
            if self.active or self.starting or self.session_tasks:
                await self._done
            return False
        except asyncio.CancelledError:
            self._interrupt()
            return True
        finally:
            watchdog.cancel()
            self.measured = self.meter.stop()
            self.pool.close()

    def _take(self, position: int) -> int | None:
        """The row to send next, a slot of this worker's held for it: its `position`-th, or, sharing a
        concurrency cap with other workers, the plan's next unsent (`next_row`): whichever worker frees a
        slot first sends it, as one client under the cap would, so the cap's slots stay in use however the
        requests' lengths fall (a fixed share of rows each left a worker with slots to spare idle while
        another's requests waited). None: no row left."""
        if self.next_row is None:
            return int(self.indices[position]) if position < len(self.indices) else None
        with self.next_row.get_lock():
            i = self.next_row.value
            if i >= len(self.plan):
                return None
            self.next_row.value = i + 1
        return i

    async def _start_sessions(self) -> None:
        """Start each session of this worker's share at its first turn's scheduled time."""
        loop = asyncio.get_running_loop()
        turn = self.plan.sessions.turn
        rows = self.indices.tolist()
        firsts = [k for k, i in enumerate(rows) if turn[i] == 0] + [len(rows)]
        for start, end in zip(firsts, firsts[1:]):
            delay_ns = self.t0_ns + int(self.plan.scheduled_ns[rows[start]]) - perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            self.session_tasks.add(loop.create_task(self._session(rows[start:end])))

    def _interrupt(self) -> None:
        now = perf_counter_ns()
        for task in list(self.session_tasks):
            task.cancel()
        for task in list(self.starting):
            task.cancel()
        for exchange in list(self.active.values()):
            exchange.fail(INTERRUPTED, f"stopped after {exchange.events} events", now)
        for connection in list(self.connections.values()):
            connection.close()


def _freeze_heap() -> None:
    """Everything built before the run (tokenizer tables, prompts) is long-lived: keep the cyclic garbage
    collector from walking it during the run, where a full pass would stall the loop. Called before the
    run's start time is fixed: the pass itself takes tens of milliseconds (80 ms measured in a worker
    process with the default tokenizer), and taken after it, each worker's first requests would leave
    that much late, a burst "at once" split between workers."""
    gc.collect()
    gc.freeze()


def _run_loop(worker: Worker) -> int:
    """Run the worker to its end (its heap frozen first: `_freeze_heap`); the signal that stopped it early, or 0."""
    loop = new_loop()
    asyncio.set_event_loop(loop)
    worker.task = main = loop.create_task(worker.run())
    previous = {}
    for signum in STOP_SIGNALS:
        try:
            previous[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, worker.stop, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            previous.pop(signum, None)
    try:
        try:
            interrupted = loop.run_until_complete(main)
        except asyncio.CancelledError:  # stopped before it began: nothing was sent
            interrupted = True
        loop.run_until_complete(asyncio.sleep(0))  # let closed transports finish
        return (worker.stopped_by or signal.SIGINT) if interrupted else 0
    finally:
        for signum, handler in previous.items():
            try:
                loop.remove_signal_handler(signum)
                signal.signal(signum, handler)
            except (NotImplementedError, RuntimeError, ValueError, TypeError):
                pass
        asyncio.set_event_loop(None)
        loop.close()
        gc.unfreeze()


class _Appender:
    """Writes each finished request to the results file as one line, in one write."""

    def __init__(self, path: str, t0_ns: int, counts: Any = None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.t0_ns = t0_ns
        self.counts = counts
        self.recorded = self.failed = 0

    def __call__(self, exchange: Exchange) -> None:
        os.write(self.fd, orjson.dumps(exchange.record(self.t0_ns)) + b"\n")
        self.recorded += 1
        self.failed += exchange.error is not None
        if self.counts is not None:
            self.counts[0] = self.recorded
            self.counts[1] = self.failed

    def line(self, document: dict[str, Any]) -> None:
        """Any other line of the results file, in one write."""
        os.write(self.fd, orjson.dumps(document) + b"\n")

    def close(self) -> None:
        os.close(self.fd)


def _run_measured(worker: Worker, appender: _Appender, index: int) -> int:
    """`_run_loop`, then the worker's own CPU and loop lag (bench/client.py) as a line of the results."""
    try:
        return _run_loop(worker)
    finally:
        if worker.measured is not None:
            appender.line(client_line(worker.measured, index))


def write_line(path: str, document: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    finally:
        os.close(fd)


def _die_with_parent() -> None:
    """On Linux, have the kernel send this process SIGTERM when its parent exits, however it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the worker's own check of its parent still holds


def _worker_main(plan: Plan, indices: np.ndarray, worker: int, concurrency: int | None, path: str, ready: Any,
                 go: Any, t0: Any, counts: Any, parent_pid: int, next_row: Any = None) -> None:
    # Ctrl-C reaches the whole process group; the parent passes every stop on, so until the loop's
    # own handlers are in place SIGINT is ignored and SIGTERM ends the worker (nothing sent yet).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    if os.getppid() != parent_pid:
        return  # the parent exited before the worker could ask to die with it
    appender = _Appender(path, 0, counts)
    _freeze_heap()
    ready.put(os.getpid())
    while not go.wait(1.0):
        if os.getppid() != parent_pid:
            appender.close()
            return
    appender.t0_ns = t0.value
    try:
        _run_measured(Worker(plan, indices, concurrency, t0.value, appender, parent_pid, next_row), appender, worker)
    finally:
        appender.close()


class _StopRequest:
    """The parent's SIGINT / SIGTERM handler: it notes the first signal and the waiting loops act on
    it (an exception raised from a handler can land in code that swallows it, such as fork's hooks)."""

    def __init__(self) -> None:
        self.signum = 0
        self.previous: dict[int, Any] = {}

    def __call__(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            try:
                self.previous[signum] = signal.signal(signum, self)
            except ValueError:  # not the main thread: signals keep their handlers
                return

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def execute(plan: Plan, path: str, header: dict[str, Any], workers: int = 1,
            progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Run the plan, writing `header` (with the run's start time added) and then one line per request.

    `progress(recorded, failed)` is called as requests finish.
    """
    n = len(plan)
    _raise_fd_limit(n + 64 if plan.max_concurrency is None else plan.max_concurrency * 2 + 64)
    workers = max(1, min(workers, plan.parallel()))
    if workers == 1:
        _freeze_heap()
        t0 = perf_counter_ns() + _START_DELAY_NS
        write_line(path, {**header, "t0_monotonic_ns": t0, "workers": 1})
        appender = _Appender(path, t0)
        write = appender
        if progress is not None:
            def write(exchange: Exchange) -> None:
                appender(exchange)
                progress(appender.recorded, appender.failed)
        try:
            stopped_by = _run_measured(Worker(plan, np.arange(n), plan.max_concurrency, t0, write), appender, 0)
        finally:
            appender.close()
        return Outcome(bool(stopped_by) or appender.recorded < n, appender.recorded, appender.failed, t0, stopped_by)
    return _execute_processes(plan, path, header, workers, progress)


def _execute_processes(plan: Plan, path: str, header: dict[str, Any], workers: int,
                       progress: Callable[[int, int], None] | None) -> Outcome:
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    ready, go = context.Queue(), context.Event()
    t0 = context.Value("q", 0, lock=False)
    counts = [context.Array("q", 2, lock=False) for _ in range(workers)]
    n = len(plan)
    # Under a concurrency cap, one client's: the workers hold its slots between them and take the rows in
    # turn as slots free (Worker._take); sessions keep to their worker, each its own turns in order.
    shared = plan.max_concurrency is not None and plan.sessions is None
    next_row = context.Value("q", 0) if shared else None
    processes = [
        context.Process(
            target=_worker_main,
            args=(plan, plan.share(workers, w), w, concurrency_share(plan.max_concurrency, workers, w), path,
                  ready, go, t0, counts[w], os.getpid(), next_row),
            daemon=True,
        )
        for w in range(workers)
    ]
    stop = _StopRequest()
    stop.install()
    try:
        for process in processes:
            process.start()
        started, deadline_s = 0, time.monotonic() + 60
        while started < workers and not stop.signum:
            try:
                ready.get(timeout=0.1)
                started += 1
            except queue.Empty:
                if time.monotonic() > deadline_s:
                    raise RuntimeError(f"{workers - started} of {workers} bench worker processes "
                                       "did not start within 60 s") from None
        if not stop.signum:
            t0.value = perf_counter_ns() + _START_DELAY_NS
            write_line(path, {**header, "t0_monotonic_ns": t0.value, "workers": workers})
            go.set()
        while not stop.signum and any(process.is_alive() for process in processes):
            time.sleep(0.1)
            if progress is not None:
                progress(sum(c[0] for c in counts), sum(c[1] for c in counts))
        if stop.signum and go.is_set():
            # Each worker records its requests in flight as interrupted, then exits. SIGTERM, whatever
            # stopped the parent: a worker still setting up its loop ignores SIGINT but dies of SIGTERM.
            for process in processes:
                if process.is_alive() and process.pid is not None:
                    os.kill(process.pid, signal.SIGTERM)
            for process in processes:
                process.join(timeout=30)
    finally:
        for process in processes:  # stragglers, and workers stopped before anything was sent
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        stop.restore()
    recorded, failed = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if progress is not None:
        progress(recorded, failed)
    interrupted = bool(stop.signum) or any(process.exitcode not in (0, None) for process in processes) or recorded < n
    return Outcome(interrupted, recorded, failed, t0.value, stop.signum)
