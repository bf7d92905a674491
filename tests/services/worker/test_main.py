"""The worker entry point's CPU pinning: a device group this machine cannot run on is a
one-line config error naming the flag; a usable one pins this process (and what it starts).
And its context length: never beyond the model's own. And a dead engine: the server stops and
the process exits non-zero, for its supervisor to restart it."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.errors import ConfigError
from libs.config.roles import Role
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from libs.worker.config import WorkerConfig
from services.worker.main import (
    ENGINE_DEATH_GRACE_S,
    EXIT_ENGINE_DIED,
    fitted_max_model_len,
    pin_to_cores,
    serve,
    shipped_openmp_library,
)


def worker(**overrides: object) -> WorkerConfig:
    return WorkerConfig(model="/models/m", served_model_name="m", **overrides)  # type: ignore[arg-type]


DRAFT = '{{"speculative_model": "/models/d", "num_speculative_tokens": 3, "draft_override_qaic_config": {{"device_group": {}}}}}'


def test_cores_the_machine_lacks_are_refused_with_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--device-group: got '0,4096'.*\[4096\] are not usable"):
        pin_to_cores(worker(device_group=(0, 4096)))
    first = min(os.sched_getaffinity(0))
    with pytest.raises(
        ConfigError,
        match=r"--speculative-config key 'draft_override_qaic_config.device_group': got '4096'.*\[4096\]",
    ):
        pin_to_cores(
            worker(role=Role.DECODE, device_group=(first,), speculative_config=DRAFT.format("[4096]"))
        )


def test_a_usable_group_pins_this_process() -> None:
    before = os.sched_getaffinity(0)
    first = min(before)
    try:
        pin_to_cores(worker(device_group=(first,)))
        assert os.sched_getaffinity(0) == {first}
    finally:
        os.sched_setaffinity(0, before)


def test_a_decode_worker_is_pinned_to_its_group_and_its_drafts() -> None:
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two usable cores")
    first, second = sorted(before)[:2]
    try:
        with capture_logs() as logs:
            pin_to_cores(
                worker(
                    role=Role.DECODE, device_group=(first,), speculative_config=DRAFT.format(f"[{second}]")
                )
            )
        assert os.sched_getaffinity(0) == {first, second}
    finally:
        os.sched_setaffinity(0, before)
    [line] = [entry for entry in logs if "draft model runs inside this decode engine" in entry["event"]]
    assert line["engine_cores"] == [first, second]
    assert line["draft_device_group"] == [second]


def test_max_model_len_is_capped_at_the_models_own(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert fitted_max_model_len(11264, tmp_path) == 8192  # qaic_disagg's documented value
    assert fitted_max_model_len(2048, tmp_path) == 2048
    assert fitted_max_model_len(None, tmp_path) is None  # vLLM takes the model's own


async def served_until_told_the_engine_died(server: GrpcServer) -> tuple[asyncio.Task[int], asyncio.Event]:
    """`serve` with a load that returns at once and an engine that dies when the event is set;
    returns once the server is bound (it is, before the load starts)."""
    died = asyncio.Event()
    loaded = asyncio.Event()

    async def load() -> None:
        loaded.set()

    async def engine_dead() -> None:
        await died.wait()

    serving = asyncio.create_task(serve(server, load, engine_dead))
    await loaded.wait()
    return serving, died


@pytest.mark.anyio
async def test_an_engine_that_dies_stops_the_server_and_exits_non_zero() -> None:
    server = GrpcServer(ServerConfig(), [])
    serving, died = await served_until_told_the_engine_died(server)
    for _ in range(500):  # SERVING once the load has returned
        if await health(server.address) == health_pb2.HealthCheckResponse.SERVING:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the worker never said SERVING")
    died.set()
    assert await asyncio.wait_for(serving, timeout=30) == EXIT_ENGINE_DIED
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await health(server.address)  # stopped: nothing answers on its port any more
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


class _StreamHeldOpen(worker_pb2_grpc.WorkerServicer):
    """GenerateMany as the gateway holds it: open for the worker's whole life."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def GenerateMany(self, request_iterator: Any, context: Any) -> Any:  # gRPC's name
        self.opened.set()
        await asyncio.Event().wait()
        yield worker_pb2.GenerateManyResponse()  # never reached: makes this a stream handler


@pytest.mark.anyio
async def test_a_call_left_open_does_not_hold_a_dead_engines_worker_for_the_grace() -> None:
    # With the drain's 25 s grace the gateway's open GenerateMany stream held the exit, and so
    # the worker's restart, that long.
    servicer = _StreamHeldOpen()
    binding = ServiceBinding(
        "cleave.worker.v1.Worker", servicer, worker_pb2_grpc.add_WorkerServicer_to_server
    )
    server = GrpcServer(ServerConfig(shutdown_grace_s=25.0), [binding])
    serving, died = await served_until_told_the_engine_died(server)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = worker_pb2_grpc.WorkerStub(channel).GenerateMany()
        await servicer.opened.wait()
        started = asyncio.get_running_loop().time()
        died.set()
        assert await asyncio.wait_for(serving, timeout=60) == EXIT_ENGINE_DIED
        assert asyncio.get_running_loop().time() - started < ENGINE_DEATH_GRACE_S + 4
        stream.cancel()


@pytest.mark.anyio
async def test_a_failed_load_is_raised_not_reported_as_a_dead_engine() -> None:
    async def load() -> None:
        raise RuntimeError("no model")

    async def engine_dead() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="no model"):
        await serve(GrpcServer(ServerConfig(), []), load, engine_dead)


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(response.status)


def test_auto_openmp_is_the_shipped_libiomp5_for_a_speculating_cpu_worker_only() -> None:
    ngram = '{"method": "ngram", "num_speculative_tokens": 5}'
    library = shipped_openmp_library(worker(role=Role.DECODE, speculative_config=ngram))
    # This test's runfiles carry @intel_openmp through services/worker:lib's data.
    assert library.endswith("/libiomp5.so")
    assert Path(library).is_file()
    assert shipped_openmp_library(worker(role=Role.DECODE)) == "none"
    assert (
        shipped_openmp_library(worker(role=Role.DECODE, speculative_config=ngram, openmp_library="/x.so"))
        == "/x.so"
    )
