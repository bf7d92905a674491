"""Each worker's own word on whether it serves: a grpc.health.v1 `Watch` stream per endpoint.

A worker says NOT_SERVING while its model loads and from the moment it starts to drain
(SIGTERM: libs/rpc/server.py); the stream delivers that at once, so the gateway stops routing
new requests to a draining worker within a round trip instead of after failed requests or
stats polls (the breaker, breaker.py, still judges failures). The requests already on it
finish there (or are handed off by the worker and moved: libs/gateway/serving/migration.py).

When the stream fails (the worker gone, restarting), the endpoint keeps the last status it
heard and the watch is opened again every `retry_s`: a restarted worker says NOT_SERVING until
it has loaded, then SERVING. A worker without the health service (UNIMPLEMENTED) is left to
the polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
# The whole server's status (""): a worker sets it with its service's, and a drain sets both.
OVERALL = ""


async def watch_health(
    channel: grpc.aio.Channel,
    address: str,
    on_status: Callable[[bool], None],
    retry_s: float = 1.0,
    on_lost: Callable[[str], None] | None = None,
) -> None:
    """Calls `on_status(serving)` with each status the server at `address` reports, and
    `on_lost(code)` each time the stream fails, for ever (cancel the task to stop)."""
    stub = health_pb2_grpc.HealthStub(channel)
    while True:
        try:
            async for response in stub.Watch(health_pb2.HealthCheckRequest(service=OVERALL)):
                on_status(response.status == SERVING)
            lost = "the stream ended"
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("server has no health watch; relying on its polls", address=address)
                return
            lost = error.code().name
        log.debug("health watch ended", address=address, reason=lost)
        if on_lost is not None:
            on_lost(lost)
        await asyncio.sleep(retry_s)


class WatchedHealth:
    """A service's health as its Watch stream last told it: what the gateway's /health and
    /ready report for the tokenizer without calling it (a liveness probe must do no I/O: a
    tokenizer slow under load would otherwise fail the gateway's liveness)."""

    def __init__(self, channel: grpc.aio.Channel, address: str, retry_s: float = 1.0) -> None:
        self._channel = channel
        self._address = address
        self._retry_s = retry_s
        self._error: str | None = "not heard from yet"
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(
            watch_health(self._channel, self._address, self._heard, self._retry_s, self._lost)
        )

    async def wait_heard(self, timeout_s: float) -> None:
        """Until the first word from the service (or `timeout_s`): a gateway that has just
        connected reports what it knows, not "not heard from yet"."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._first.wait()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _heard(self, serving: bool) -> None:
        self._error = None if serving else "NOT_SERVING"
        self._first.set()

    def _lost(self, reason: str) -> None:
        self._error = reason
        self._first.set()

    def status(self) -> dict[str, Any]:
        """{"reachable": True}, or {"reachable": False, "error": why}."""
        if self._error is None:
            return {"reachable": True}
        return {"reachable": False, "error": self._error}
