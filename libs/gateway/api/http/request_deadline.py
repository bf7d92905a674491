"""Each HTTP request's deadline (--request-timeout) starts when it arrives (common/deadline.py)."""

from __future__ import annotations

from libs.gateway.api.http.request_metrics import AsgiApp, Receive, Scope, Send
from libs.gateway.common.deadline import Deadline, bound


class RequestDeadline:
    """ASGI middleware: each HTTP request's deadline starts when it arrives. A plain ASGI
    middleware (not Starlette's BaseHTTPMiddleware) runs the app, the streamed body included,
    in this context, so everything the request does sees the deadline."""

    def __init__(self, app: AsgiApp, timeout_s: float | None) -> None:
        self._app = app
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            with bound(Deadline.after(self._timeout_s)):
                await self._app(scope, receive, send)
            return
        await self._app(scope, receive, send)
