"""Entry point of the Cleave encoder service.

./bazel run //services/encoder -- --model /path/to/vlm --port 50070
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from libs.encoder.encoder import ImageEncoder
from libs.encoder.server_config import EncoderConfig, parse_args
from libs.encoder.vision import VisionTower
from libs.models.errors import ModelConversionError
from libs.models.resolve import resolve_model
from libs.observability.logging import configure_logging
from libs.observability.metrics import start_metrics_server
from libs.rpc.security import RpcSecurity, load_security
from libs.rpc.server import GrpcServer, ServerConfig, serve_until_signal
from services.encoder.servicer import EncoderServicer, binding

log = structlog.get_logger("cleave.encoder")


def load_servicer(config: EncoderConfig) -> EncoderServicer:
    """Everything that can fail on a bad --model, done before any port is bound."""
    resolved = resolve_model(
        config.model, config.model_cache_dir, progress=True, allow_download=config.allow_model_download
    )
    tower = VisionTower.load(resolved.path, config.dtype)
    encoder = ImageEncoder(tower, config.limits, cache_bytes=config.encoder_cache_mb * 1024 * 1024)
    log.info(
        "vision tower loaded", model=str(resolved.path), hidden_size=tower.hidden_size, dtype=str(tower.dtype)
    )
    return EncoderServicer(encoder, model=config.served_model_name or resolved.served_name)


async def run(config: EncoderConfig, servicer: EncoderServicer, security: RpcSecurity) -> None:
    server_config = ServerConfig.of(config, security, replicated=True)
    server = GrpcServer(server_config, [binding(servicer)])
    await serve_until_signal(server)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        configure_logging(level=config.effective_log_level, json=config.log_json, service="encoder")
        security = load_security(config, os.environ)
        servicer = load_servicer(config)
    except (ValueError, FileNotFoundError, OSError, ModelConversionError) as error:
        print(f"cleave encoder: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    if config.metrics_port is not None:
        start_metrics_server(config.metrics_port)
    asyncio.run(run(config, servicer, security))
    return 0


if __name__ == "__main__":
    sys.exit(main())
