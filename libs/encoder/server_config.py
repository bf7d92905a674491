"""The encoder service's configuration (the only place its flags are declared; the local
stack renders it back to argv)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.config.codecs import PORT, POSITIVE_INT
from libs.config.flags import FLOAT, flag, parse
from libs.config.groups import GrpcSecurityFlags, GrpcServingFlags, LoggingFlags, ModelFlags, ServerFlags
from libs.encoder.limits import ImageLimits


@dataclass(frozen=True, kw_only=True)
class EncoderConfig(ServerFlags, GrpcServingFlags, LoggingFlags, ModelFlags, GrpcSecurityFlags):
    """Cleave encoder: images -> the vision tower's embeddings, for modes xEyPD and xEyPzD."""

    dtype: str = flag("auto", help="the workers' dtype (auto = the model's own): float32, bfloat16, float16")
    encoder_cache_mb: int = flag(256, codec=POSITIVE_INT, help="embedding cache size (MiB, LRU)")
    allow_image_urls: bool = flag(False, help="fetch http(s) image URLs (off: data: URLs only)")
    image_fetch_timeout_s: float = flag(10.0, codec=FLOAT, help="time limit of one image fetch")
    allow_private_image_urls: bool = flag(
        False,
        help="with --allow-image-urls, fetch from private, loopback and link-local addresses too "
        "(off: public addresses only, checked after DNS and after every redirect)",
    )
    max_image_bytes: int = flag(20 * 1024 * 1024, codec=POSITIVE_INT, help="largest image file accepted")
    max_image_pixels: int = flag(
        40_000_000, codec=POSITIVE_INT, help="largest image accepted, width x height"
    )
    max_num_seqs: int = flag(
        16, codec=POSITIVE_INT, help="images encoded per batch (reported to the gateway)"
    )
    metrics_port: int | None = flag(None, codec=PORT, help="Prometheus /metrics port (unset = off)")

    @property
    def limits(self) -> ImageLimits:
        return ImageLimits(
            max_bytes=self.max_image_bytes,
            max_pixels=self.max_image_pixels,
            allow_http=self.allow_image_urls,
            http_timeout_s=self.image_fetch_timeout_s,
            allow_private=self.allow_private_image_urls,
        )


def parse_args(argv: Sequence[str] | None = None) -> EncoderConfig:
    return parse(EncoderConfig, argv)
