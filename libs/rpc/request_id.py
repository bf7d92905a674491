"""Request-id propagation over gRPC metadata, for grpc.aio servers and channels.

The server side binds the incoming `x-request-id` (or a fresh one) to structlog's
contextvars for the handler's task; the client side copies the bound id onto outgoing calls,
so one id follows a request through gateway, tokenizer, prefill and decode logs.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from libs.observability.logging import bind_request_id, current_request_id

REQUEST_ID_METADATA_KEY = "x-request-id"


def request_id_from_metadata(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return None


class RequestIdServerInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        request_id = request_id_from_metadata(handler_call_details.invocation_metadata) or uuid.uuid4().hex
        return _bind_request_id(handler, request_id)


def _bind_request_id(handler: grpc.RpcMethodHandler, request_id: str) -> grpc.RpcMethodHandler:
    # grpc.aio runs each RPC in its own task with its own copy of the context, so binding
    # without resetting cannot leak into other requests (and survives cancellation, where a
    # reset from another context would raise).
    def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                bind_request_id(request_id)
                async for response in behavior(request, context):
                    yield response

            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            bind_request_id(request_id)
            return await behavior(request, context)

        return call

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary), **serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream), **serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary), **serializers)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream), **serializers)
    return handler


def _with_request_id(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    request_id = current_request_id()
    existing = details.metadata or ()
    if request_id is None or request_id_from_metadata(list(existing)) is not None:
        return details
    metadata = grpc.aio.Metadata(*existing, (REQUEST_ID_METADATA_KEY, request_id))
    return details._replace(metadata=metadata)


# grpc.aio files each client interceptor under the first call type it implements, so each
# call type needs its own class.
class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_request_id(details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_request_id(details), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_request_id(details), requests)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_request_id(details), requests)


def request_id_client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    return [_UnaryUnary(), _UnaryStream(), _StreamUnary(), _StreamStream()]
