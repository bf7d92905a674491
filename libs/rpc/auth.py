"""A shared bearer token on grpc.aio servers (checked) and channels (sent).

Servers refuse every call whose `authorization` metadata is not `Bearer <token>` with
UNAUTHENTICATED, unknown methods and reflection included, so an unauthenticated caller learns
nothing about what a server offers. Health checks (grpc.health.v1.Health) pass without the
token: they say only whether a server is serving, and probes such as Kubernetes' gRPC probe
cannot send metadata. The token is compared in constant time and never logged.
"""

from __future__ import annotations

import collections
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog
from prometheus_client import Counter

from libs.rpc.security import AUTHORIZATION

log = structlog.get_logger(__name__)

HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"

REFUSED = Counter(
    "cleave_grpc_unauthenticated_total", "gRPC calls refused for a missing or wrong bearer token"
)


def _authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes:
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            return value if isinstance(value, bytes) else value.encode()
    return b""


class TokenAuthServerInterceptor(grpc.aio.ServerInterceptor):
    """Accepts any of `tokens` (a rotation's old and new one)."""

    def __init__(self, tokens: str | Sequence[str]) -> None:
        accepted = [tokens] if isinstance(tokens, str) else list(tokens)
        self._expected = [f"Bearer {token}".encode() for token in accepted]

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        given = _authorization(handler_call_details.invocation_metadata)
        # Every token is compared (constant time each), so the time taken says nothing.
        matches = [hmac.compare_digest(given, expected) for expected in self._expected]
        if method.startswith(HEALTH_METHOD_PREFIX) or any(matches):
            return await continuation(handler_call_details)
        REFUSED.inc()
        log.warning("grpc call refused: missing or wrong bearer token", method=method, token_sent=bool(given))
        return _refusal(await continuation(handler_call_details))


async def _refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same kind as the method's (an unknown method's as a unary one) that
    only refuses; grpc.aio drives a handler by its kind."""
    serializers: dict[str, Any] = {}
    if handler is not None:
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_refuse, **serializers)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_refuse, **serializers)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(_refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(_refuse, **serializers)


def _with_token(details: grpc.aio.ClientCallDetails, header: str) -> grpc.aio.ClientCallDetails:
    existing = details.metadata or ()
    metadata = grpc.aio.Metadata(*(m for m in existing if m[0] != AUTHORIZATION), (AUTHORIZATION, header))
    return details._replace(metadata=metadata)


# grpc.aio files each client interceptor under the first call type it implements, so each
# call type needs its own class (as in request_id.py).
class _Interceptor:
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"


class _UnaryUnary(_Interceptor, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._header), request)


class _UnaryStream(_Interceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._header), request)


class _StreamUnary(_Interceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._header), requests)


class _StreamStream(_Interceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._header), requests)


def token_client_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


# The blocking API (grpc.Channel), for clients inside vLLM's engine process (libs/kvconnector).
class _BlockingCallDetails(
    collections.namedtuple(
        "_BlockingCallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _BlockingTokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def _details(self, details: Any) -> _BlockingCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != AUTHORIZATION]
        metadata.append((AUTHORIZATION, self._header))
        return _BlockingCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def with_token(channel: grpc.Channel, token: str) -> grpc.Channel:
    """A blocking channel that sends `token` on every call."""
    return grpc.intercept_channel(channel, _BlockingTokenInterceptor(token))
