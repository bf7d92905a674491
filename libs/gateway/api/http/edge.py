"""The HTTP edge's protections, as one value the service builds from its flags: body size,
API keys and per-request bounds. `install` wraps an ASGI app in the middleware."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from libs.gateway.api.http.auth import OPEN_PATHS, ApiKeyAuth, ApiKeys, authenticated, bearer, tenant_salt
from libs.gateway.api.http.http_limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from libs.gateway.api.request_limits import RequestLimits


@dataclass(frozen=True)
class HttpEdge:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_keys: ApiKeys = field(default_factory=ApiKeys)  # none: no authentication (the local default)
    auth_health: bool = False  # require the key on /health, /ready and /metrics too
    # vLLM's --root-path: the prefix a path-based proxy serves the API under. Requests work with
    # and without it (Starlette strips it from the path it routes), as on vLLM's server.
    root_path: str = ""
    # --cache-salt-per-api-key: the HMAC key each API key's cache salt is derived with
    # (tenant_salt); None: requests keep the client's cache_salt alone.
    cache_salt_key: bytes | None = None

    def authenticated(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a request (raw ASGI headers) may see what the keys guard, such as the
        workers' addresses on /health: always without keys, else with a valid one."""
        return authenticated(self.api_keys, headers)

    def tenant_salt(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The cache salt of the API key a request presented, with --cache-salt-per-api-key
        (else None): HMAC-SHA256 of the key under `cache_salt_key`, never the key itself. The
        middleware has let only valid keys in, so each tenant (key) gets one salt."""
        if self.cache_salt_key is None:
            return None
        return tenant_salt(self.cache_salt_key, bearer(headers) or "")

    def install(self, app: Any) -> None:
        """Adds the middleware to a Starlette/FastAPI `app`. The last added runs first: a
        request without a key is refused before its body is read, an oversized body before
        FastAPI parses it."""
        app.add_middleware(BodySizeLimit, max_bytes=self.max_body_bytes)
        if self.api_keys:
            app.add_middleware(
                ApiKeyAuth, keys=self.api_keys, open_paths=() if self.auth_health else OPEN_PATHS
            )
