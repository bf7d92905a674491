"""vLLM's documented prefill/decode request flow for NixlConnector, as pure functions.

A client request goes first to a prefill server as a one-token, non-streamed request that asks
vLLM to keep the prompt's KV for a remote decoder (`do_remote_decode`). The prefill response
carries `kv_transfer_params` naming where that KV lives; the original request then goes to a
decode server with those params, and the decoder pulls the KV over NIXL instead of computing
the prompt again.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# What the prefill request asks for: keep the KV for a remote decoder. The remote_* fields are
# filled in by the prefill server's connector and come back in its response.
PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Sampling fields that cannot hold with a one-token prefill (vLLM refuses min_tokens >
# max_tokens) or that only apply to streams.
_PREFILL_DROPPED = ("stream_options", "min_tokens")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill server's request: the client's body, one token, no stream, keep the KV."""
    prefill = copy.deepcopy(body)
    for key in _PREFILL_DROPPED:
        prefill.pop(key, None)
    prefill["max_tokens"] = 1
    if "messages" in body or "max_completion_tokens" in body:
        # Chat: vLLM prefers max_completion_tokens over max_tokens when both are set.
        prefill["max_completion_tokens"] = 1
    prefill["stream"] = False
    prefill["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    return prefill


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """The decode server's request: the client's body as sent, plus where the KV lives."""
    decode = copy.deepcopy(body)
    decode["kv_transfer_params"] = kv_transfer_params
    return decode


def error_body(message: str, type_: str, code: int | str | None = None) -> dict[str, Any]:
    """An error in the OpenAI API's own shape."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def upstream_error(side: str, status: int, raw: bytes) -> dict[str, Any]:
    """An error answer of a prefill/decode server as an OpenAI error object naming the side.

    vLLM answers errors as OpenAI error objects already; those keep their type and code, with
    the message prefixed by the side that failed. Anything else (a proxy's HTML page, plain
    text) is wrapped whole.
    """
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        wrapped = dict(error)
        wrapped["message"] = f"{side} server: {error.get('message', '')}"
        wrapped.setdefault("type", "server_error")
        wrapped.setdefault("param", None)
        wrapped.setdefault("code", status)
        return {"error": wrapped}
    if isinstance(error, str):
        text = error
    type_ = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return error_body(f"{side} server answered HTTP {status}: {text[:500]}", type_, status)


def sse_error(message: str) -> bytes:
    """A stream's last words when the decode server fails mid-stream (vLLM's own shape)."""
    payload = json.dumps(error_body(message, "server_error", 502))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
