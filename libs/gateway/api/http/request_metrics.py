"""ASGI middleware counting HTTP requests by endpoint and status (cleave_gateway_requests_total)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from libs.gateway.common import metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Paths the app does not serve share one label, so scanners cannot grow the series without bound.
OTHER_ENDPOINT = "other"


class RequestCounter:
    """Counts each HTTP request once, when its status is known: when the response starts
    (a stream counts as its status, 200, even if it later carries an error event), or as a
    500 when the app raised before responding. A request cancelled before any response is
    not counted."""

    def __init__(self, app: AsgiApp, endpoints: Collection[str]) -> None:
        self._app = app
        self._endpoints = frozenset(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in self._endpoints else OTHER_ENDPOINT
        started = False

        async def send_and_count(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                metrics.REQUESTS.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self._app(scope, receive, send_and_count)
        except Exception:
            if not started:
                metrics.REQUESTS.labels(endpoint, "500").inc()
            raise
