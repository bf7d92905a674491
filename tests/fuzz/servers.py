"""A grpc.aio server on its own event loop in a background thread, so that synchronous
hypothesis tests can call it through a plain blocking channel, many examples against one
server, exactly as a remote peer would (wire encoding, status codes, interceptors)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import grpc

from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding


@contextmanager
def background_server(bindings: Callable[[], Sequence[ServiceBinding]]) -> Iterator[grpc.Channel]:
    """Serves `bindings()` (built on the server's loop) on 127.0.0.1; yields a channel to it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-grpc-server", daemon=True)
    thread.start()

    def run(coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, loop)
        return future.result(timeout=60)

    async def start() -> GrpcServer:
        server = GrpcServer(ServerConfig(shutdown_grace_s=1.0), bindings())
        await server.start()
        return server

    server = run(start())
    try:
        with grpc.insecure_channel(server.address) as channel:
            yield channel
    finally:
        run(server.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
