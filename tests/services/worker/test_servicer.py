"""The worker's gRPC adapter over loopback, on the fake engine: whose fault a failure is must
survive the trip, because the gateway ejects a worker only for the worker's own failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import grpc
import grpc.aio
import pytest
from prometheus_client import REGISTRY

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.engine import Adapter, EngineStep
from libs.worker.errors import EngineUnavailable
from libs.worker.service import WorkerService
from services.worker.servicer import SERVICE_NAME, WorkerServicer, binding
from tests.libs.worker.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


class FailingEngine(FakeEngine):
    """Streams `emit_first` tokens, then raises `error` (nothing raised when None)."""

    def __init__(self, error: Exception | None, emit_first: int = 0) -> None:
        super().__init__()
        self.error = error
        self.emit_first = emit_first

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        sequences: Sequence[tuple[int, Sequence[int]]] = (),
        lora: Adapter | None = None,
    ) -> AsyncIterator[EngineStep]:
        inner = super().generate(
            request_id, prompt_token_ids, sampling, kv_transfer_params, cache_salt=cache_salt
        )

        async def steps() -> AsyncIterator[EngineStep]:
            emitted = 0
            async for step in inner:
                if emitted == self.emit_first and self.error is not None:
                    raise self.error
                emitted += 1
                yield step

        return steps()


async def serve(role: Role, engine: FakeEngine) -> tuple[GrpcServer, worker_pb2_grpc.WorkerStub]:
    config = WorkerConfig(role=role, model="/nonexistent", served_model_name="fake")
    server = GrpcServer(ServerConfig(), [binding(WorkerServicer(WorkerService(config, engine)))])
    await server.start()
    return server, worker_pb2_grpc.WorkerStub(open_channel(server.address))


async def generate(stub: worker_pb2_grpc.WorkerStub, **fields: Any) -> list[worker_pb2.GenerateResponse]:
    request = worker_pb2.GenerateRequest(prompt_token_ids=[5, 6], **fields)
    return [r async for r in stub.Generate(request, timeout=10)]


def test_service_name_comes_from_the_descriptor() -> None:
    assert SERVICE_NAME == "cleave.worker.v1.Worker"


async def test_client_mistakes_are_invalid_argument_with_the_reason() -> None:
    server, stub = await serve(Role.PREFILL, FakeEngine())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as prefill:
            await stub.Prefill(
                worker_pb2.PrefillRequest(
                    prompt_token_ids=[5], sampling=common_pb2.SamplingParams(logit_bias={123456: 1.0})
                )
            )
        with pytest.raises(grpc.aio.AioRpcError) as wrong_role:
            await generate(stub)
    finally:
        await server.stop()
    assert prefill.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "logit_bias" in (prefill.value.details() or "") and "123456" in (prefill.value.details() or "")
    assert wrong_role.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_generate_refused_before_any_token_is_a_status_not_a_stream_error() -> None:
    server, stub = await serve(Role.BOTH, FakeEngine())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await generate(stub, sampling=common_pb2.SamplingParams(stop_token_ids=[70000]))
    finally:
        await server.stop()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (EngineUnavailable("engine died"), grpc.StatusCode.UNAVAILABLE, "engine died"),
        (RuntimeError("traceback details"), grpc.StatusCode.INTERNAL, "internal error in the worker service"),
    ],
)
async def test_server_failures_keep_their_own_status(
    error: Exception, status: grpc.StatusCode, message: str
) -> None:
    server, stub = await serve(Role.BOTH, FailingEngine(error))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await generate(stub, sampling=common_pb2.SamplingParams(max_tokens=4))
    finally:
        await server.stop()
    assert (raised.value.code(), raised.value.details()) == (status, message)


async def test_a_failure_after_tokens_ends_the_stream_with_a_typed_error() -> None:
    server, stub = await serve(Role.BOTH, FailingEngine(EngineUnavailable("engine died"), emit_first=2))
    try:
        responses = await asyncio.wait_for(
            generate(stub, sampling=common_pb2.SamplingParams(max_tokens=8)), 10
        )
    finally:
        await server.stop()
    assert [r.WhichOneof("kind") for r in responses] == ["chunk", "chunk", "error"]
    assert responses[-1].error.code == common_pb2.ERROR_CODE_OVERLOADED
    assert responses[-1].error.message == "engine died"


async def test_generate_counts_ok_when_the_caller_closes_the_stream_at_the_completion() -> None:
    # The gateway stops reading at GenerateComplete (libs/gateway/serving/generate.py) and the call is
    # cancelled; when the cancellation reaches the server before the handler resumes, gRPC
    # closes the handler's generator at that yield (aclose, as here). The request succeeded
    # and must count: compose_live_checks reads this counter to see which worker served.
    def ok() -> float:
        labels = {"method": "Generate", "outcome": "ok"}
        return REGISTRY.get_sample_value("cleave_worker_requests_total", labels) or 0.0

    config = WorkerConfig(role=Role.BOTH, model="/nonexistent", served_model_name="fake")
    servicer = WorkerServicer(WorkerService(config, FakeEngine()))
    request = worker_pb2.GenerateRequest(
        prompt_token_ids=[5, 6], sampling=common_pb2.SamplingParams(max_tokens=4)
    )
    before = ok()
    stream = servicer.Generate(request, cast(grpc.aio.ServicerContext, None))
    kinds = []
    async for response in stream:
        kinds.append(response.WhichOneof("kind"))
        if kinds[-1] == "complete":
            break
    await stream.aclose()
    assert kinds[-1] == "complete"
    assert ok() - before == 1


async def test_get_stats_exports_spec_decode_to_prometheus() -> None:
    engine = FakeEngine()
    engine.stats().spec_decode.update(drafts=4, draft_tokens=12, accepted_tokens=9)
    server, stub = await serve(Role.DECODE, engine)
    try:
        stats = await stub.GetStats(worker_pb2.GetStatsRequest(), timeout=10)
    finally:
        await server.stop()
    assert (stats.spec_decode.drafts, stats.spec_decode.accepted_tokens) == (4, 9)
    assert stats.spec_decode.acceptance_rate == pytest.approx(0.75)
    assert stats.spec_decode.mean_accepted_length == pytest.approx(3.25)
    assert REGISTRY.get_sample_value("cleave_worker_spec_decode", {"counter": "accepted_tokens"}) == 9
    assert REGISTRY.get_sample_value("cleave_worker_spec_decode_acceptance_rate") == pytest.approx(0.75)
    assert REGISTRY.get_sample_value("cleave_worker_spec_decode_mean_accepted_length") == pytest.approx(3.25)
