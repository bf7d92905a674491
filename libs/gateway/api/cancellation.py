"""Work that stops when nobody waits for it any more: the client went away, or a sibling failed.

A streamed response stops with its client already (Starlette cancels the stream). A whole
(non-streamed) response would otherwise keep its generation running on the engine to the
end after the client left; `until_disconnected` cancels it, which cancels the gRPC calls and
so aborts the request on the worker (libs/gateway/serving/generate.py). As vLLM's
`with_cancellation`, it listens for `http.disconnect` on `receive` (Request.is_disconnected
only peeks, and misses it behind middleware); the body must already have been read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from libs.gateway.api.http.request_metrics import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before its response was ready."""


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientDisconnected once the client has gone (`work` cancelled)."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and listener.exception() is None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its cleanup runs before we answer
            raise ClientDisconnected()
        return await task  # done, or the listener failed: the work decides
    finally:
        listener.cancel()
        task.cancel()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def gather_or_cancel(*works: Coroutine[Any, Any, T]) -> list[T]:
    """All results in order; the first failure cancels the rest and is raised (asyncio.gather
    would leave the siblings generating for nobody)."""
    tasks = [asyncio.ensure_future(w) for w in works]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    # Every failure is retrieved (asyncio logs those that never are); the first is raised.
    failures = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0]  # type: ignore[misc]
    return [t.result() for t in tasks]
