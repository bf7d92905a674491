import asyncio
import contextlib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from libs.stack.launcher import LocalStack, free_port

pytestmark = pytest.mark.anyio


async def test_watch_reaps_a_child_that_dies_and_reports_it_once(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path / "logs")
    child = stack.start("decode-0", "decode", "this_module_does_not_exist", [], free_port())
    with capture_logs() as logs:
        watcher = asyncio.create_task(stack.watch(interval_s=0.05))
        for _ in range(200):
            if child.process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # several more rounds: still one report
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert child.process.returncode == 1  # reaped: no zombie left behind
    exits = [e for e in logs if e["event"] == "local service exited"]
    assert exits == [
        {
            "event": "local service exited",
            "log_level": "error",
            "service": "decode-0",
            "code": 1,
            "log": str(tmp_path / "logs" / "decode-0.log"),
        }
    ]
    assert "No module named this_module_does_not_exist" in child.log_path.read_text()
    stack.stop(timeout_s=1)
