"""How much memory this machine can still give a run, and the one-line error when a run needs more.

A run sized past the machine is refused before it allocates: the kernel's out-of-memory killer would
otherwise end it with no message, after minutes and gigabytes.
"""

from __future__ import annotations

import os

from tokenpath.config.errors import UserError

GIB = 2**30
# Runs with more output tokens than this keep per-request results and an ITL histogram only, not
# every token's time (sim/simulate.py); the memory estimate of a run (workload/size.py) counts on it.
KEEP_TOKENS_LIMIT = 20_000_000

# A container's limit and what it already uses: cgroup v2, then v1, as mounted inside the container.
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_bytes() -> int | None:
    """Bytes that can still be allocated without swapping: the kernel's MemAvailable (free memory plus
    the page cache it can drop; `free`'s "available"), less where a cgroup's limit leaves less; else
    free pages (sysconf); None where the platform tells neither."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024  # in kB
                    break
    except (OSError, ValueError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            with open(limit_file, encoding="ascii") as limit, open(usage_file, encoding="ascii") as usage:
                # "max" (v2) or a huge number (v1) means no limit
                available = min(available, int(limit.read()) - int(usage.read()))
            break
        except (OSError, ValueError):
            continue
    return max(available, 0)


def require(needed_bytes: int, what: str, fix: str) -> None:
    """Refuse, with one line, a run estimated to need more than is available. `what` starts with the
    key at fault and says what is large ("workload.num_requests: 10,000,000 requests"); `fix` says what
    to lower."""
    available = available_bytes()
    if available is not None and needed_bytes > available:
        raise UserError(f"{what} need about {needed_bytes / GIB:,.1f} GiB of memory and this machine has "
                        f"{available / GIB:,.1f} GiB available; {fix}")
