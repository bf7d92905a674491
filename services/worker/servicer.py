"""gRPC adapter of the worker: messages in and out, library errors -> status codes and RPC
metrics through libs.rpc.methods (the same mapping as every Cleave servicer)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.rpc import errors
from libs.rpc.methods import rpc_method, rpc_stream
from libs.rpc.server import ServiceBinding
from libs.worker import metrics
from libs.worker.generate_many import GenerateMany
from libs.worker.service import WorkerService

log = structlog.get_logger(__name__)

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
SERVICE = "worker"


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, service: WorkerService) -> None:
        self._service = service

    @rpc_method(service=SERVICE, metrics=metrics.RPC)
    async def Prefill(
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        return await self._service.prefill(request)

    # Counted per request by _generate, not per call: GenerateMany shares it.
    @rpc_stream(service=SERVICE)
    def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[worker_pb2.GenerateResponse, None]:
        # What fails before anything streamed escapes _generate: a plain status says whose
        # fault it is (INVALID_ARGUMENT: the client's; UNAVAILABLE: this worker's) before the
        # caller commits to it.
        return self._generate(request)

    async def GenerateMany(
        self,
        requests: AsyncIterator[worker_pb2.GenerateManyRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[worker_pb2.GenerateManyResponse]:
        # Each request ends with a status of its own inside the shared call, never the call.
        def refusal(error: BaseException) -> tuple[grpc.StatusCode, str]:
            failure = errors.refusal(error, service=SERVICE, method="Generate")
            return failure.status, failure.message

        calls = GenerateMany(
            self._generate,
            refusal,
            drain=self._service.drain_state,
            inflight=lambda: self._service.num_inflight,
        )
        async for response in calls.serve(requests):
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
                    metrics.RPC.succeeded("Generate")
                yield response
        except Exception as error:
            metrics.RPC.failed("Generate", errors.classify(error, SERVICE).status)
            if not emitted:
                raise
            yield worker_pb2.GenerateResponse(
                error=errors.stream_error(error, service=SERVICE, method="Generate")
            )
            return
        if not completed:
            metrics.RPC.succeeded("Generate")

    @rpc_method(service=SERVICE, metrics=metrics.RPC)
    async def ReleaseKv(
        self, request: worker_pb2.ReleaseKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseKvResponse:
        await self._service.release_kv(request)
        return worker_pb2.ReleaseKvResponse()

    @rpc_method(service=SERVICE, metrics=metrics.RPC)
    async def LoadLoraAdapter(
        self, request: worker_pb2.LoadLoraAdapterRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.LoadLoraAdapterResponse:
        await self._service.load_lora_adapter(request)
        return worker_pb2.LoadLoraAdapterResponse()

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

    # Open as long as the gateway watches (its view of this engine's prefix cache).
    @rpc_stream(service=SERVICE)
    def WatchKvCache(
        self, request: worker_pb2.WatchKvCacheRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[worker_pb2.KvCacheEvents, None]:
        return self._service.watch_kv_cache()


def binding(servicer: WorkerServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, worker_pb2_grpc.add_WorkerServicer_to_server)
