"""What ``specdec demo`` says about the machine it times on: its speed ratios need a quiet CPU.

A verify pass on a small model is many small ops; with another process on the cores each of them waits for one,
and the ratio can invert (README, "Speed on a shared CPU"). The demo cannot fix that, but it can say so.
"""

from __future__ import annotations

import os
import time

#: printed under the demo's speedup (the figures behind it: README, "Speed on a shared CPU")
QUIET_MACHINE_NOTE = "speed ratios need a quiet machine; on a shared CPU run it with OMP_NUM_THREADS=1"
#: other processes using this many cores or more make the demo's timings unrepresentative
BUSY_CORES = 0.5


def usable_cpus() -> int:
    """Cores this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have spent busy (not idle or waiting on I/O), from /proc/stat; None without it."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / ticks


def cores_busy_elsewhere(window: float = 0.25) -> float:
    """Cores other processes keep busy now: /proc/stat over ``window`` seconds less this process's own CPU time
    (its OpenMP threads may still spin after a run), or the 1-minute load average where /proc/stat is missing
    (it lags by about a minute and counts this process too)."""
    first, own, start = _busy_cpu_seconds(), time.process_time(), time.perf_counter()
    if first is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    time.sleep(window)
    busy = _busy_cpu_seconds() - first - (time.process_time() - own)
    return max(busy, 0.0) / (time.perf_counter() - start)


def busy_machine_warning(busy: float | None = None, cpus: int | None = None) -> str | None:
    """One line when other processes keep at least :data:`BUSY_CORES` cores busy, else None."""
    busy = cores_busy_elsewhere() if busy is None else busy
    cpus = usable_cpus() if cpus is None else cpus
    if busy < BUSY_CORES:
        return None
    return f"warning: other processes keep {busy:.1f} of {cpus} cores busy; {QUIET_MACHINE_NOTE}"


def speed_note() -> str:
    """The line under a side-by-side speedup: the quiet-machine note, and what other processes use as the run
    ends when that is enough to have skewed it (a process that started mid-run escapes the warning at the start)."""
    busy = cores_busy_elsewhere()
    if busy < BUSY_CORES:
        return QUIET_MACHINE_NOTE
    return f"other processes keep {busy:.1f} of {usable_cpus()} cores busy as it ends: {QUIET_MACHINE_NOTE}"
