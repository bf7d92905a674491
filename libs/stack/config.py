"""The local stack's flags: what the gateway starts when it is given no worker addresses."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import BYTES, NON_NEGATIVE_INT, PORT
from libs.config.errors import ConfigError
from libs.config.flags import FLOAT, PATH, Codec, flag, group
from libs.config.groups import (
    DEFAULT_CACHE_DIR,
    ChatTemplateFlags,
    EngineFlags,
    LoggingFlags,
    ModelFlags,
    RoleFlags,
    ToolParserFlags,
)
from libs.config.values import check_disjoint
from libs.stack.restarts import RestartPolicy
from libs.stack.topology import Topology, parse_mode
from libs.worker.speculative import parse_speculative_config

MODE: Codec[Topology] = Codec(lambda _flag, text: parse_mode(text), lambda topology: topology.name)


@dataclass(frozen=True, kw_only=True)
class StackRole(RoleFlags):
    """One role's workers in the local stack: --prefill-* or --decode-*."""

    port: int = flag(0, codec=PORT, help="first gRPC port of this role's workers (0 = any free ports)")


@dataclass(frozen=True, kw_only=True)
class StackConfig(LoggingFlags, ModelFlags, EngineFlags, ToolParserFlags, ChatTemplateFlags):
    cache_dir: Path = flag(DEFAULT_CACHE_DIR, codec=PATH, help="local stack: converted models and logs")
    mode: Topology = flag(
        parse_mode("1p1d"),
        codec=MODE,
        help="local stack topology: 'pd' (colocated), 'Npd' (N colocated workers, e.g. 2pd), 'XpYd' "
        "(e.g. 1p1d, 2p1d), or with vision encoders 'XeYpd' (e.g. 1e1pd) or 'XeYpZd' (e.g. 1e1p1d, 2e1p1d)",
    )
    prefill: StackRole = group("prefill", factory=StackRole)
    # Colocated (pd) workers take the decode role's settings.
    decode: StackRole = group("decode", factory=StackRole)
    # Vision encoders (modes XeYpd, XeYpZd): --encode-port, --encode-device-group,
    # --encode-max-num-seqs as the other roles' (the engine-only role flags are not used).
    encode: StackRole = group("encode", factory=StackRole)
    allow_image_urls: bool = flag(
        False,
        help="fetch http(s) image URLs: the local stack's encoders, or the gateway itself when no "
        "encoder serves (the workers encode images in-engine); off: data: URLs only",
    )
    image_fetch_timeout_s: float = flag(10.0, codec=FLOAT, help="time limit of one image fetch")
    allow_private_image_urls: bool = flag(
        False,
        help="with --allow-image-urls, fetch from private, loopback and link-local addresses too "
        "(off: public addresses only, checked after DNS and after every redirect)",
    )
    allow_device_overlap: bool = flag(False, help="let prefill and decode share devices")
    startup_timeout_s: float = flag(900.0, codec=FLOAT, help="local stack: seconds to wait for every service")
    # Fleet-wide prefix KV: a running kvstore's address for the local stack's workers, or
    # --kvstore to have the local stack start one (CPU tier, plus Redis when a URL is given).
    kvstore: bool = flag(
        False, help="local stack: start a kvstore; workers share prompt-prefix KV through it"
    )
    kvstore_address: str | None = flag(None, help="local stack: workers use this running kvstore (host:port)")
    kvstore_cpu_bytes: int = flag(1 << 30, codec=BYTES, help="the local kvstore's CPU memory tier")
    kvstore_redis_url: str | None = flag(
        None, help="the local kvstore's Redis tier, e.g. redis://127.0.0.1:6379"
    )
    kvstore_auth_key_file: Path | None = flag(
        None, codec=PATH, help="the local kvstore's --kv-auth-key-file (HMAC key for disk and Redis chunks)"
    )
    # A child that crashes is restarted on its address after a backoff that doubles with each
    # recent restart; one that crashes more often than this stays down.
    restart_limit: int = flag(
        5, codec=NON_NEGATIVE_INT, help="local stack: restarts of a crashed child per window (0 = never)"
    )
    restart_window_s: float = flag(600.0, codec=FLOAT, help="local stack: the window of --restart-limit")
    restart_backoff_s: float = flag(1.0, codec=FLOAT, help="local stack: wait before a first restart")
    restart_max_backoff_s: float = flag(30.0, codec=FLOAT, help="local stack: the doubled wait's cap")

    def __post_init__(self) -> None:
        check_disjoint(
            "--prefill-device-group",
            self.prefill.device_group,
            "--decode-device-group",
            self.decode.device_group,
            allow=self.allow_device_overlap,
        )
        if self.prefill.speculative_config:
            raise ConfigError(
                "--prefill-speculative-config",
                self.prefill.speculative_config,
                "unset: only decode speculates",
            )
        if self.decode.speculative_config:
            # Checked here too, so a bad key stops the gateway before it starts any process.
            parse_speculative_config(self.decode.speculative_config, "--decode-speculative-config")
        for name in ("restart_window_s", "restart_backoff_s", "restart_max_backoff_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    "--" + name.replace("_", "-"), getattr(self, name), "a positive number of seconds"
                )
        if self.kvstore and self.kvstore_address:
            raise ConfigError(
                "--kvstore", True, "either --kvstore (start one) or --kvstore-address (use one), not both"
            )

    @property
    def uses_kvstore(self) -> bool:
        return self.kvstore or self.kvstore_address is not None

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(
            backoff_s=self.restart_backoff_s,
            max_backoff_s=self.restart_max_backoff_s,
            max_restarts=self.restart_limit,
            window_s=self.restart_window_s,
        )

    @property
    def log_dir(self) -> Path:
        return self.cache_dir / "logs"


def usable_cores() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))
