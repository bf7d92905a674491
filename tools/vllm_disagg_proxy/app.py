"""The proxy's HTTP app: one OpenAI-compatible endpoint over vLLM prefill and decode servers."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import prometheus_client
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tools.vllm_disagg_proxy import flow

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class ProxyConfig:
    prefill_urls: tuple[str, ...]
    decode_urls: tuple[str, ...]
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.prefill_urls or not self.decode_urls:
            raise ValueError("give at least one prefill and one decode server")
        for url in (*self.prefill_urls, *self.decode_urls):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server URL must start with http(s)://: {url!r}")


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class _Metrics:
    """Per-app registry, so that several apps (tests) never share a time series."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        # The prefill request as the proxy sees it: queueing + prompt compute + HTTP; the
        # counterpart of Cleave's cleave_gateway_stage_seconds{stage="prefill"}.
        self.prefill_seconds = prometheus_client.Histogram(
            "vllm_disagg_proxy_prefill_seconds",
            "Prefill request latency seen by the proxy",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80),
            registry=self.registry,
        )
        self.requests = prometheus_client.Counter(
            "vllm_disagg_proxy_requests",
            "Client requests by outcome",
            ["outcome"],
            registry=self.registry,
        )


class _Backends:
    """Round-robin over the prefill and decode servers (no awaits inside: task-safe)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.prefill_urls = tuple(_root(u) for u in config.prefill_urls)
        self.decode_urls = tuple(_root(u) for u in config.decode_urls)
        self._prefill: Iterator[str] = itertools.cycle(self.prefill_urls)
        self._decode: Iterator[str] = itertools.cycle(self.decode_urls)

    def next_prefill(self) -> str:
        return next(self._prefill)

    def next_decode(self) -> str:
        return next(self._decode)


def _error(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def _forward_headers(request: Request, request_id: str) -> dict[str, str]:
    headers = {"X-Request-Id": request_id}
    if "authorization" in request.headers:
        headers["Authorization"] = request.headers["authorization"]
    return headers


def create_app(config: ProxyConfig) -> FastAPI:
    backends = _Backends(config)
    metrics = _Metrics()
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # No pool limit: a pool queue would show up as latency that is the proxy's, not vLLM's.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=config.timeout_s, limits=limits) as client:
            state["client"] = client
            yield

    app = FastAPI(title="vLLM disaggregated prefill proxy", docs_url=None, redoc_url=None, lifespan=lifespan)

    async def prefill(
        client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any] | JSONResponse:
        url = backends.next_prefill()
        started = time.perf_counter()
        try:
            response = await client.post(url + path, json=flow.prefill_body(body), headers=headers)
        except httpx.HTTPError as exc:
            return _error(
                502, flow.error_body(f"prefill server {url} unreachable: {exc!r}", "server_error", 502)
            )
        metrics.prefill_seconds.observe(time.perf_counter() - started)
        if response.status_code != httpx.codes.OK:
            return _error(
                response.status_code, flow.upstream_error("prefill", response.status_code, response.content)
            )
        try:
            params = response.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict):
            message = (
                f"prefill server {url} returned no kv_transfer_params; is it started with "
                '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_producer"}\'?'
            )
            return _error(502, flow.error_body(message, "server_error", 502))
        return params

    async def generate(path: str, request: Request) -> Response:
        client = state["client"]
        try:
            body = await request.json()
        except ValueError:
            metrics.requests.labels("bad_request").inc()
            return _error(400, flow.error_body("the request body is not valid JSON", "invalid_request_error"))
        if not isinstance(body, dict):
            metrics.requests.labels("bad_request").inc()
            return _error(
                400, flow.error_body("the request body must be a JSON object", "invalid_request_error")
            )
        headers = _forward_headers(request, request.headers.get("x-request-id") or uuid.uuid4().hex)
        params = await prefill(client, path, body, headers)
        if isinstance(params, Response):
            metrics.requests.labels("prefill_error").inc()
            return params
        url = backends.next_decode()
        upstream = client.build_request(
            "POST", url + path, json=flow.decode_body(body, params), headers=headers
        )
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            metrics.requests.labels("decode_error").inc()
            return _error(
                502, flow.error_body(f"decode server {url} unreachable: {exc!r}", "server_error", 502)
            )
        if response.status_code != httpx.codes.OK:
            raw = await response.aread()
            await response.aclose()
            metrics.requests.labels("decode_error").inc()
            return _error(response.status_code, flow.upstream_error("decode", response.status_code, raw))
        metrics.requests.labels("ok").inc()
        if not body.get("stream"):
            raw = await response.aread()
            await response.aclose()
            media_type = response.headers.get("content-type", "application/json")
            return Response(content=raw, status_code=response.status_code, media_type=media_type)
        return StreamingResponse(_relay(response, url), media_type="text/event-stream")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await generate("/v1/completions", request)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await generate("/v1/chat/completions", request)

    @app.get("/v1/models", response_model=None)
    async def models() -> Response:
        url = backends.decode_urls[0]
        try:
            response = await state["client"].get(url + "/v1/models", timeout=10)
        except httpx.HTTPError as exc:
            return _error(
                502, flow.error_body(f"decode server {url} unreachable: {exc!r}", "server_error", 502)
            )
        return Response(response.content, response.status_code, media_type="application/json")

    @app.get("/health", response_model=None)
    async def health() -> JSONResponse:
        """200 once every prefill and decode server answers its own /health."""
        urls = (*backends.prefill_urls, *backends.decode_urls)

        async def ok(url: str) -> bool:
            try:
                return (await state["client"].get(url + "/health", timeout=5)).status_code == httpx.codes.OK
            except httpx.HTTPError:
                return False

        answers = await asyncio.gather(*(ok(url) for url in urls))
        ready = all(answers)
        body = {"status": "ok" if ready else "unavailable", "servers": dict(zip(urls, answers, strict=True))}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(
            prometheus_client.generate_latest(metrics.registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    return app


async def _relay(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The decode server's stream byte for byte; a transport failure ends it with an error event.
    Closing the upstream response (also when the client goes away) makes vLLM abort the request."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        yield flow.sse_error(f"decode server {url} failed mid-stream: {exc!r}")
    finally:
        await response.aclose()
