"""The local stack's connector over a fake stack (no processes) and a real worker pool."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from libs.config.roles import Role
from libs.gateway.fleet.pool import WorkerPool
from libs.planner.connectors.local import LocalConnector, Phase
from libs.planner.state import Counts
from libs.stack.launcher import LocalStack

pytestmark = pytest.mark.anyio


@dataclass
class FakeService:
    name: str
    role: str
    address: str
    ready_after: int = 0  # health checks answered NOT_SERVING first
    checks: int = 0
    stopped: bool = False
    events: list[str] = field(default_factory=list)

    async def check(self) -> bool:
        self.checks += 1
        return self.checks > self.ready_after

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopped = True
        self.events.append(f"SIGTERM {self.name}")


@dataclass
class FakeStack:
    services: list[Any] = field(default_factory=list)
    started: list[tuple[str, str, Any]] = field(default_factory=list)
    port: int = 7000

    def start(self, name: str, role: str, module: str, config: Any) -> FakeService:
        self.port += 1
        service = FakeService(name, role, f"127.0.0.1:{self.port}", ready_after=2)
        self.services.append(service)
        self.started.append((name, role, config))
        return service


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def fleet() -> tuple[FakeStack, WorkerPool, LocalConnector]:
    stack = FakeStack()
    stack.services = [
        FakeService("tokenizer", "tokenizer", "127.0.0.1:6999"),
        FakeService("prefill-0", "prefill", "127.0.0.1:7100"),
        FakeService("decode-0", "decode", "127.0.0.1:7200"),
    ]
    pool = WorkerPool({Role.PREFILL: ["127.0.0.1:7100"], Role.DECODE: ["127.0.0.1:7200"]})
    connector = LocalConnector(
        cast(LocalStack, stack),
        pool,
        lambda role, index: {"role": role, "index": index},
        "services.worker.main",
        poll_s=0.01,
    )
    return stack, pool, connector


async def test_new_workers_join_the_pool_once_they_serve() -> None:
    stack, pool, connector = fleet()
    assert (await connector.state()).desired == Counts(1, 1)
    await connector.scale_to(Counts(1, 3))
    state = await connector.state()
    assert state.desired == Counts(1, 3) and state.starting[Role.DECODE] == 2
    assert [name for name, _, _ in stack.started] == ["decode-1", "decode-2"]
    assert [config["index"] for _, _, config in stack.started] == [1, 2]
    assert len(pool.endpoints) == 2  # not before their health says SERVING
    await until(lambda: len(pool.endpoints) == 4)
    assert (await connector.state()).starting[Role.DECODE] == 0
    await connector.close()
    await pool.close()


async def test_a_removed_worker_is_retired_first_and_stopped_only_when_its_requests_are_done() -> None:
    stack, pool, connector = fleet()
    await connector.scale_to(Counts(1, 2))
    await until(lambda: len(pool.endpoints) == 3)
    old, new = (e for e in pool.endpoints if e.role is Role.DECODE)
    old.admitted, new.admitted = 2, 1  # the new one is the less loaded: it goes
    await connector.scale_to(Counts(1, 1))
    assert new not in pool.endpoints and new in pool.retiring  # no new request goes to it
    state = await connector.state()
    assert state.desired == Counts(1, 1) and state.retiring[Role.DECODE] == 1
    managed = next(m for m in connector.workers if m.name == "decode-1")
    service = cast(FakeService, managed.service)
    await asyncio.sleep(0.1)
    assert not service.stopped  # its request is still running
    new.admitted = 0
    # The stop runs in a thread: wait for the connector to have seen it end, not only the fake.
    await until(lambda: managed.phase is Phase.GONE and service.stopped)
    assert service not in stack.services  # out of the stack: never restarted
    assert (await connector.state()).retiring[Role.DECODE] == 0
    whats = [what for _, name, what in connector.events if name == "decode-1"]
    assert whats == ["starting", "ready", "retired from routing", "drained", "stopped (SIGTERM)"]
    await connector.close()
    await pool.close()


async def test_a_worker_still_starting_is_removed_first_and_at_once() -> None:
    _stack, pool, connector = fleet()
    await connector.scale_to(Counts(2, 1))
    await connector.scale_to(Counts(1, 1))
    starting = cast(FakeService, next(m for m in connector.workers if m.name == "prefill-1").service)
    await until(lambda: starting.stopped)
    assert [e.address for e in pool.endpoints if e.role is Role.PREFILL] == ["127.0.0.1:7100"]
    await connector.close()
    await pool.close()
