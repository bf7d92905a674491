"""The HTTP edge in front of the app: body-size limits, API keys and the open probes, a root
path (the app's own wiring: test_app.py, whose helpers these tests share)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from libs.gateway.api.http.auth import ApiKeys
from libs.gateway.api.http.edge import HttpEdge
from tests.libs.gateway.api.test_app import EVENTS, Workers, client, requests_counted
from tests.libs.gateway.fakes import ScriptedServing

pytestmark = pytest.mark.anyio


async def test_a_body_declared_larger_than_the_limit_is_a_413_unread() -> None:
    pipeline = ScriptedServing(EVENTS)
    before = requests_counted("/v1/completions", "413")
    async with client(pipeline, edge=HttpEdge(max_body_bytes=1024 * 1024)) as http:
        response = await http.post(
            "/v1/completions", content=b"x" * (50 * 1024 * 1024), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert pipeline.specs == [] and requests_counted("/v1/completions", "413") - before == 1


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(100):
            sent += 1
            yield b"x" * 1024

    async with client(ScriptedServing(EVENTS), edge=HttpEdge(max_body_bytes=10 * 1024)) as http:
        response = await http.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert sent <= 12  # the rest was never read


async def test_a_body_within_the_limit_is_served() -> None:
    async with client(ScriptedServing(EVENTS), edge=HttpEdge(max_body_bytes=200)) as http:
        response = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2]})
    assert response.status_code == 200


async def test_api_keys_guard_the_api_but_not_the_probes() -> None:
    edge = HttpEdge(api_keys=ApiKeys(["sk-1", "sk-2"]))
    async with client(ScriptedServing(EVENTS), edge=edge, workers=Workers("both")) as http:
        missing = await http.post("/v1/completions", json={"model": "m", "prompt": [1, 2]})
        wrong = await http.get("/v1/models", headers={"Authorization": "Bearer sk-3"})
        right = await http.post(
            "/v1/completions", json={"model": "m", "prompt": [1, 2]}, headers={"Authorization": "Bearer sk-2"}
        )
        probes = [(await http.get(path)).status_code for path in ("/health", "/ready", "/metrics")]
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert (
        missing.json()["error"]["code"] == "invalid_api_key"
        and missing.headers["www-authenticate"] == "Bearer"
    )
    assert probes == [200, 200, 200]
    async with client(
        ScriptedServing(EVENTS), edge=HttpEdge(api_keys=ApiKeys(["k"]), auth_health=True)
    ) as http:
        assert (await http.get("/health")).status_code == 401


async def test_ping_is_open_and_health_shows_worker_addresses_only_to_a_caller_with_a_key() -> None:
    edge = HttpEdge(api_keys=ApiKeys(["sk-1"]))
    key = {"Authorization": "Bearer sk-1"}
    async with client(ScriptedServing(EVENTS), edge=edge, workers=Workers("prefill", "decode")) as http:
        pings = [(await http.get("/ping")).status_code, (await http.post("/ping")).status_code]
        anonymous = await http.get("/health")
        wrong_key = await http.get("/health", headers={"Authorization": "Bearer sk-2"})
        keyed = await http.get("/health", headers=key)
        ping = await http.get("/ping")
    # SageMaker's health check carries no key (vLLM guards only /v1/*).
    assert pings == [200, 200]
    for answer in (anonymous, wrong_key, ping):
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
        workers = answer.json()["workers"]
        assert [(w["role"], w["healthy"]) for w in workers] == [("prefill", True), ("decode", True)]
        assert "127.0.0.1" not in answer.text and all("address" not in w for w in workers)
    assert [w["address"] for w in keyed.json()["workers"]] == ["127.0.0.1:7000", "127.0.0.1:7001"]
    # Without keys the whole API is open: /health shows the addresses to everyone, as before.
    async with client(ScriptedServing(EVENTS), workers=Workers("both")) as http:
        assert (await http.get("/health")).json()["workers"][0]["address"] == "127.0.0.1:7000"
    # --auth-health: the probes, /ping included, want the key.
    edge = HttpEdge(api_keys=ApiKeys(["sk-1"]), auth_health=True)
    async with client(ScriptedServing(EVENTS), edge=edge, workers=Workers("both")) as http:
        assert (await http.get("/ping")).status_code == 401
        assert (await http.get("/ping", headers=key)).json()["workers"][0]["address"] == "127.0.0.1:7000"


async def test_under_a_root_path_the_api_answers_with_and_without_the_prefix() -> None:
    # vLLM's --root-path (FastAPI's root_path): a path-based proxy may or may not strip it;
    # the key guards the API and the probes stay open under both paths.
    edge = HttpEdge(api_keys=ApiKeys(["k"]), root_path="/llm")
    key = {"Authorization": "Bearer k"}
    async with client(ScriptedServing(EVENTS), edge=edge, workers=Workers("both")) as http:
        for prefix in ("", "/llm"):
            assert (await http.get(f"{prefix}/v1/models", headers=key)).status_code == 200
            assert (await http.get(f"{prefix}/v1/models")).status_code == 401
            assert (await http.get(f"{prefix}/health")).status_code == 200
        assert (await http.get("/other/v1/models", headers=key)).status_code == 404
