import asyncio
import contextlib
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from structlog.testing import capture_logs

from libs.stack.launcher import LocalStack
from libs.stack.process import LaunchError
from libs.tokenization.server_config import TokenizerServerConfig

pytestmark = pytest.mark.anyio

# A stand-in service: parses the flags a launcher renders, binds port 0, reports it through
# the port file, serves gRPC health. It takes --model as seconds to "load" first.
FAKE_SERVICE = """
import asyncio, sys, time
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from libs.config.flags import parse
from libs.rpc.ports import write_port_file
from libs.tokenization.server_config import TokenizerServerConfig

async def main():
    config = parse(TokenizerServerConfig, sys.argv[1:])
    server = grpc.aio.server()
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    write_port_file(config.port_file, port)
    await asyncio.sleep(float(config.model))
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()

asyncio.run(main())
"""


@pytest.fixture
def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fake_service.py").write_text(textwrap.dedent(FAKE_SERVICE))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])  # children inherit sys.path
    return "fake_service"


async def test_children_bind_port_zero_and_report_it_before_they_serve(
    tmp_path: Path, fake_module: str
) -> None:
    stack = LocalStack(tmp_path / "logs")
    try:
        slow = stack.start("slow", "decode", fake_module, TokenizerServerConfig(model="1.5"))
        fast = stack.start("fast", "prefill", fake_module, TokenizerServerConfig(model="0"))
        # The port is known while the service still loads: nobody picked it for the child.
        address = slow.wait_bound(timeout_s=30)
        assert not await slow.check()
        await stack.wait_ready(timeout_s=60, progress=False)
        assert stack.addresses("decode") == [address] and stack.addresses("prefill") == [fast.address]
        assert slow.address != fast.address and slow.ready_after_s is not None and slow.ready_after_s >= 1.5
        pids = [s.running.pid for s in stack.services]
    finally:
        stack.stop(timeout_s=5)
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


async def test_a_child_that_dies_while_starting_fails_the_wait_with_its_log(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path / "logs")
    stack.start("broken", "tokenizer", "this_module_does_not_exist", TokenizerServerConfig())
    with pytest.raises(LaunchError, match=r"broken exited with code 1[\s\S]*No module named this_module"):
        await stack.wait_ready(timeout_s=30, progress=False)
    stack.stop(timeout_s=1)


async def test_watch_reaps_a_child_that_dies_and_reports_it_once(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path / "logs")
    child = stack.start("decode-0", "decode", "this_module_does_not_exist", TokenizerServerConfig())
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
    stack.stop(timeout_s=1)
