"""The HTTP edge's protections, as one value the service builds from its flags: body size,
API keys and per-request bounds. `install` wraps an ASGI app in the middleware."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libs.gateway.auth import OPEN_PATHS, ApiKeyAuth, ApiKeys
from libs.gateway.http_limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from libs.gateway.request_limits import RequestLimits


@dataclass(frozen=True)
class HttpEdge:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_keys: ApiKeys = field(default_factory=ApiKeys)  # none: no authentication (the local default)
    auth_health: bool = False  # require the key on /health, /ready and /metrics too
    # vLLM's --root-path: the prefix a path-based proxy serves the API under. Requests work with
    # and without it (Starlette strips it from the path it routes), as on vLLM's server.
    root_path: str = ""

    def install(self, app: Any) -> None:
        """Adds the middleware to a Starlette/FastAPI `app`. The last added runs first: a
        request without a key is refused before its body is read, an oversized body before
        FastAPI parses it."""
        app.add_middleware(BodySizeLimit, max_bytes=self.max_body_bytes)
        if self.api_keys:
            app.add_middleware(
                ApiKeyAuth, keys=self.api_keys, open_paths=() if self.auth_health else OPEN_PATHS
            )
