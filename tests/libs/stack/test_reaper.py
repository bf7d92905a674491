"""Children die with their parent however it dies, SIGKILL included, and so do the processes
they started (vLLM's engine in a worker's process group): the chain run_batch -> gateway ->
worker -> engine, with small stand-ins for each."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from libs.stack.process import child_environment, python_module

# Each level writes its pid to DIR/<name>.pid, then starts the next through the launcher (as
# run_batch starts the gateway and the gateway its workers) and waits forever.
LEVEL = """
import os, sys, time
from pathlib import Path
from libs.stack.process import ProcessSpec, python_module, start
folder, name, nxt = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
(folder / f"{name}.pid").write_text(str(os.getpid()))
if nxt:
    module = "worker" if nxt == ["worker"] else "level"
    start(ProcessSpec(nxt[0], python_module(module, [str(folder), *nxt])), folder)
time.sleep(600)
"""
# A worker whose engine is a forked process in its own process group, as vLLM's EngineCore.
WORKER = """
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
if os.fork() == 0:
    (folder / "engine.pid").write_text(str(os.getpid()))
else:
    (folder / "worker.pid").write_text(str(os.getpid()))
time.sleep(600)
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "level.py").write_text(textwrap.dedent(LEVEL))
    (code / "worker.py").write_text(textwrap.dedent(WORKER))
    monkeypatch.setattr(sys, "path", [str(code), *sys.path])  # children inherit sys.path
    return tmp_path


def wait_for_pids(folder: Path, names: list[str], timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [folder / f"{name}.pid" for name in names]
        if all(f.exists() and f.read_text() for f in files):
            return {name: int(f.read_text()) for name, f in zip(names, files, strict=True)}
        time.sleep(0.05)
    raise AssertionError(f"not all of {names} started; see the logs in {folder}")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def test_sigkill_of_the_top_process_takes_the_whole_tree_down(modules: Path) -> None:
    folder = modules
    top = subprocess.Popen(
        python_module("level", [str(folder), "run_batch", "gateway", "worker"]),
        env=child_environment({}),
        start_new_session=True,
    )
    try:
        pids = wait_for_pids(folder, ["run_batch", "gateway", "worker", "engine"])
        tree = [p.pid for p in psutil.Process(top.pid).children(recursive=True)]  # reapers too
        assert set(pids.values()) - {top.pid} <= set(tree)
        top.send_signal(signal.SIGKILL)
        top.wait()
        assert wait_gone([*pids.values(), *tree], timeout_s=5) == []
    finally:
        for pid in [top.pid, *(int(f.read_text() or 0) for f in folder.glob("*.pid"))]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# A parent that fails on its way out without stopping what it started (no cleanup ran).
CARELESS_PARENT = """
import sys, time
from pathlib import Path
from libs.stack.process import ProcessSpec, python_module, start
folder = Path(sys.argv[1])
start(ProcessSpec("worker", python_module("worker", [str(folder)])), folder)
while not ((folder / "worker.pid").exists() and (folder / "engine.pid").exists()):
    time.sleep(0.05)
sys.exit(1)
"""


def test_a_parent_that_exits_without_stopping_its_children_takes_them_down(modules: Path) -> None:
    folder = modules
    parent = subprocess.run(
        [sys.executable, "-c", CARELESS_PARENT, str(folder)], env=child_environment({}), timeout=120
    )
    assert parent.returncode == 1
    pids = wait_for_pids(folder, ["worker", "engine"])
    try:
        assert wait_gone(list(pids.values()), timeout_s=5) == []
    finally:
        for pid in pids.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
