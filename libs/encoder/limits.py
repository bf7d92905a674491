"""What the encoder accepts of an image (no imports: the local stack's config uses it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000  # width x height, checked from the header
    allow_http: bool = False
    http_timeout_s: float = 10.0
    # Fetch from private, loopback, link-local (and other non-global) addresses too
    # (--allow-private-image-urls; images.py explains the guard).
    allow_private: bool = False
