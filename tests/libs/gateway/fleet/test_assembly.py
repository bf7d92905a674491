"""The gateway's start-up: waiting for given workers that are still loading their model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import anyio
import pytest

from libs.gateway.fleet.connect import _first_answering
from libs.gateway.fleet.pool import WorkerPool

pytestmark = pytest.mark.anyio


@dataclass
class StubEndpoint:
    address: str
    healthy: bool = False


@dataclass
class StubPool:
    endpoints: list[StubEndpoint] = field(default_factory=list)


async def test_the_gateway_waits_for_a_worker_that_is_still_loading() -> None:
    loading = StubEndpoint("decode:50051")
    pool = StubPool([StubEndpoint("decode:50052"), loading])

    async def finish_loading() -> None:
        await anyio.sleep(1.0)
        loading.healthy = True  # what the pool's next successful poll does

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(finish_loading)
        first = await _first_answering(cast(WorkerPool, pool), wait_s=60)
    assert first.address == loading.address  # the stub the background poll made healthy


async def test_without_an_answer_it_gives_up_naming_the_addresses() -> None:
    pool = StubPool([StubEndpoint("decode:50051")])
    with pytest.raises(RuntimeError, match=r"no worker answered within 0\.2 s.*decode:50051"):
        await _first_answering(cast(WorkerPool, pool), wait_s=0.2)
    with pytest.raises(RuntimeError, match="none resolved"):
        await _first_answering(cast(WorkerPool, StubPool()), wait_s=0)
