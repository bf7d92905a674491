"""Work that stops when nobody waits for it: a client that left, a sibling that failed."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from libs.gateway.api.cancellation import ClientDisconnected, gather_or_cancel, until_disconnected

pytestmark = pytest.mark.anyio


class Client:
    """`receive` of an ASGI request whose body was read: blocks until `leave()`."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}


async def test_the_result_comes_back_while_the_client_stays() -> None:
    async def work() -> int:
        return 7

    assert await until_disconnected(Client().receive, work()) == 7


async def test_a_client_leaving_cancels_the_work_before_the_answer() -> None:
    client = Client()
    started, cleaned_up = asyncio.Event(), asyncio.Event()

    async def generate_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned_up.set()

    waiting = asyncio.ensure_future(until_disconnected(client.receive, generate_forever()))
    await started.wait()
    client.leave()
    with pytest.raises(ClientDisconnected):
        await waiting
    assert cleaned_up.is_set()


async def test_an_error_of_the_work_is_raised_as_is() -> None:
    async def fail() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await until_disconnected(Client().receive, fail())


async def test_one_failure_cancels_the_siblings() -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def sibling() -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0

    async def failing() -> int:
        await started.wait()
        raise RuntimeError("prompt 2 failed")

    with pytest.raises(RuntimeError, match="prompt 2 failed"):
        await gather_or_cancel(sibling(), failing())
    assert cancelled.is_set()


async def test_results_come_in_order() -> None:
    async def value(v: int) -> int:
        await asyncio.sleep(0)
        return v

    assert await gather_or_cancel(value(1), value(2), value(3)) == [1, 2, 3]


async def test_when_several_fail_the_first_is_raised_and_every_failure_retrieved() -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))

    async def failing(message: str) -> int:
        await asyncio.sleep(0)
        raise RuntimeError(message)

    try:
        with pytest.raises(RuntimeError, match="first"):
            await gather_or_cancel(failing("first"), failing("second"))
        gc.collect()  # a task whose exception was never retrieved reports it when collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unretrieved == []
