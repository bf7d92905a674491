"""A tiny OpenAI-compatible streaming server for the benchmark's tests.

It streams `max_tokens` content chunks with known delays (first after `ttft_s`, then one
every `itl_s`), so measured latencies can be checked against what the server did, and
records every request body it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fake-model"


@dataclass
class FakeOpenAI:
    ttft_s: float = 0.1
    itl_s: float = 0.02
    send_usage: bool = True
    error_after_chunks: int | None = None  # then an SSE error event instead of the rest
    http_status: int = 200  # anything else: a JSON error body with this status
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each request's header
    url: str = ""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self._models),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
            ]
        )

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        if self.http_status != 200:
            error = {"message": "fake failure", "type": "invalid_request_error", "code": None}
            return JSONResponse({"error": error}, status_code=self.http_status)
        chat = request.url.path.endswith("/chat/completions")
        return StreamingResponse(self._events(body, chat), media_type="text/event-stream")

    async def _events(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        def sse(payload: dict[str, Any] | str) -> str:
            return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

        def choice(text: str) -> dict[str, Any]:
            return {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}

        if chat:  # like vLLM: a role-only chunk right away, which carries no content
            yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        tokens = int(body["max_tokens"])
        for i in range(tokens):
            await asyncio.sleep(self.ttft_s if i == 0 else self.itl_s)
            if self.error_after_chunks is not None and i == self.error_after_chunks:
                yield sse({"error": {"message": "fake worker failed", "type": "server_error", "code": 502}})
                yield sse("[DONE]")
                return
            yield sse({"choices": [choice(f" w{i}")]})
        if self.send_usage and body.get("stream_options", {}).get("include_usage"):
            yield sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}})
        yield sse("[DONE]")


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
