"""How many cores this process may run on: the cores its CPU affinity allows (``taskset``, a container's
``--cpuset-cpus``), capped by its cgroup's CPU quota (a container's ``--cpus``), which ``os.cpu_count()`` ignores.

llama.cpp's threads wait for each other at every layer: more threads than the cores the process is given leaves
each step waiting on a thread the scheduler has parked, many times slower than one thread per usable core."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def usable_cores() -> int:
    """The cores this process may use (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(CGROUP)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def cpu_quota(cgroup: Path) -> float | None:
    """The CPU time this process's cgroup may use, in cores (``--cpus 1.5``: 1.5); None where no quota is set or it
    cannot be read (no cgroups, another OS)."""
    try:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1: a quota of -1 is none
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
