"""Request ids, as vLLM's server keeps them: the client's outside, a unique one inside.

A request's `request_id` (vLLM's field; a random one when the client sends none) names the
response (`chatcmpl-<id>`, `cmpl-<id>`) and nothing else. Everything the request does inside
Cleave (its GenerationSpec, every worker call, the kvstore lookup, the shared GenerateMany
call's key, the logs) uses the client's id with a random suffix, as vLLM's engine does
(InputProcessor.assign_request_id: `<id>-<8 random hex characters>`), so two requests that
carry the same id (a client retrying, two clients with a fixed id) never meet in a worker:
both are served.

The client's id is bounded (MAX_REQUEST_ID_CHARS): it travels in every worker call's
metadata, gRPC headers and log lines; a longer one is a 400 naming `request_id`.
"""

from __future__ import annotations

import secrets

from libs.gateway.common import errors

# Generous for any id scheme (a UUID is 36 characters, vLLM's own 16 plus a prefix), small
# enough that the id never weighs on gRPC metadata or the logs.
MAX_REQUEST_ID_CHARS = 256
# vLLM's suffix: the first 8 hex characters of a random_uuid (32 random bits).
SUFFIX_HEX_CHARS = 8


def random_id() -> str:
    """vLLM's random_uuid: 16 random hex characters (its default `request_id`)."""
    return secrets.token_hex(8)


def internal(client_id: str) -> str:
    """The id a request's work runs under: the client's, plus a random suffix."""
    return f"{client_id}-{secrets.token_hex(SUFFIX_HEX_CHARS // 2)}"


def check(request_id: object) -> str | None:
    """A client id taken from a body outside the request models (batched chat): a string of
    at most MAX_REQUEST_ID_CHARS, or None when absent; else a 400 naming the field."""
    if request_id is None:
        return None
    if not isinstance(request_id, str):
        raise errors.invalid("request_id must be a string", "request_id")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise too_long(len(request_id))
    return request_id


def too_long(length: int) -> errors.ApiError:
    return errors.invalid(
        f"request_id has {length} characters; this server accepts at most {MAX_REQUEST_ID_CHARS}",
        "request_id",
    )
