"""cleave_gateway_requests_total counts each HTTP request by endpoint and status."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from libs.gateway.api.http.request_metrics import OTHER_ENDPOINT, RequestCounter

pytestmark = pytest.mark.anyio


def count(endpoint: str, status: str) -> float:
    labels = {"endpoint": endpoint, "status": status}
    return REGISTRY.get_sample_value("cleave_gateway_requests_total", labels) or 0.0


def responding(status: int, *, then_fail: bool = False) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        if then_fail:
            raise RuntimeError("stream broke")
        await send({"type": "http.response.body", "body": b""})

    return app


async def failing(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("handler bug")


async def call(app: Any, path: str, scope_type: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    await RequestCounter(app, endpoints={"/v1/completions", "/health"})(
        {"type": scope_type, "path": path}, receive, send
    )
    return sent


async def test_a_request_counts_once_under_its_endpoint_and_status() -> None:
    before = count("/v1/completions", "400")
    sent = await call(responding(400), "/v1/completions")
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert count("/v1/completions", "400") - before == 1


async def test_unknown_paths_share_one_label() -> None:
    before = count(OTHER_ENDPOINT, "404")
    await call(responding(404), "/wp-admin/login.php")
    assert count(OTHER_ENDPOINT, "404") - before == 1
    assert count("/wp-admin/login.php", "404") == 0


async def test_an_app_that_raises_before_responding_counts_as_a_500() -> None:
    before = count("/health", "500")
    with pytest.raises(RuntimeError, match="handler bug"):
        await call(failing, "/health")
    assert count("/health", "500") - before == 1


async def test_a_stream_that_breaks_after_starting_keeps_its_status() -> None:
    before_ok, before_error = count("/v1/completions", "200"), count("/v1/completions", "500")
    with pytest.raises(RuntimeError, match="stream broke"):
        await call(responding(200, then_fail=True), "/v1/completions")
    assert count("/v1/completions", "200") - before_ok == 1
    assert count("/v1/completions", "500") - before_error == 0


async def test_lifespan_events_pass_through_uncounted() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await call(app, "", scope_type="lifespan")
    assert seen == ["lifespan"]
