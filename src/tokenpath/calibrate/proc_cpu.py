"""Another process's CPU time, read from Linux's /proc: what a measurement charges a server it runs apart.

Each thread's `/proc/PID/task/TID/schedstat` starts with the nanoseconds it has run on a CPU; their sum
is the process's CPU time to the nanosecond. Where schedstat is missing, `/proc/PID/stat`'s utime and
stime (fields 14 and 15, user and system time of all its threads) give it in clock ticks, 10 ms each
on most kernels: too coarse for a short measurement, so schedstat is read first.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
# /proc/PID/stat's fields after the command (`pid (comm) state ...`): utime and stime are fields 14
# and 15 of the line, so the 12th and 13th after the closing parenthesis (the state is the 1st).
_UTIME, _STIME = 11, 12


def schedstat_ns(text: str) -> int:
    """The nanoseconds on a CPU from one thread's schedstat line (`run_ns wait_ns timeslices`)."""
    return int(text.split()[0])


def stat_ticks(text: str) -> int:
    """utime + stime, in clock ticks, from a /proc/PID/stat line; the command between the parentheses
    may hold spaces and parentheses of its own, so the fields are counted from the last ')'."""
    fields = text[text.rindex(")") + 1:].split()
    return int(fields[_UTIME]) + int(fields[_STIME])


def cpu_s(pid: int, proc: Path = PROC) -> float:
    """Process `pid`'s CPU seconds so far, all its threads: the sum of their schedstat, else stat's
    utime + stime over the clock's ticks per second."""
    folder = proc / str(pid)
    total_ns, threads = 0, 0
    for task in (folder / "task").glob("*"):
        try:
            total_ns += schedstat_ns((task / "schedstat").read_text())
            threads += 1
        except (OSError, ValueError, IndexError):  # the thread ended, or no schedstat on this kernel
            continue
    if threads:
        return total_ns / 1e9
    return stat_ticks((folder / "stat").read_text()) / os.sysconf("SC_CLK_TCK")
