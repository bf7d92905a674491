"""How many CPUs this process may really use: the cores it may run on (its affinity), capped
by its container's CPU quota (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`).

In a Kubernetes pod without a cpuset (every pod but a Guaranteed one under the static CPU
manager) the affinity is the whole node, 64 cores say, while the quota allows 2: a pool of
64 threads would be throttled to 2 CPUs' worth of time and contend with itself. Thread pools
and engine threads are sized from this instead.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (1.5 = one and a half), or None when
    there is none (no limit, no cgroup file system, an unreadable file). cgroup v2: the
    tightest `cpu.max` of this process's cgroup and its ancestors (a container's own cgroup is
    the root of its namespace); v1: the cpu controller's quota and period."""
    limits = [limit for folder in _v2_folders(root, proc_cgroup) if (limit := _cpu_max(folder)) is not None]
    if limits:
        return min(limits)
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v2_folders(root: Path, proc_cgroup: Path) -> list[Path]:
    """This process's v2 cgroup folder and its ancestors up to `root`."""
    relative = ""
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                relative = line[3:].strip().lstrip("/")
    except OSError:
        pass
    folder = root / relative if relative and (root / relative).is_dir() else root
    folders = [folder]
    while folder != root and root in folder.parents:
        folder = folder.parent
        folders.append(folder)
    return folders


def _cpu_max(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]  # "max 100000" or "150000 100000"
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The affinity's core count, capped by the cgroup quota rounded up (at least 1)."""
    count = affinity_count()
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return count
