"""Answering an OpenAI error object from pure ASGI middleware (before FastAPI is involved)."""

from __future__ import annotations

import json

from libs.gateway.api.http.request_metrics import Send
from libs.gateway.common import errors


async def send_error(send: Send, error: errors.ApiError, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error.body()).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
