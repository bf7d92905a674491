import asyncio
import contextlib
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from structlog.testing import capture_logs

from libs.stack.launcher import LocalStack
from libs.stack.metrics import RESTARTS
from libs.stack.process import LaunchError
from libs.stack.restarts import RestartPolicy
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
    stack = LocalStack(tmp_path / "logs", restart_policy=RestartPolicy(max_restarts=0))
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
    assert [e["event"] for e in logs if e["event"].startswith("not restarting")] == [
        "not restarting: it crashed too often"
    ]
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


# A service that crashes on its first run, once it has bound its port and started a process
# of its own (as a worker's vLLM engine): --model names a marker file; present = serve.
CRASHING_SERVICE = FAKE_SERVICE.replace(
    "    await asyncio.sleep(float(config.model))\n",
    """    from pathlib import Path
    import os, subprocess
    marker = Path(config.model)
    if not marker.exists():
        marker.write_text("crashed once")
        engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        marker.with_suffix(".engine").write_text(str(engine.pid))
        os._exit(1)
""",
)


@pytest.fixture
def crashing_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    assert CRASHING_SERVICE != FAKE_SERVICE
    (tmp_path / "crashing_service.py").write_text(textwrap.dedent(CRASHING_SERVICE))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    return "crashing_service"


async def poll(condition: object, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_a_crashed_child_is_restarted_on_its_address_and_what_it_left_is_killed(
    tmp_path: Path, crashing_module: str
) -> None:
    policy = RestartPolicy(backoff_s=0.1, max_backoff_s=0.2, max_restarts=3, window_s=60)
    stack = LocalStack(tmp_path / "logs", restart_policy=policy)
    marker = tmp_path / "crashed"
    before = RESTARTS.labels("decode-0")._value.get()
    service = stack.start("decode-0", "decode", crashing_module, TokenizerServerConfig(model=str(marker)))
    address = service.wait_bound(timeout_s=30)
    first_pid = service.running.pid
    watcher = asyncio.create_task(stack.watch(interval_s=0.05))
    try:
        with capture_logs() as logs:
            await poll(lambda: service.running.pid != first_pid)
            await stack.wait_ready(timeout_s=60, progress=False)
        assert service.address == address  # where the gateway's pool looks for it
        assert len(service.restarts) == 1 and RESTARTS.labels("decode-0")._value.get() == before + 1
        # The "engine" the crashed run started was killed with its process group.
        engine = int(marker.with_suffix(".engine").read_text())
        await poll(lambda: not psutil.pid_exists(engine) or psutil.Process(engine).status() == "zombie")
        events = [e["event"] for e in logs]
        assert events[:3] == ["local service exited", "restarting", "restarted"]
        assert [e["in_s"] for e in logs if e["event"] == "restarting"] == [0.1]
        # One log, both runs: the crash's last words are kept.
        assert "restarted by the local stack (restart 1)" in service.log_tail(200)
    finally:
        watcher.cancel()
        stack.stop(timeout_s=5)
    assert (
        not psutil.pid_exists(service.running.pid) or psutil.Process(service.running.pid).status() == "zombie"
    )


async def test_a_child_that_keeps_crashing_backs_off_and_is_left_down(tmp_path: Path) -> None:
    policy = RestartPolicy(backoff_s=0.05, max_backoff_s=0.15, max_restarts=3, window_s=60)
    stack = LocalStack(tmp_path / "logs", restart_policy=policy)
    service = stack.start("prefill-0", "prefill", "this_module_does_not_exist", TokenizerServerConfig())
    watcher = asyncio.create_task(stack.watch(interval_s=0.02))
    try:
        with capture_logs() as logs:
            await poll(lambda: any(e["event"].startswith("not restarting") for e in logs))
    finally:
        watcher.cancel()
        stack.stop(timeout_s=5)
    assert [e["in_s"] for e in logs if e["event"] == "restarting"] == [0.05, 0.1, 0.15]
    assert len(service.restarts) == 3
    assert service.running.exit_code() == 1


async def test_a_child_that_exits_cleanly_or_during_stop_is_not_restarted(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path / "logs", restart_policy=RestartPolicy(backoff_s=0.01))
    clean = stack.start("kvstore", "kvstore", "this", TokenizerServerConfig())  # the Zen; exit 0
    assert clean.running.process.wait() == 0
    stack.supervise_once(now=100.0)
    stack.supervise_once(now=200.0)
    assert clean.restarts == [] and clean.restart_at is None
    crashed = stack.start("tokenizer", "tokenizer", "this_module_does_not_exist", TokenizerServerConfig())
    crashed.running.process.wait()
    stack.stop(timeout_s=1)
    stack.supervise_once(now=300.0)
    assert crashed.restarts == [] and crashed.restart_at is None


async def test_stacks_sharing_a_log_folder_never_read_each_others_ports(
    tmp_path: Path, fake_module: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # What another stack, started by another process with the same cache, has written.
    foreign = logs / "fast.1.port"
    foreign.write_text("1")
    stack = LocalStack(logs)
    try:
        fast = stack.start("fast", "prefill", fake_module, TokenizerServerConfig(model="0"))
        address = fast.wait_bound(timeout_s=30)
        assert not address.endswith(":1")
        assert fast.port_file != foreign and fast.port_file.exists()
    finally:
        stack.stop(timeout_s=5)
    assert not fast.port_file.exists() and foreign.read_text() == "1"
