"""How busy the machine was during a live run: the host's CPU (/proc/stat), the stack's own
processes (the tree under the gateway), this load generator, and everything else."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tools.bench.proc_cpu import process_tree


def _cpu_times(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs."""
    fields = [float(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def _tree_cpu_s(root: int) -> float:
    return sum(info.cpu_s for info in process_tree(root).values())


class HostSampler:
    def __init__(self, root_pid: int | None = None) -> None:
        self._root = root_pid
        self._wall = time.monotonic()
        self._busy, self._total = _cpu_times()
        self._self = time.process_time()
        self._tree = _tree_cpu_s(root_pid) if root_pid is not None else 0.0

    def finish(self) -> dict[str, float]:
        wall = time.monotonic() - self._wall
        busy, total = _cpu_times()
        cores = float(os.cpu_count() or 1)
        host_busy = (busy - self._busy) / max(total - self._total, 1.0)
        stack = (_tree_cpu_s(self._root) - self._tree) / wall if self._root is not None else 0.0
        generator = (time.process_time() - self._self) / wall
        return {
            "cores": cores,
            "host_busy": host_busy,
            "stack_cores": stack,
            "load_generator_cores": generator,
            "others_cores": max(host_busy * cores - stack - generator, 0.0),
            "load_avg": os.getloadavg()[0],
            "wall_s": wall,
        }
