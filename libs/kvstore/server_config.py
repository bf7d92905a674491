"""The kvstore process's configuration (the only place its flags are declared)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.config.codecs import PORT
from libs.config.flags import flag, group, parse
from libs.config.groups import GrpcSecurityFlags, GrpcServingFlags, LoggingFlags, ServerFlags
from libs.kvstore.config import KvStoreConfig


@dataclass(frozen=True, kw_only=True)
class KvStoreProcessConfig(ServerFlags, GrpcServingFlags, LoggingFlags, GrpcSecurityFlags):
    """Cleave kvstore: KV chunks in memory, on disk and in Redis, found by prompt prefix."""

    metrics_port: int | None = flag(None, codec=PORT, help="Prometheus /metrics port (unset = off)")
    store: KvStoreConfig = group(factory=KvStoreConfig)


def parse_args(argv: Sequence[str] | None = None) -> KvStoreProcessConfig:
    return parse(KvStoreProcessConfig, argv)
