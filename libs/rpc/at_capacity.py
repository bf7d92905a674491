"""How a server at its bound on concurrent requests says so to its callers.

A worker runs at most its --max-inflight-requests at once, whichever gateways sent them. One
more is refused with RESOURCE_EXHAUSTED whose details start with `PREFIX`: nothing of it ran
(no token, no KV pulled), so the caller may send the same call again, here or elsewhere, once
there is room. A plain RESOURCE_EXHAUSTED (a message over gRPC's size limit, a gateway's
own bound on a slow reader) says nothing of the kind.
"""

from __future__ import annotations

import grpc

PREFIX = "at capacity:"


def message(reason: str) -> str:
    """The details of an at-capacity refusal."""
    return f"{PREFIX} {reason}"


def is_at_capacity(code: grpc.StatusCode | None, details: str | None) -> bool:
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and bool(details) and str(details).startswith(PREFIX)
