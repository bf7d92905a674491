"""Children that die with their parent, however the parent dies, `kill -9` included.

Every child the launcher starts leads a process group of its own, and what the child starts
stays in that group (vLLM's EngineCore, forked by a worker, is in its worker's group). A
reaper is a tiny watchdog process, one per parent, that is told each group as it starts
and is forgotten; it holds the read end of a pipe whose only writer is the parent. When the
parent exits for any reason the kernel closes the write end, the reaper reads EOF and
SIGKILLs every group still registered, engines included.

Why not only prctl(PR_SET_PDEATHSIG): it signals the child alone, not the processes the
child started (an engine orphaned by a SIGKILLed worker keeps its cores and memory); it
fires when the *thread* that forked the child exits, which a child started from a worker
thread would not survive; and setting it needs a preexec_fn, unsafe in a process with
threads (the gateway restarts children while gRPC's threads run). A pipe's EOF has none of
these problems.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading

# Runs as `python -c`: no imports beyond the standard library, so it starts in ~20 ms and
# never depends on the parent's import path. "+N" registers process group N, "-N" forgets it.
REAPER_SCRIPT = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    sign, pgid = line[0], int(line[1:])
    (groups.add if sign == "+" else groups.discard)(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Reaper:
    """The watchdog of this process's children (see the module's docstring)."""

    def __init__(self, groups: set[int] | None = None) -> None:
        self._groups: set[int] = set()
        self._process = subprocess.Popen(
            [sys.executable, "-c", REAPER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: Ctrl-C in a terminal, or a kill of this process's group, does
            # not reach it; it ends on the pipe's EOF alone.
            start_new_session=True,
        )
        assert self._process.stdin is not None
        self._pipe = self._process.stdin  # non-inheritable: no other child holds it open
        self._lock = threading.Lock()
        for pgid in groups or ():
            self.watch(pgid)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def watch(self, pgid: int) -> None:
        self._groups.add(pgid)
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """The group was stopped here; a later process may get its number."""
        self._groups.discard(pgid)
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError):
            self._pipe.write(line.encode())
            self._pipe.flush()


_reaper: Reaper | None = None
_reaper_lock = threading.Lock()


def reaper_pid() -> int | None:
    """The pid of this process's reaper (a child that lives as long as this process), if any."""
    return _reaper.pid if _reaper is not None and _reaper.alive else None


def reaper() -> Reaper:
    """This process's reaper, started on first use (a process that starts no child has none)."""
    global _reaper
    with _reaper_lock:
        if _reaper is None or not _reaper.alive:
            # Someone killed the last one: a new one takes over the groups it watched.
            _reaper = Reaper(_reaper._groups if _reaper is not None else None)
        return _reaper
