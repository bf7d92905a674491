"""Client channels balance over every address their target names (gRPC's round_robin): added
replicas of a service take calls, not only the first address."""

from __future__ import annotations

import grpc
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding

pytestmark = pytest.mark.anyio


class Replica(worker_pb2_grpc.WorkerServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        self.calls += 1
        return worker_pb2.WorkerInfo()


async def test_calls_spread_over_every_address_of_the_target() -> None:
    replicas = [Replica(), Replica()]
    servers = [
        GrpcServer(
            ServerConfig(port=0, shutdown_grace_s=0),
            [ServiceBinding("cleave.worker.v1.Worker", r, worker_pb2_grpc.add_WorkerServicer_to_server)],
        )
        for r in replicas
    ]
    for server in servers:
        await server.start()
    try:
        # What a name with two A records resolves to, written out (gRPC's ipv4: target form).
        target = "ipv4:" + ",".join(server.address for server in servers)
        async with open_channel(target) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            for _ in range(20):
                await stub.GetInfo(worker_pb2.GetInfoRequest(), timeout=5)
    finally:
        for server in servers:
            await server.stop()
    # round_robin alternates once both connections are up (the first calls may find one still
    # connecting); pick_first, gRPC's default, would send all 20 to one.
    assert sum(r.calls for r in replicas) == 20 and min(r.calls for r in replicas) >= 5
