"""The process's peak resident memory: metrics.jsonl's `memory/peak_rss_gb`; and the memory it
may use (the machine's, or its container's limit), which a step's batch must fit in
(minirl/run/loop.py `check_batch`).

Peak RSS (resident set size) is the most physical memory the operating system has seen this
process hold at once since it started: on Linux `VmHWM` in /proc/self/status, elsewhere
`resource.getrusage(RUSAGE_SELF).ru_maxrss` (bytes on macOS). Not `ru_maxrss` on Linux: a
process started from a bigger one (a notebook's kernel, pytest, a benchmark's driver) inherits
that parent's peak in it across the fork and exec, so a 2 GB run launched from a 9 GB driver
would report 9 GB; VmHWM belongs to the process's own memory map (tests/run/test_memory.py).
It only grows, so the value a step logs is the peak of the run so far, compiles and evaluations
included; what `/usr/bin/time -v` reports as "Maximum resident set size" at the end is the last
step's value or a little more (the final evaluation, the export). It counts this process only: with the workers in other processes
(`rl.workers=processes`, Ray) it is the driver's own. Windows has no `resource` module: None.
Standard library only, on purpose.
"""

from __future__ import annotations

import os
import sys


def peak_rss_gb() -> float | None:
    """This process's peak resident memory so far, in GB (1e9 bytes), or None where the
    platform does not report it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
                    return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError, IndexError):
        pass  # not Linux: getrusage below
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / 1e9


# A container's memory limit (cgroup v2, then v1); "max" or a huge number means none is set.
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory_bytes(limits=CGROUP_LIMITS) -> int | None:
    """The memory this process may use, in bytes: the machine's physical memory, or the
    container's limit where that is lower; None where the platform says neither."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        physical = None
    for path in limits:
        try:
            with open(path) as f:
                limit = int(f.read().strip())
        except (OSError, ValueError):  # no such file, or "max"
            continue
        return limit if physical is None else min(limit, physical)
    return physical
