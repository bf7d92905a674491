"""The kvstore's configuration: one frozen value, built once at the process edge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import BYTES, POSITIVE_INT
from libs.config.errors import ConfigError
from libs.config.flags import PATH, flag

# LMCache's default chunk size; every process that shares a Redis must use the same one
# (it is part of the layout fingerprint, so a mismatch misses instead of mixing chunks).
DEFAULT_CHUNK_TOKENS = 256

REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True, kw_only=True)
class KvStoreConfig:
    """The tiers' flags, plus tuning that is fixed in code."""

    # LMCache allocates the CPU tier up front (and touches it).
    cpu_bytes: int = flag(1 << 30, codec=BYTES, help="CPU memory tier size, allocated at start (e.g. 1GiB)")
    # The directory is created if missing and its chunks are adopted again after a restart.
    disk_dir: Path | None = flag(None, codec=PATH, help="local disk tier directory (unset = no disk tier)")
    disk_bytes: int = flag(10 << 30, codec=BYTES, help="local disk tier bound")
    redis_url: str | None = flag(None, help="remote tier, e.g. redis://127.0.0.1:6379 (unset = none)")
    # A file, not the password: a command line is visible to every local user (ps, /proc) and
    # to whoever reads a container's or pod's spec. The first line is used (rotation: a
    # deployment's Redis accepts every line, deploy/).
    redis_password_file: Path | None = flag(
        None, codec=PATH, help="file whose first line is the password of --redis-url's Redis (unset = none)"
    )
    # A file, not the key: a command line is visible to every local user (ps, /proc).
    kv_auth_key_file: Path | None = flag(
        None,
        codec=PATH,
        help="file holding the HMAC key chunks on disk and in Redis are tagged with "
        "(unset = untagged); every kvstore sharing a Redis needs the same key",
    )
    chunk_tokens: int = flag(
        DEFAULT_CHUNK_TOKENS,
        codec=POSITIVE_INT,
        help="tokens per chunk; every kvstore sharing a Redis must agree",
    )
    # How long one Redis operation may take before Redis counts as down, and how often its
    # health is probed (also how soon a down Redis is tried again).
    remote_timeout_s: float = 1.0
    remote_probe_interval_s: float = 2.0
    # How long a Put waits for the disk and Redis copies before answering anyway.
    write_timeout_s: float = 10.0
    # A chunk larger than this share of the CPU tier is refused: staging it would evict most
    # of what the tier holds (LMCache stages every write and every disk or Redis read there).
    max_chunk_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.cpu_bytes <= 0:
            raise ValueError("cpu_bytes must be positive: LMCache stages every tier in CPU memory")
        if self.disk_dir is not None:
            if self.disk_bytes <= 0:
                raise ValueError("disk_bytes must be positive when disk_dir is set")
            if "," in str(self.disk_dir):
                # LMCache reads a comma-separated list of paths here.
                raise ConfigError("--disk-dir", str(self.disk_dir), "a directory without ','")
        if self.redis_url is not None and not self.redis_url.startswith(REDIS_URL_SCHEMES):
            raise ConfigError(
                "--redis-url", self.redis_url, f"a URL starting with one of {', '.join(REDIS_URL_SCHEMES)}"
            )
        if self.chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be positive")
        if not 0 < self.max_chunk_fraction < 1:
            raise ValueError("max_chunk_fraction must be in (0, 1)")
        if min(self.remote_timeout_s, self.remote_probe_interval_s, self.write_timeout_s) <= 0:
            raise ValueError("timeouts and intervals must be positive")

    @property
    def max_chunk_bytes(self) -> int:
        return int(self.cpu_bytes * self.max_chunk_fraction)
