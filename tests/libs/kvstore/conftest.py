"""Fixtures: stores on small tiers (closed after each test) and a throwaway Redis server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from libs.kvstore.config import KvStoreConfig
from libs.kvstore.store import KvStore
from tests.libs.kvstore.helpers import CHUNK_TOKENS, FakeClock, StoreFactory
from tests.libs.kvstore.redis_server import RedisServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """make_store(**config overrides, clock=...) -> an open KvStore, closed after the test.
    Defaults: 64 KiB of CPU (16 chunks), no disk, no Redis."""
    stores: list[KvStore] = []
    base = KvStoreConfig(cpu_bytes=64 * 1024, chunk_tokens=CHUNK_TOKENS, remote_probe_interval_s=0.2)

    def make(clock: Callable[[], float] | None = None, **overrides: object) -> KvStore:
        config = replace(base, **overrides)  # type: ignore[arg-type]
        kwargs: dict[str, Callable[[], float]] = {} if clock is None else {"clock": clock}
        store = KvStore(config, registry=CollectorRegistry(), **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()
