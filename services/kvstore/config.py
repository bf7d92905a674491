"""Command line -> frozen configuration for the kvstore process (the only place flags are read)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.errors import ConfigError
from libs.config.values import parse_port, parse_positive_int
from libs.kvstore.config import DEFAULT_CHUNK_TOKENS, REDIS_URL_SCHEMES, KvStoreConfig
from services.flags import add_server_flags

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(flag: str, text: str) -> int:
    """A byte count: 1073741824, 512MiB, 1G, 1.5GiB (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if not match or (match.group(3) and not match.group(2) and match.group(3).lower() != "b"):
        raise ConfigError(flag, text, "a size such as 1073741824, 512MiB or 2G")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ConfigError(flag, text, "a positive size")
    return size


@dataclass(frozen=True)
class KvStoreProcessConfig:
    host: str
    port: int
    metrics_port: int | None
    log_level: str
    log_json: bool
    store: KvStoreConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Cleave kvstore: KV chunks in memory, on disk and in Redis, found by prompt prefix."
    )
    add = parser.add_argument
    add_server_flags(parser)
    add("--metrics-port", default=None, help="Prometheus /metrics port (unset = off)")
    add("--cpu-bytes", default="1GiB", help="CPU memory tier size, allocated at start (e.g. 1GiB)")
    add("--disk-dir", default=None, help="local disk tier directory (unset = no disk tier)")
    add("--disk-bytes", default="10GiB", help="local disk tier bound")
    add("--redis-url", default=None, help="remote tier, e.g. redis://127.0.0.1:6379 (unset = none)")
    add(
        "--chunk-tokens",
        default=str(DEFAULT_CHUNK_TOKENS),
        help="tokens per chunk; every kvstore sharing a Redis must agree",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> KvStoreProcessConfig:
    args = build_parser().parse_args(argv)
    disk_dir = Path(args.disk_dir) if args.disk_dir else None
    if disk_dir is not None and "," in str(disk_dir):
        raise ConfigError("--disk-dir", args.disk_dir, "a directory without ',' (LMCache splits paths on it)")
    if args.redis_url is not None and not args.redis_url.startswith(REDIS_URL_SCHEMES):
        raise ConfigError(
            "--redis-url", args.redis_url, f"a URL starting with one of {', '.join(REDIS_URL_SCHEMES)}"
        )
    return KvStoreProcessConfig(
        host=args.host,
        port=parse_port("--port", args.port),
        metrics_port=None if args.metrics_port is None else parse_port("--metrics-port", args.metrics_port),
        log_level=args.log_level,
        log_json=args.log_json,
        store=KvStoreConfig(
            cpu_bytes=parse_bytes("--cpu-bytes", args.cpu_bytes),
            disk_dir=disk_dir,
            disk_bytes=parse_bytes("--disk-bytes", args.disk_bytes) if disk_dir else 0,
            redis_url=args.redis_url,
            chunk_tokens=parse_positive_int("--chunk-tokens", args.chunk_tokens),
        ),
    )
