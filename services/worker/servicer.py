"""gRPC adapter of the worker: messages in and out, library errors -> status codes through
libs.rpc.errors (the same mapping as every Cleave servicer)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc import errors
from libs.rpc.server import ServiceBinding
from libs.worker import metrics
from libs.worker.generate_many import GenerateMany
from libs.worker.service import WorkerService

log = structlog.get_logger(__name__)
T = TypeVar("T")

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
SERVICE = "worker"


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, service: WorkerService) -> None:
        self._service = service

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]]
    ) -> T:
        started = time.perf_counter()
        try:
            result = await call()
        except Exception as error:
            status = errors.classify(error, SERVICE).status
            metrics.REQUESTS.labels(method, status.name.lower()).inc()
            await errors.abort(context, error, service=SERVICE, method=method)
        metrics.REQUESTS.labels(method, "ok").inc()
        metrics.RPC_SECONDS.labels(method).observe(time.perf_counter() - started)
        return result

    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        return await self._unary("Prefill", context, lambda: self._service.prefill(request))

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        try:
            async for response in self._generate(request):
                yield response
        except Exception as error:
            # Nothing streamed yet: a plain status says whose fault it is (INVALID_ARGUMENT:
            # the client's; UNAVAILABLE: this worker's) before the caller commits to it.
            await errors.abort(context, error, service=SERVICE, method="Generate")

    async def GenerateMany(
        self,
        requests: AsyncIterator[worker_pb2.GenerateManyRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[worker_pb2.GenerateManyResponse]:
        def refusal(error: BaseException) -> tuple[grpc.StatusCode, str]:
            failure = errors.refusal(error, service=SERVICE, method="Generate")
            return failure.status, failure.message

        async for response in GenerateMany(self._generate, refusal).serve(requests):
            yield response

    async def _generate(
        self, request: worker_pb2.GenerateRequest
    ) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        """One request's Generate stream. Raises what failed it if nothing was streamed yet;
        a later failure is the stream's typed end (the contract promises complete-or-error)."""
        emitted = completed = False
        try:
            async for response in self._service.generate(request):
                emitted = True
                if response.WhichOneof("kind") == "complete":
                    # Counted before the yield: the gateway closes the call once it has the
                    # completion, and a closed stream never resumes this generator.
                    completed = True
                    metrics.REQUESTS.labels("Generate", "ok").inc()
                yield response
        except Exception as error:
            status = errors.classify(error, SERVICE).status
            metrics.REQUESTS.labels("Generate", status.name.lower()).inc()
            if not emitted:
                raise
            yield worker_pb2.GenerateResponse(
                error=errors.stream_error(error, service=SERVICE, method="Generate")
            )
            return
        if not completed:
            metrics.REQUESTS.labels("Generate", "ok").inc()

    async def Abort(
        self, request: worker_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.AbortResponse:
        found = await self._unary("Abort", context, lambda: self._service.abort(request.request_id))
        return worker_pb2.AbortResponse(found=found)

    async def ReleaseKv(
        self, request: worker_pb2.ReleaseKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseKvResponse:
        await self._unary("ReleaseKv", context, lambda: self._service.release_kv(request))
        return worker_pb2.ReleaseKvResponse()

    async def GetStats(
        self, request: worker_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        stats = self._service.stats()
        metrics.KV_CACHE_USAGE.set(stats.kv_cache_usage)
        metrics.LEASED_HANDOFFS.set(stats.num_leased)
        metrics.PROMPT_TOKENS.labels("computed").set(stats.prompt_tokens_computed)
        metrics.PROMPT_TOKENS.labels("local_cache_hit").set(stats.prompt_tokens_local_cache_hit)
        metrics.PROMPT_TOKENS.labels("external").set(stats.prompt_tokens_external)
        for field, value in stats.kvstore.ListFields():
            metrics.KVSTORE_CONNECTOR.labels(field.name).set(value)
        for field, value in stats.kv_pulls.ListFields():
            metrics.KV_PULLS.labels(field.name).set(value)
        spec = stats.spec_decode
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            metrics.SPEC_DECODE.labels(name).set(getattr(spec, name))
        metrics.SPEC_DECODE_ACCEPTANCE_RATE.set(spec.acceptance_rate)
        metrics.SPEC_DECODE_MEAN_ACCEPTED_LENGTH.set(spec.mean_accepted_length)
        return stats

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return self._service.info()


def binding(servicer: WorkerServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, worker_pb2_grpc.add_WorkerServicer_to_server)
