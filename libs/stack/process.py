"""The one process launcher: child servers started in their own process group with logs in
files, waited on until they are ready, and stopped so that nothing they started outlives
them, even when this process is killed (reaper.py). The gateway's local stack, tools/bench,
tools/run_batch and the end-to-end tests all start theirs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from libs.stack.reaper import reaper

LOG_TAIL_LINES = 30


class LaunchError(Exception):
    """A server did not come up; the message names it and shows the end of its log."""


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # also the log file's name
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # on top of this process's environment
    health_url: str = ""  # GET answering 200 once the server is ready; "" = ready when started


def python_module(module: str, args: Sequence[str]) -> tuple[str, ...]:
    """argv running `python -m module` with this interpreter (and, via child_environment,
    this process's import path)."""
    return (sys.executable, "-m", module, *args)


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment and import path, so `python -m ...` children find the same
    code and packages (under `bazel run` they live in the runfiles tree)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class RunningProcess:
    spec: ProcessSpec
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def name(self) -> str:
        return self.spec.name

    def exit_code(self) -> int | None:
        return self.process.poll()

    def rss_bytes(self) -> int:
        """Resident memory of the process and everything it started."""
        total = 0
        for proc in [psutil.Process(self.pid), *self.descendants()]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as tests provoke it). Also what
        is left of a child that exited on its own: what it started (vLLM's engine) is still in
        its group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        reaper().forget(self.pid)

    def failure(self, what: str) -> LaunchError:
        return LaunchError(
            f"{self.spec.name} {what}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def stop(self, timeout_s: float) -> None:
        """SIGTERM the server (its own graceful shutdown stops what it started), then SIGKILL
        its process group and every process it started that is still alive, by pid: some
        children (Cleave's local stack) live in process groups of their own."""
        self.finish_stop(self.begin_stop(), timeout_s)

    def begin_stop(self) -> list[psutil.Process]:
        """Sends SIGTERM and returns what the server had started, taken before the signal so
        that a child reparented while the server exits is still known. Stopping several
        servers: begin every stop first, so their graceful shutdowns overlap."""
        known = self.descendants()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        return known

    def finish_stop(self, known: list[psutil.Process], timeout_s: float) -> None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"cleave: {self.spec.name} ignored SIGTERM for {timeout_s:.0f}s; killing", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        # Children that outlived the leader were reparented; the handles taken before the stop
        # still name them (psutil checks the pid was not reused).
        leftovers = [p for p in known if p.is_running()]
        for child in leftovers:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(leftovers, timeout=10)
        reaper().forget(self.pid)


def start(spec: ProcessSpec, log_dir: Path, *, append_log: bool = False) -> RunningProcess:
    """Starts the child in a process group of its own, killed with everything in it if this
    process dies first. `append_log`: a restart keeps the previous run's last words."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    watchdog = reaper()  # started first, so the child is registered right after its fork
    with log_path.open("ab" if append_log else "wb") as handle:
        process = subprocess.Popen(
            list(spec.argv),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_environment(spec.env),
            start_new_session=True,  # its own process group: Ctrl-C here reaches only us
        )
    watchdog.watch(process.pid)
    return RunningProcess(spec, process, log_path)


async def wait_ready(processes: Sequence[RunningProcess], timeout_s: float, poll_s: float = 1.0) -> float:
    """Polls every process's health URL until all answer 200; returns the seconds it took.
    Raises LaunchError when one exits or the timeout passes, with the end of its log."""
    started = time.monotonic()
    pending = [p for p in processes if p.spec.health_url]
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            for process in processes:
                code = process.process.poll()
                if code is not None:
                    raise process.failure(f"exited with code {code} while starting")
            still = []
            for process in pending:
                try:
                    ready = (await client.get(process.spec.health_url)).status_code == httpx.codes.OK
                except httpx.HTTPError:
                    ready = False
                if not ready:
                    still.append(process)
            pending = still
            if not pending:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                first = pending[0]
                raise first.failure(f"not ready after {timeout_s:.0f}s (polling {first.spec.health_url})")
            await asyncio.sleep(poll_s)


@dataclass
class Launched:
    """Processes started together and stopped in reverse order."""

    processes: list[RunningProcess] = field(default_factory=list)

    def stop(self, timeout_s: float) -> None:
        for process in reversed(self.processes):
            process.stop(timeout_s)
