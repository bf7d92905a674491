"""A servicer registered before it exists, so a server can bind its port before loading.

grpc.aio takes every servicer's methods when the server is built, and servers cannot add
services once started. A service whose servicer needs a model (seconds to minutes) would
otherwise bind its port only after loading, and the port its launcher picked for it could
be taken in between. `DeferredServicer(WorkerServicer)` registers forwarding methods of the
right kinds now; until `become(servicer)` each call fails with UNAVAILABLE ("loading").
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio


class DeferredServicer:
    def __init__(self, servicer_type: type) -> None:
        self._type = servicer_type
        self._servicer: Any = None
        for name, method in inspect.getmembers(servicer_type, inspect.isfunction):
            if not name.startswith("_"):
                setattr(self, name, self._forward(name, method))

    @property
    def loaded(self) -> bool:
        return self._servicer is not None

    def become(self, servicer: Any) -> None:
        if not isinstance(servicer, self._type):
            raise TypeError(f"expected a {self._type.__name__}, got {type(servicer).__name__}")
        self._servicer = servicer

    async def _target(self, context: grpc.aio.ServicerContext, name: str) -> Any:
        if self._servicer is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self._type.__name__} is still loading")
        return getattr(self._servicer, name)

    def _forward(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        # grpc.aio decides how to drive a handler from its kind, so keep each method's kind.
        if inspect.isasyncgenfunction(method):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                target = await self._target(context, name)
                async for response in target(request, context):
                    yield response

            return stream
        if inspect.iscoroutinefunction(method):

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await (await self._target(context, name))(request, context)

            return unary
        raise TypeError(f"{self._type.__name__}.{name} is neither async nor an async generator")
