"""Fake vLLM prefill/decode servers for the proxy's tests, served in-process on 127.0.0.1.

They answer the way vLLM's OpenAI server does with NixlConnector: a prefill answers a
non-streamed one-token request with `kv_transfer_params` naming its KV; a decode streams (or
returns) its answer. Every request body they receive is recorded.
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

from libs.rpc.ports import free_port

MODEL = "fake-model"


class MidStreamFailure(Exception):
    """Raised inside a stream: the server drops the connection without ending the body."""


@dataclass
class FakeVllm:
    name: str
    http_status: int = 200  # anything else: an OpenAI error object with this status
    error_body: bytes | None = None  # a non-JSON error body instead of the OpenAI object
    omit_kv_params: bool = False  # a prefill server started without a KV connector
    fail_after_chunks: int | None = None  # decode: drop the connection after this many chunks
    chunk_delay_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def kv_params(self, index: int) -> dict[str, Any]:
        """What this server hands out for its index-th prefill (distinct per request)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[index + 1, index + 2]],
            "remote_engine_id": f"engine-{self.name}",
            "remote_request_id": f"req-{self.name}-{index}",
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        }

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", self._models),
                Route("/v1/completions", self._generate, methods=["POST"]),
                Route("/v1/chat/completions", self._generate, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        index = len(self.bodies)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.http_status != 200:
            if self.error_body is not None:
                return Response(self.error_body, status_code=self.http_status, media_type="text/plain")
            error = {"message": f"{self.name} refused", "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=self.http_status)
        chat = request.url.path.endswith("/chat/completions")
        if body.get("stream"):
            return StreamingResponse(self._events(body, chat), media_type="text/event-stream")
        text = "".join(self.pieces(body))
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        answer: dict[str, Any] = {"id": f"{self.name}-{index}", "model": MODEL, "choices": [choice]}
        # vLLM returns kv_transfer_params on every non-streamed response: the prefill's name its
        # KV, a decode's are null.
        answer["kv_transfer_params"] = None if self.omit_kv_params else self.kv_params(index)
        return JSONResponse(answer)

    def pieces(self, body: dict[str, Any]) -> list[str]:
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        return [f" {self.name}{i}" for i in range(tokens)]

    async def _events(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        for i, piece in enumerate(self.pieces(body)):
            if self.fail_after_chunks is not None and i == self.fail_after_chunks:
                raise MidStreamFailure(self.name)
            await asyncio.sleep(self.chunk_delay_s)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            yield f"data: {json.dumps({'choices': [choice]})}\n\n"
        yield "data: [DONE]\n\n"


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Runs an ASGI app on 127.0.0.1 (a free port) in a background thread; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def serve_fake(fake: FakeVllm) -> Iterator[FakeVllm]:
    with serve(fake.app()) as url:
        fake.url = url
        yield fake


def unused_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"
