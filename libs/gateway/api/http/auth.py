"""Optional API keys at the HTTP edge, as vLLM's `--api-key`: `Authorization: Bearer KEY`.

Keys are compared in constant time over their SHA-256 digests (so neither the content nor the
length of a key leaks through timing), and never logged or echoed: `ApiKeys` prints as a
count. Health, readiness, metrics and SageMaker's `/ping` stay open unless asked otherwise
(probes and scrapers usually hold no key; vLLM guards only `/v1/*`, so its `/ping` is open too).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from libs.gateway.api.http.asgi import send_error
from libs.gateway.api.http.request_metrics import AsgiApp, Receive, Scope, Send
from libs.gateway.common import errors

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/ping"})


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


def authenticated(keys: ApiKeys, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request (its raw ASGI headers) may see what the API keys guard: any request
    when no key is configured (the whole API is open then), else one with a valid key."""
    return not keys or keys.accepts(bearer(headers) or "")


# A tenant's cache salt: this prefix and 128 bits of HMAC-SHA256 in hex (tenant_salt).
TENANT_SALT_PREFIX = "key-"
TENANT_SALT_HEX_CHARS = 32


def tenant_salt(secret: bytes, key: str) -> str:
    """The prefix-cache salt of the requests made with API key `key` (--cache-salt-per-api-key):
    a keyed hash, so the salt, which engines and the kvstore keep beside cached KV, neither
    shows the key nor lets anyone test guesses of it without `secret`."""
    digest = hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()
    return TENANT_SALT_PREFIX + digest[:TENANT_SALT_HEX_CHARS]


def combined_salt(tenant: str | None, client: str | None) -> str | None:
    """The salt a request's KV is keyed by: the tenant's, then the client's own cache_salt (so a
    tenant can still partition its own requests), or the client's alone without a tenant salt.
    Unambiguous: the tenant salt has a fixed length and no '|'."""
    if tenant is None:
        return client
    return f"{tenant}|{client}" if client else tenant


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
        if not self._keys.accepts(bearer(scope.get("headers", ())) or ""):
            await send_error(send, unauthorized(), {"WWW-Authenticate": "Bearer"})
            return
        await self._app(scope, receive, send)


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, from raw ASGI headers."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None
