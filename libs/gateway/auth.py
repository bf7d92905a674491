"""Optional API keys at the HTTP edge, as vLLM's `--api-key`: `Authorization: Bearer KEY`.

Keys are compared in constant time over their SHA-256 digests (so neither the content nor the
length of a key leaks through timing), and never logged or echoed: `ApiKeys` prints as a
count. Health, readiness and metrics stay open unless asked otherwise (probes and scrapers
usually hold no key).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from libs.gateway import errors
from libs.gateway.asgi import send_error
from libs.gateway.request_metrics import AsgiApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeys:
    """A set of keys that compares but never shows itself."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._keys = tuple(dict.fromkeys(k for k in keys if k))
        self._digests = tuple(hashlib.sha256(k.encode()).digest() for k in self._keys)

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKeys) and set(self._keys) == set(other._keys)

    def __hash__(self) -> int:
        return hash(frozenset(self._digests))

    def __repr__(self) -> str:
        return f"ApiKeys(<{len(self._keys)} key(s)>)"

    def accepts(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).digest()
        # Every key is compared, so the time does not say which one (or whether any) matched.
        matched = False
        for key in self._digests:
            matched |= hmac.compare_digest(digest, key)
        return matched


def unauthorized() -> errors.ApiError:
    # OpenAI's own answer to a bad key: 401, invalid_request_error, code invalid_api_key.
    return errors.ApiError(
        401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key"
    )


class ApiKeyAuth:
    """Refuses requests without a valid bearer key; `open_paths` need none."""

    def __init__(self, app: AsgiApp, keys: ApiKeys, open_paths: Iterable[str] = OPEN_PATHS) -> None:
        self._app = app
        self._keys = keys
        self._open = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path without the app's root_path (--root-path), as the routes see it.
        path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or path in self._open:
            await self._app(scope, receive, send)
            return
        if not self._keys.accepts(_bearer(scope) or ""):
            await send_error(send, unauthorized(), {"WWW-Authenticate": "Bearer"})
            return
        await self._app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None
