"""Resident memory of every process of a stack over time, and its trend per process.

The stack is a process tree (the gateway and what it started: tokenizer, workers, vLLM's
engine cores); each sample walks the tree again, so processes started later (a restarted
worker) are picked up. The trend is the least-squares slope of RSS against time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil


@dataclass
class Series:
    pid: int
    label: str
    points: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MiB)

    def slope_mib_per_min(self, after_s: float = 0.0) -> float | None:
        points = [(t, m) for t, m in self.points if t >= after_s]
        if len(points) < 3:
            return None
        n = len(points)
        mean_t = sum(t for t, _ in points) / n
        mean_m = sum(m for _, m in points) / n
        var = sum((t - mean_t) ** 2 for t, _ in points)
        if var == 0:
            return None
        cov = sum((t - mean_t) * (m - mean_m) for t, m in points)
        return cov / var * 60.0

    @property
    def first_mib(self) -> float:
        return self.points[0][1]

    @property
    def last_mib(self) -> float:
        return self.points[-1][1]

    @property
    def max_mib(self) -> float:
        return max(m for _, m in self.points)


def label(process: psutil.Process) -> str:
    """A readable name: `services.worker.main --role decode`, or the process title (vLLM
    names its engine core `VLLM::EngineCore`) and the Cleave service it runs under."""
    own = _own_label(process)
    if own.startswith("services."):
        return own
    with contextlib.suppress(psutil.Error):
        for parent in process.parents():
            above = _own_label(parent)
            if above.startswith("services."):
                return f"{own} < {above.removeprefix('services.').removesuffix('.main')}"
    return own


def _own_label(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        if "-m" in argv and argv.index("-m") + 1 < len(argv):
            text = argv[argv.index("-m") + 1]
            if "--role" in argv and argv.index("--role") + 1 < len(argv):
                text += f" --role {argv[argv.index('--role') + 1]}"
            return text
        if "-c" in argv:  # multiprocessing's helpers (resource tracker, spawn)
            return "python -c " + " ".join(" ".join(argv[argv.index("-c") + 1 :]).split())[:40]
        return process.name()
    return "?"


class TreeSampler:
    def __init__(self, roots: Sequence[int]) -> None:
        self._roots = [psutil.Process(pid) for pid in roots]
        self._started = time.monotonic()
        self.series: dict[int, Series] = {}

    def sample(self) -> None:
        now = time.monotonic() - self._started
        for process in self._tree():
            with contextlib.suppress(psutil.Error):
                rss = process.memory_info().rss / 2**20
                if process.pid not in self.series:
                    self.series[process.pid] = Series(process.pid, label(process))
                self.series[process.pid].points.append((now, rss))

    def _tree(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for root in self._roots:
            with contextlib.suppress(psutil.Error):
                for process in [root, *root.children(recursive=True)]:
                    found[process.pid] = process
        return list(found.values())


def listening_pid(port: int) -> int | None:
    """The process listening on 127.0.0.1:`port` (a gateway given by --url), if visible."""
    with contextlib.suppress(psutil.Error):
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
                return connection.pid
    return None
