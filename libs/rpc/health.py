"""The standard gRPC health service (grpc.health.v1), as grpc_health's asyncio servicer with
two differences a drain needs:

- a Watch stream ends once it has sent NOT_SERVING for a server that is shutting down, so
  the server's stop does not wait the whole grace for watchers (a gateway watches every
  worker and the tokenizer) that will never hang up on their own;
- watchers of one service do not share a condition that the first one to leave deletes
  (grpc_health's `Watch` removes the service's condition when any of its watchers ends, and
  the others then hear no further change).
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self) -> None:
        self._status: dict[str, health_pb2.HealthCheckResponse.ServingStatus.ValueType] = {"": SERVING}
        self._shutting_down = False
        self._changed = asyncio.Event()  # replaced by a fresh one at each change

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        last = None
        while True:
            status = self._status.get(request.service, SERVICE_UNKNOWN)
            changed = self._changed  # taken before any await: no change can slip between
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self._shutting_down and status != SERVING:
                return  # the watcher knows; the stream must not hold up the server's stop
            if changed is self._changed:
                await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        """Sets a service's status ("" = the whole server); ignored once shutting down."""
        if self._shutting_down:
            return
        self._status[service] = status
        self._notify()

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good; watchers are told, and their streams end."""
        if self._shutting_down:
            return
        self._shutting_down = True
        for service in self._status:
            self._status[service] = NOT_SERVING
        self._notify()
