"""The local stack's connector: it runs in the gateway that started the stack (the one
gateway of a local stack, which owns its workers as child processes) and changes the fleet
by starting and stopping worker processes, mock or real.

- Up: a worker process is started from the same config the stack's own workers were made
  from (libs/stack/local.py worker_config); once its gRPC health says SERVING it joins the
  gateway's pool. Until then it is `starting`.
- Down (the drain): the worker is retired from the pool (WorkerPool.retire: no new request
  goes to it), its requests in flight finish (the pool's in-flight count reaches 0; a
  prefill worker also waits until its handed-over KV has been pulled, `num_leased` 0), and
  only then is it sent SIGTERM (Service.stop: SIGTERM, SIGKILL after the timeout). No
  request is lost by this order whatever the worker does on SIGTERM; workers that also drain
  on SIGTERM (finishing what they hold) make it safe for requests of other gateways too
  (docs/planner.md). A worker still starting is stopped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.fleet.pool import Endpoint, WorkerPool
from libs.planner.connectors.base import FleetState
from libs.planner.state import Counts
from libs.stack.launcher import LocalStack, Service
from libs.stack.process import LaunchError

log = structlog.get_logger(__name__)

PREFIXES = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.BOTH: "pd"}


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RETIRING = "retiring"
    GONE = "gone"


@dataclass(eq=False)
class Managed:
    name: str
    role: Role
    service: Service
    phase: Phase
    endpoint: Endpoint | None = None
    task: asyncio.Task[None] | None = None
    since: float = 0.0


class LocalConnector:
    def __init__(
        self,
        stack: LocalStack,
        pool: WorkerPool,
        new_config: Callable[[Role, int], Any],
        module: str,
        *,
        ready_timeout_s: float = 900.0,
        drain_timeout_s: float = 600.0,
        stop_timeout_s: float = 60.0,
        poll_s: float = 0.5,
    ) -> None:
        self._stack = stack
        self._pool = pool
        self._new_config = new_config
        self._module = module
        self._ready_timeout_s = ready_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._poll_s = poll_s
        self.workers: list[Managed] = []
        self.events: list[tuple[float, str, str]] = []  # (time, worker, what): for reports
        by_address = {e.address: e for e in pool.endpoints}
        for service in stack.services:
            role = _role_of(service.role)
            if role is None:
                continue
            endpoint = by_address.get(service.address)
            self.workers.append(
                Managed(service.name, role, service, Phase.READY, endpoint, since=time.monotonic())
            )
        self._serial = {role: sum(m.role is role for m in self.workers) for role in Role}

    async def state(self) -> FleetState:
        def count(*phases: Phase) -> dict[Role, int]:
            return {role: sum(m.role is role and m.phase in phases for m in self.workers) for role in Role}

        return FleetState(
            desired=Counts.of(count(Phase.STARTING, Phase.READY)),
            starting=count(Phase.STARTING),
            retiring=count(Phase.RETIRING),
        )

    async def scale_to(self, target: Counts, load: dict[str, float] | None = None) -> None:
        for role in Role:
            present = [m for m in self.workers if m.role is role and m.phase in (Phase.STARTING, Phase.READY)]
            wanted = target.get(role)
            for _ in range(wanted - len(present)):
                self._start(role)
            surplus = len(present) - wanted
            if surplus > 0:
                for managed in sorted(present, key=_removal_order)[:surplus]:
                    self._remove(managed)

    def _record(self, managed: Managed, what: str) -> None:
        self.events.append((time.monotonic(), managed.name, what))
        log.info("planner: worker " + what, worker=managed.name, role=managed.role.value)

    def _start(self, role: Role) -> None:
        index = self._serial[role]
        self._serial[role] += 1
        name = f"{PREFIXES[role]}-{index}"
        service = self._stack.start(name, role.value, self._module, self._new_config(role, index))
        managed = Managed(name, role, service, Phase.STARTING, since=time.monotonic())
        self.workers.append(managed)
        self._record(managed, "starting")
        managed.task = asyncio.create_task(self._bring_up(managed))

    async def _bring_up(self, managed: Managed) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        while True:
            try:
                if await managed.service.check():
                    break
            except LaunchError as error:  # exited while starting: the stack's supervision restarts it
                log.warning(
                    "planner: new worker exited while starting", worker=managed.name, error=str(error)
                )
            if time.monotonic() > deadline:
                log.error("planner: new worker never became ready; stopping it", worker=managed.name)
                await self._stop(managed)
                return
            await asyncio.sleep(self._poll_s)
        managed.endpoint = self._pool.connect(managed.service.address, managed.role)
        managed.phase = Phase.READY
        self._record(managed, "ready")

    def _remove(self, managed: Managed) -> None:
        if managed.phase is Phase.STARTING:
            if managed.task is not None:
                managed.task.cancel()
            managed.phase = Phase.RETIRING
            managed.task = asyncio.create_task(self._stop(managed))
            return
        managed.phase = Phase.RETIRING
        if managed.endpoint is not None and managed.endpoint in self._pool.endpoints:
            self._pool.retire(managed.endpoint)
        self._record(managed, "retired from routing")
        managed.task = asyncio.create_task(self._drain(managed))

    async def _drain(self, managed: Managed) -> None:
        """Waits for the retired worker's requests (and, on prefill, its leases) to end."""
        deadline = time.monotonic() + self._drain_timeout_s
        endpoint = managed.endpoint
        while endpoint is not None and time.monotonic() < deadline:
            if endpoint.admitted == 0 and await self._leases(endpoint) == 0:
                break
            await asyncio.sleep(self._poll_s)
        else:
            if endpoint is not None:
                log.warning("planner: drain timed out; stopping the worker anyway", worker=managed.name)
        self._record(managed, "drained")
        await self._stop(managed)

    async def _leases(self, endpoint: Endpoint) -> int:
        if endpoint.role is not Role.PREFILL:
            return 0
        try:
            stats = await endpoint.stub.GetStats(worker_pb2.GetStatsRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return 0  # it cannot be asked: nothing more to wait for
        return int(stats.num_leased)

    async def _stop(self, managed: Managed) -> None:
        """SIGTERM (SIGKILL after the timeout); out of the stack first so it is not restarted."""
        with contextlib.suppress(ValueError):
            self._stack.services.remove(managed.service)
        await asyncio.to_thread(managed.service.stop, self._stop_timeout_s)
        managed.phase = Phase.GONE
        self._record(managed, "stopped (SIGTERM)")

    async def close(self) -> None:
        for managed in self.workers:
            if managed.task is not None and not managed.task.done():
                managed.task.cancel()


def _role_of(text: str) -> Role | None:
    try:
        role = Role(text)
    except ValueError:
        return None
    return role


def _removal_order(managed: Managed) -> tuple[int, float]:
    """Starting workers first (they serve nobody), then the fewest requests in flight."""
    if managed.phase is Phase.STARTING:
        return (0, 0.0)
    return (1, float(managed.endpoint.admitted) if managed.endpoint is not None else 0.0)
