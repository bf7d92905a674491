"""The benchmark's fake server: tools/bench's reference server (known delays, every request
body recorded), run in a background thread of the test process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from tools.bench.reference_server import MODEL, ReferenceServer

FakeOpenAI = ReferenceServer
__all__ = ["MODEL", "FakeOpenAI", "serve"]


@contextlib.contextmanager
def serve(fake: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """Runs `fake` on 127.0.0.1 (a free port) in a background thread; sets fake.url."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake OpenAI server did not start")
        time.sleep(0.01)
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
