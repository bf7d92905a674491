"""Worker endpoints with health: polled stats, ejection on failure, reinstatement on recovery.

Only the worker's own failures eject it (its process unreachable, its engine unavailable);
a request it refuses as invalid is the client's mistake and never does (libs/gateway/pipeline.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc.channel import open_channel

log = structlog.get_logger(__name__)


@dataclass
class Endpoint:
    address: str
    role: str  # "prefill", "decode" or "both"
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerStub
    healthy: bool = False
    stats: worker_pb2.WorkerStats = field(default_factory=worker_pb2.WorkerStats)
    # Requests this gateway has in flight on the endpoint (fresher than polled stats).
    in_flight: int = 0
    poll_failures: int = 0
    # What the worker serves (vocabulary, context), asked once it first answers a poll.
    info: worker_pb2.WorkerInfo | None = None


class WorkerPool:
    def __init__(
        self,
        addresses: dict[str, list[str]],
        poll_interval_s: float = 1.0,
        poll_timeout_s: float = 3.0,
        slow_polls_to_eject: int = 3,
    ) -> None:
        self._poll_interval_s = poll_interval_s
        self._slow_polls_to_eject = slow_polls_to_eject
        self._poll_timeout_s = poll_timeout_s
        self.endpoints: list[Endpoint] = []
        for role, role_addresses in addresses.items():
            for address in role_addresses:
                channel = open_channel(address)
                self.endpoints.append(Endpoint(address, role, channel, worker_pb2_grpc.WorkerStub(channel)))
        self._task: asyncio.Task[None] | None = None

    def healthy(self, role: str) -> list[Endpoint]:
        return [e for e in self.endpoints if e.role == role and e.healthy]

    def vocab_size(self) -> int | None:
        """The smallest vocabulary the workers reported (token ids below it are valid on
        every worker), or None while no worker has said."""
        sizes = [e.info.vocab_size for e in self.endpoints if e.info is not None and e.info.vocab_size > 0]
        return min(sizes) if sizes else None

    def eject(self, endpoint: Endpoint, reason: str) -> None:
        """Stops routing to an endpoint at once; the poller reinstates it when it answers again."""
        if endpoint.healthy:
            log.warning("worker ejected", address=endpoint.address, role=endpoint.role, reason=reason)
        endpoint.healthy = False

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(e) for e in self.endpoints))

    async def _poll(self, endpoint: Endpoint) -> None:
        try:
            endpoint.stats = await endpoint.stub.GetStats(
                worker_pb2.GetStatsRequest(), timeout=self._poll_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            endpoint.poll_failures += 1
            # A refused connection means the process is gone: eject at once. A slow answer
            # may be a busy machine: eject only after several in a row.
            if (
                error.code() != grpc.StatusCode.DEADLINE_EXCEEDED
                or endpoint.poll_failures >= self._slow_polls_to_eject
            ):
                self.eject(endpoint, f"stats poll failed {endpoint.poll_failures}x: {error.code().name}")
            return
        endpoint.poll_failures = 0
        if endpoint.info is None:
            await self._fetch_info(endpoint)
        if not endpoint.healthy:
            log.info("worker healthy", address=endpoint.address, role=endpoint.role)
        endpoint.healthy = True

    async def _fetch_info(self, endpoint: Endpoint) -> None:
        try:
            endpoint.info = await endpoint.stub.GetInfo(
                worker_pb2.GetInfoRequest(), timeout=self._poll_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            # Only an edge check depends on it (the worker checks again): asked at the next poll.
            log.debug("worker info not available yet", address=endpoint.address, code=error.code().name)

    async def start(self) -> None:
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            await self.poll_once()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await asyncio.gather(*(e.channel.close() for e in self.endpoints), return_exceptions=True)
