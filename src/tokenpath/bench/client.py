"""Whether the client kept up with the streams it read: its own CPU and event loop over a bench run.

A slow client must not pass for a slow server. A worker reads all its streams on one event loop, in
one thread; while that thread is busy, arrived events wait in their sockets, and the times recorded
for them (TTFT, ITL) include the client's own delay. Each worker measures itself over its run
(`ClientMeter`), from the start of its loop's work to its end:

- CPU: its CPU time (user + system, all its threads: they share the interpreter's lock, so any of
  them running holds the loop up; `time.process_time_ns`) against the wall time, the share of one
  core it was busy (at most 1);
- loop lag: a task sleeps LAG_PERIOD_S at a time and records how late it wakes. A loop that spends
  30 ms on other work wakes it up to 30 ms late, as it reads a socket up to 30 ms late;
- CPU wait (Linux): how long the loop's thread waited, ready to run, for a CPU other processes held
  (the scheduler's run-queue time, /proc/thread-self/schedstat). A loop can be late with its own CPU
  share low: on a shared machine its CPU is taken from it, and the cure is then not fewer requests.

It writes them as one line of the results file when it ends (`client_line`), its wake-up lags in
microseconds; `client_block` judges them for the summary (`bench.client`). The client was saturated
when any worker shows either sign:

- busy: its CPU was busy BUSY_FRACTION of the run or more. The loop serves streams as a single
  server serves a queue, and a queue's wait grows as 1 / (1 - utilization): at 0.9 a burst (an engine
  step sends an event to every stream at once) waits ten times its own reading time;
- late: its loop woke more than the lag threshold late at over 1% of its wake-ups (its p99 lag is
  over the threshold), and at least MIN_LATE_WAKEUPS times (a short run's p99 is its largest few
  wake-ups, and one late wake-up can be the operating system's doing).

The lag threshold is the lag that would visibly move a latency. A request's send time is taken as
its task is made, and the task runs at the loop's next turn: a late loop sends it late, and its TTFT
counts the delay. What a late read moves depends on how arrivals are stamped (docs/bench.md,
"Timestamps"):

- event-loop timestamps: an arrival read late is stamped late, so the lag moves every time bench
  takes. The threshold is LAG_SHARE of the shorter of the median ITL and the median TTFT (ITL, nearly
  always): a p99 lag of a tenth of it moves that metric's tail by a tenth of its median, which a
  reader sees;
- kernel timestamps: an arrival keeps its packet's time however late it is read, until the stream's
  next event arrives before the read and both get the later time (`bench.arrivals.sharing_a_read`).
  So reads need a lag of about a stream's gap between events to move anything, and MERGE_SHARE of
  the median ITL allows for gaps that run short (against bench on `tokenpath serve`, 0.2% and 2.7%
  of gaps were under half their run's median). The threshold is the smaller of LAG_SHARE of the
  median TTFT (the sends) and MERGE_SHARE of the median ITL (the reads).

The threshold is never below LAG_FLOOR_S, the lateness an idle loop shows by itself. Measured against
`tokenpath serve` on a shared 2-core machine, 1,000 streams at once on one worker with kernel
timestamps kept the loop busy in bursts (p99 lag 8.5 ms, CPU 16%) while no two events of a stream
shared a read: not saturated, as the kernel-timestamp rule has it (threshold 28 ms), where a rule on
ITL alone (5.7 ms) would have called it.

With several workers the block shows the worst worker's figures (the highest busy and waiting
shares, the highest lag percentiles); one saturated worker inflates every request it sent. The
warning's advice follows the cause: a loop that waited longer for a CPU than it used one needs CPUs
no other work shares; otherwise, fewer concurrent requests per client process (more workers) or a
machine of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter_ns, process_time_ns
from typing import Any

import numpy as np

from tokenpath.config.units import format_duration

# One wake-up every 20 ms: 50 a second, each a timer and a task step (a few microseconds), while a
# 30 ms stall still shows in at least one wake-up.
LAG_PERIOD_S = 0.020
# The busy share of one core at which a loop has no slack left for a burst: 1 / (1 - 0.9) = 10x wait.
BUSY_FRACTION = 0.9
# A p99 lag of 10% of a latency's median moves its tail by a tenth of its median.
LAG_SHARE = 0.1
# With kernel timestamps, the share of the median ITL a read may be late before a stream's events start
# to share it (see the docstring).
MERGE_SHARE = 0.5
# epoll and libuv time their waits in whole milliseconds, so an idle loop wakes up to 1 ms late by
# itself: measured on a shared 2-core machine, 250 wake-ups of 20 ms, p99 0.30 to 1.16 ms on uvloop
# and 0.38 to 0.62 ms on asyncio's loop, in six runs. Twice the timer's millisecond is the least lag
# told apart from the timer.
LAG_FLOOR_S = 0.002
MIN_LATE_WAKEUPS = 3
# The scheduler's per-thread counters: time on a CPU, time waiting for one (ns), timeslices
# (Documentation/scheduler/sched-stats.rst).
_SCHEDSTAT = "/proc/thread-self/schedstat"


class ClientMeter:
    """A worker's CPU and loop lag over its run: `start` in the running loop, `stop` at its end."""

    def __init__(self, period_s: float = LAG_PERIOD_S) -> None:
        self.period_ns = int(period_s * 1e9)
        self.lags_ns: list[int] = []
        self._task: asyncio.Task | None = None
        self._cpu_ns = self._wall_ns = 0

    def start(self) -> None:
        self._cpu_ns, self._wall_ns, self._wait_ns = process_time_ns(), perf_counter_ns(), _run_queue_ns()
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        period_s, lags = self.period_ns / 1e9, self.lags_ns
        while True:
            asleep_ns = perf_counter_ns()
            await asyncio.sleep(period_s)
            # A timer may fire up to its resolution early (libuv's: 1 ms): early counts as on time.
            lags.append(max(0, perf_counter_ns() - asleep_ns - self.period_ns))

    def stop(self) -> dict[str, Any]:
        """The measurement so far, as `client_line` writes it."""
        if self._task is not None:
            self._task.cancel()
        wait_ns = _run_queue_ns()
        return {"cpu_s": (process_time_ns() - self._cpu_ns) / 1e9, "wall_s": (perf_counter_ns() - self._wall_ns) / 1e9,
                "cpu_wait_s": None if wait_ns is None or self._wait_ns is None else (wait_ns - self._wait_ns) / 1e9,
                "lag_us": [lag // 1000 for lag in self.lags_ns]}


def _run_queue_ns() -> int | None:
    """How long this thread has waited for a CPU, ready to run; None where the system does not say."""
    try:
        with open(_SCHEDSTAT, "rb") as stats:
            return int(stats.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def client_line(measured: dict[str, Any], worker: int) -> dict[str, Any]:
    """The results file's line of one worker's measurement."""
    return {"client": measured, "worker": worker}


def lag_threshold_s(latency_s: dict[str, Any], timestamps: str | None) -> float:
    """The p99 lag over which the loop is late enough to show in the latencies (see the docstring), from
    the summary's `latency_s` medians and how arrivals were stamped ("kernel" or "event loop")."""
    ttft_s, itl_s = latency_s["ttft"]["p50"], latency_s["itl"]["p50"]
    if timestamps == "kernel":
        limits = [LAG_SHARE * ttft_s if ttft_s else None, MERGE_SHARE * itl_s if itl_s else None]
    else:
        limits = [LAG_SHARE * median for median in (ttft_s, itl_s) if median]
    return max(LAG_FLOOR_S, min((limit for limit in limits if limit is not None), default=LAG_FLOOR_S))


def client_block(lines: Sequence[dict[str, Any]], latency_s: dict[str, Any],
                 timestamps: str | None) -> dict[str, Any] | None:
    """The summary's `bench.client`: the worst worker's busy and waiting shares and loop lag, and whether
    the client was saturated, with the reason in words; None without a worker's measurement."""
    if not lines:
        return None
    threshold_s = lag_threshold_s(latency_s, timestamps)
    workers = [_Worker.of(line, threshold_s, len(lines)) for line in lines]
    busiest = max(workers, key=lambda worker: worker.busy)
    late = next((worker for worker in workers if worker.late), None)
    waits = [worker.wait for worker in workers if worker.wait is not None]

    def worst(pick: Any) -> float | None:
        values = [float(pick(worker.lags_s)) for worker in workers if len(worker.lags_s)]
        return max(values) if values else None

    lag = {"p50": worst(lambda x: np.percentile(x, 50)), "p99": worst(lambda x: np.percentile(x, 99)),
           "max": worst(np.max)}
    reasons = []
    if busiest.busy >= BUSY_FRACTION:
        reasons.append(f"its CPU was busy {busiest.busy:.0%} of the run{busiest.which}")
    if late is not None:
        reason = (f"its event loop woke up to {format_duration(late.p99_s)} late (p99){late.which}, over the "
                  f"{format_duration(threshold_s)} that shows in the latencies")
        if late.busy < BUSY_FRACTION and late.wait is not None:
            reason += (f", while its CPU was busy {late.busy:.0%} of the run and it waited {late.wait:.0%} of the "
                       "run for a CPU that other processes held")
        reasons.append(reason)
    if not reasons:
        reasons.append(f"its CPU was busy {busiest.busy:.0%} of the run and its event loop woke up to "
                       f"{format_duration(lag['p99'])} late (p99), under the {BUSY_FRACTION:.0%} and "
                       f"{format_duration(threshold_s)} that would distort the latencies")
    return {"cpu_busy_fraction": busiest.busy, "cpu_wait_fraction": max(waits) if waits else None,
            "loop_lag_s": lag, "lag_threshold_s": threshold_s, "saturated": late is not None or
            busiest.busy >= BUSY_FRACTION, "reason": " and ".join(reasons), "workers": len(lines)}


@dataclass(frozen=True)
class _Worker:
    """One worker's measurement, judged."""

    busy: float            # share of one core its process used
    wait: float | None     # share of the run its loop's thread waited for a CPU (None: not measured)
    lags_s: np.ndarray
    late: bool             # over the lag threshold at more than 1% of its wake-ups, MIN_LATE_WAKEUPS at least
    which: str             # " (worker 2 of 4)" with several workers

    @classmethod
    def of(cls, line: dict[str, Any], threshold_s: float, workers: int) -> _Worker:
        measured, wall_s = line["client"], line["client"]["wall_s"]
        lags_s = np.asarray(measured["lag_us"], dtype=np.float64) / 1e6
        over = int((lags_s > threshold_s).sum())
        wait_s = measured.get("cpu_wait_s")
        return cls(min(1.0, measured["cpu_s"] / wall_s) if wall_s > 0 else 0.0,
                   None if wait_s is None or wall_s <= 0 else min(1.0, wait_s / wall_s), lags_s,
                   over > 0.01 * len(lags_s) and over >= MIN_LATE_WAKEUPS,
                   f" (worker {line['worker'] + 1} of {workers})" if workers > 1 else "")

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.lags_s, 99))


def saturation_warning(block: dict[str, Any] | None, overloaded: bool) -> str | None:
    """One line for people when the client was saturated; None when it was not."""
    if not block or not block["saturated"]:
        return None
    if (block["cpu_wait_fraction"] or 0.0) > block["cpu_busy_fraction"]:  # its CPU was taken, not used up
        advice = "run the client on CPUs that no other work shares"
    else:
        advice = ("run fewer concurrent requests per client process (more --workers, up to one per free CPU) or "
                  "the client on a machine of its own")
    line = f"client saturated: {block['reason']}; latencies include the client's own delay: {advice}, and measure again"
    if overloaded:
        line += "; the run's signs of overload may be the client's, not the server's"
    return line
