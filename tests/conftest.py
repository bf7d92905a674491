"""Shared pytest configuration for every Cleave test target."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # Cleave runs on asyncio (grpc.aio); anyio's plugin would otherwise also try trio.
    return "asyncio"
