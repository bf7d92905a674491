"""The one wrapper of every servicer method: whatever the method raises ends the call with the
status libs.rpc.errors maps it to (logged there), and the call is counted in the service's
metrics when it has them.

    class WorkerServicer(worker_pb2_grpc.WorkerServicer):
        @rpc_method(service="worker", metrics=RPC_METRICS)
        async def Prefill(self, request, context): ...

        @rpc_stream(service="worker")
        async def Generate(self, request, context): ...  # an async generator

The method's own name is the gRPC method's name, which the logs and metrics label it with.
`refusals` maps a library's own exception types onto Cleave's error classes, for libraries
that do not raise `RpcError`s themselves (the kvstore's InvalidKey: the caller's mistake).

A stream that must end with a typed in-band error once it has started (a contract promising
complete-or-error) catches those errors itself; what escapes it ends the call with a status.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import NoReturn, TypeAlias, TypeVar

import grpc.aio

from libs.rpc import errors
from libs.rpc.metrics import RpcMetrics

Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Response = TypeVar("Response")
Context: TypeAlias = grpc.aio.ServicerContext
UnaryMethod: TypeAlias = Callable[[Servicer, Request, Context], Awaitable[Response]]
StreamMethod: TypeAlias = Callable[[Servicer, Request, Context], AsyncGenerator[Response, None]]
Refusals: TypeAlias = Mapping[type[Exception], type[errors.RpcError]]

_NO_REFUSALS: Refusals = {}


def rpc_method(
    *, service: str, metrics: RpcMetrics | None = None, refusals: Refusals = _NO_REFUSALS
) -> Callable[[UnaryMethod[Servicer, Request, Response]], UnaryMethod[Servicer, Request, Response]]:
    """For methods answering with one message (unary and client-streaming calls)."""

    def decorate(
        method: UnaryMethod[Servicer, Request, Response],
    ) -> UnaryMethod[Servicer, Request, Response]:
        name = method.__name__

        @functools.wraps(method)
        async def wrapper(servicer: Servicer, request: Request, context: Context) -> Response:
            started = time.perf_counter()
            try:
                response = await method(servicer, request, context)
            except grpc.aio.AbortError:
                raise  # the method ended the call itself
            except Exception as error:
                await _end_call(context, _refused(error, refusals), service, name, metrics)
            if metrics is not None:
                metrics.succeeded(name, time.perf_counter() - started)
            return response

        return wrapper

    return decorate


def rpc_stream(
    *, service: str, metrics: RpcMetrics | None = None, refusals: Refusals = _NO_REFUSALS
) -> Callable[[StreamMethod[Servicer, Request, Response]], StreamMethod[Servicer, Request, Response]]:
    """For methods streaming their answer (server- and bidirectional-streaming calls): async
    generators, or plain methods returning one (a library's stream handed on as it is). A
    call counts as succeeded once its stream ended without raising."""

    def decorate(
        method: StreamMethod[Servicer, Request, Response],
    ) -> StreamMethod[Servicer, Request, Response]:
        name = method.__name__

        @functools.wraps(method)
        async def wrapper(
            servicer: Servicer, request: Request, context: Context
        ) -> AsyncGenerator[Response, None]:
            started = time.perf_counter()
            try:
                # aclosing: a call the client cancels closes the method's generator now (its
                # `finally` frees what it holds), not whenever it is garbage collected.
                async with contextlib.aclosing(method(servicer, request, context)) as responses:
                    async for response in responses:
                        yield response
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await _end_call(context, _refused(error, refusals), service, name, metrics)
            if metrics is not None:
                metrics.succeeded(name, time.perf_counter() - started)

        return wrapper

    return decorate


def _refused(error: Exception, refusals: Refusals) -> Exception:
    """`error` as the Cleave error class `refusals` names for its type (same message)."""
    for kind, refusal in refusals.items():
        if isinstance(error, kind):
            mapped = refusal(str(error))
            mapped.__cause__ = error
            return mapped
    return error


async def _end_call(
    context: Context, error: Exception, service: str, method: str, metrics: RpcMetrics | None
) -> NoReturn:
    if metrics is not None:
        metrics.failed(method, errors.classify(error, service).status)
    await errors.abort(context, error, service=service, method=method)
