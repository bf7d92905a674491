"""An OpenAI-compatible streaming server with known latencies, to calibrate load generators.

It streams `max_tokens` (or `max_completion_tokens`) content chunks: the first after
`ttft_s`, then one every `itl_s`. A load generator pointed at it should measure TTFT ≈ ttft_s
and TPOT/ITL ≈ itl_s; what it reports beyond that is its own client-side overhead. The
comparison runs it as the `reference` system (`--systems reference`), and the benchmark's
tests use it as their fake server. A request with `"stream": false` (what an offline batch
sends) gets the same text as one JSON answer after the whole delay.

./bazel run //tools/bench:reference_server -- --port 8300 --ttft-ms 200 --itl-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fake-model"


@dataclass
class ReferenceServer:
    ttft_s: float = 0.1
    itl_s: float = 0.02
    model: str = MODEL
    send_usage: bool = True
    error_after_chunks: int | None = None  # then an SSE error event instead of the rest
    http_status: int = 200  # anything else: a JSON error body with this status
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each request's header
    url: str = ""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", self._models),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        if self.http_status != 200:
            error = {"message": "fake failure", "type": "invalid_request_error", "code": None}
            return JSONResponse({"error": error}, status_code=self.http_status)
        if _max_tokens(body) is None:
            error = {"message": "max_tokens is required here", "type": "invalid_request_error", "code": None}
            return JSONResponse({"error": error}, status_code=400)
        chat = request.url.path.endswith("/chat/completions")
        if body.get("stream") is False:
            return await self._answer(body, chat)
        return StreamingResponse(self._events(body, chat), media_type="text/event-stream")

    async def _answer(self, body: dict[str, Any], chat: bool) -> Response:
        tokens = _max_tokens(body) or 0
        if tokens:
            await asyncio.sleep(self.ttft_s + (tokens - 1) * self.itl_s)
        text = "".join(f" w{i}" for i in range(tokens))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{len(self.bodies)}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens},
            }
        )

    async def _events(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        def sse(payload: dict[str, Any] | str) -> str:
            return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

        def choice(text: str) -> dict[str, Any]:
            return {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}

        if chat:  # like vLLM: a role-only chunk right away, which carries no content
            yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        tokens = _max_tokens(body) or 0
        for i in range(tokens):
            await asyncio.sleep(self.ttft_s if i == 0 else self.itl_s)
            if self.error_after_chunks is not None and i == self.error_after_chunks:
                yield sse({"error": {"message": "fake worker failed", "type": "server_error", "code": 502}})
                yield sse("[DONE]")
                return
            yield sse({"choices": [choice(f" w{i}")]})
        if self.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            yield sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}})
        yield sse("[DONE]")


def _max_tokens(body: dict[str, Any]) -> int | None:
    """The output length asked for: `max_tokens`, or `max_completion_tokens` (GuideLLM's)."""
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return value if isinstance(value, int) else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reference_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--model", default=MODEL, help="the model name /v1/models lists")
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="delay before the first chunk")
    parser.add_argument("--itl-ms", type=float, default=50.0, help="delay between later chunks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.ttft_ms < 0 or args.itl_ms < 0:
        parser.error("--ttft-ms and --itl-ms must be >= 0")
    server = ReferenceServer(ttft_s=args.ttft_ms / 1000.0, itl_s=args.itl_ms / 1000.0, model=args.model)
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning", lifespan="off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
