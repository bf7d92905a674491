"""API keys at the edge: bearer keys accepted, everything else a 401 error object, probes open."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from libs.gateway.api.http.auth import ApiKeyAuth, ApiKeys

pytestmark = pytest.mark.anyio


def test_keys_compare_but_never_show_themselves() -> None:
    keys = ApiKeys(["sk-one", "sk-two", "sk-one", ""])
    assert len(keys) == 2 and keys
    assert keys.accepts("sk-two") and not keys.accepts("sk-three") and not keys.accepts("")
    assert "sk-" not in repr(keys) and "sk-" not in str(keys)
    assert keys == ApiKeys(["sk-two", "sk-one"]) and not ApiKeys()


async def call(auth: ApiKeyAuth, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await auth({"type": "http", "method": "POST", "path": path, "headers": headers}, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else {}


async def app(_scope: Any, _receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_a_valid_bearer_key_passes_and_anything_else_is_a_401_error_object() -> None:
    auth = ApiKeyAuth(app, ApiKeys(["sk-secret"]))
    assert (await call(auth, "/v1/completions", [(b"authorization", b"Bearer sk-secret")]))[0] == 200
    assert (await call(auth, "/v1/completions", [(b"authorization", b"bearer sk-secret")]))[0] == 200
    for headers in (
        [],
        [(b"authorization", b"Bearer sk-wrong")],
        [(b"authorization", b"Basic sk-secret")],
        [(b"authorization", b"sk-secret")],
    ):
        status, body = await call(auth, "/v1/completions", headers)
        assert status == 401
        assert body["error"]["code"] == "invalid_api_key"
        assert "sk-" not in json.dumps(body)  # neither the key nor the attempt is echoed


async def test_probes_are_open_unless_configured_otherwise() -> None:
    keys = ApiKeys(["k"])
    for path in ("/health", "/ready", "/metrics", "/ping"):
        assert (await call(ApiKeyAuth(app, keys), path, []))[0] == 200
        assert (await call(ApiKeyAuth(app, keys, open_paths=()), path, []))[0] == 401
    assert (await call(ApiKeyAuth(app, keys), "/tokenize", []))[0] == 401
