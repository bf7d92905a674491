"""ASGI middleware refusing request bodies above a size, before the app reads or parses them.

A declared Content-Length above the limit is answered 413 at once, without reading a byte of
the body; a body without one (chunked upload) is counted as it arrives and refused as soon as
it passes the limit. Either way the app never holds more than the limit in memory.
"""

from __future__ import annotations

import contextlib

from starlette.exceptions import HTTPException

from libs.gateway.api.http.asgi import send_error
from libs.gateway.api.http.request_metrics import AsgiApp, Message, Receive, Scope, Send
from libs.gateway.common import errors

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def body_too_large(limit: int) -> errors.ApiError:
    return errors.ApiError(
        413, f"the request body is larger than this server accepts ({limit} bytes)", code="request_too_large"
    )


class _BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body. An HTTPException so that FastAPI passes it through
    (it turns any other error while reading a body into a 400); the middleware answers."""

    def __init__(self) -> None:
        super().__init__(413)


class BodySizeLimit:
    def __init__(self, app: AsgiApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._app = app
        self._max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self._max_bytes:
            await send_error(send, body_too_large(self._max_bytes))
            return
        received = 0
        too_large = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max_bytes:
                    too_large = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large and not started:
                return  # the 413 below replaces whatever the app made of the error
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_BodyTooLarge):  # answered below
            await self._app(scope, limited_receive, guarded_send)
        if too_large and not started:
            await send_error(send, body_too_large(self._max_bytes))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11) refuses a malformed length itself
    return None
