"""The encoder's client-facing error: a bad image is the caller's mistake (gRPC
INVALID_ARGUMENT, a 400 at the gateway), never the encoder's."""

from __future__ import annotations

from libs.rpc.errors import InvalidRequest


class ImageError(InvalidRequest):
    """An image that cannot be used; the message says what is wrong with it."""
