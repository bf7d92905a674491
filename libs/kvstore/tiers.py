"""Builds LMCache's storage backends for the kvstore, and takes them down again.

LMCache's StorageManager is not used: it creates the backends itself from a config (so the
subclasses in local_tiers.py could not be slotted in), and its orchestration (write to
every backend; read in tier order, copying disk and remote hits into CPU memory) is the
few lines of libs/kvstore/store.py that also need per-tier accounting and checksums.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.pin_monitor import PinMonitor

from libs.kvstore.config import KvStoreConfig
from libs.kvstore.keys import BLOB_DTYPE
from libs.kvstore.local_tiers import CpuTier, DiskTier
from libs.kvstore.metrics import KvStoreMetrics, Tier
from libs.kvstore.remote import RemoteTier, with_password, with_timeouts

log = structlog.get_logger(__name__)

GIB = 1024**3
# Each LMCache component gets a logger named after its module; they print INFO on their own
# handlers unless routed (route_lmcache_logs).
LMCACHE_LOGGER_PREFIX = "lmcache"


def lmcache_config(config: KvStoreConfig) -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_defaults(
        chunk_size=config.chunk_tokens,
        local_cpu=True,
        # LMCache sizes tiers in GiB (floats); it allocates int(size * 2**30) bytes.
        max_local_cpu_size=config.cpu_bytes / GIB,
        local_disk=str(config.disk_dir) if config.disk_dir is not None else None,
        max_local_disk_size=config.disk_bytes / GIB if config.disk_dir is not None else 0.0,
        remote_url=(
            with_timeouts(
                with_password(config.redis_url, config.redis_password_file), config.remote_timeout_s
            )
            if config.redis_url
            else None
        ),
        remote_serde="naive",
        save_unfull_chunk=True,
        blocking_timeout_secs=max(1, math.ceil(config.remote_timeout_s)),
    )


def lmcache_metadata(config: KvStoreConfig) -> LMCacheMetadata:
    # One process-wide "model": blobs are opaque bytes to LMCache, and the real model and
    # layout live in every key (keys.py). kv_shape only sizes LMCache's remote metadata.
    return LMCacheMetadata(
        model_name="cleave-kvstore",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=BLOB_DTYPE,
        kv_shape=(1, 1, config.chunk_tokens, 1, 1),
        chunk_size=config.chunk_tokens,
    )


# Warns on every allocation that has to evict first: the steady state of a full cache.
QUIET_LMCACHE_LOGGERS = ("lmcache.v1.memory_management",)


def route_lmcache_logs(level: int = logging.WARNING) -> None:
    """LMCache's loggers print coloured lines on handlers of their own; send them through
    the root logger (structlog's formatter) instead, at `level` and above."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.split(".")[0] == LMCACHE_LOGGER_PREFIX and isinstance(logger, logging.Logger):
            logger.handlers.clear()
            logger.propagate = True
            logger.setLevel(max(level, logging.ERROR) if name in QUIET_LMCACHE_LOGGERS else level)


@dataclass
class Tiers:
    cpu: CpuTier
    disk: DiskTier | None
    remote: RemoteTier | None
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @classmethod
    def open(cls, config: KvStoreConfig, metrics: KvStoreMetrics, clock: Callable[[], float]) -> Tiers:
        lm_config = lmcache_config(config)
        metadata = lmcache_metadata(config)
        # MemoryObj.pin() reports to the PinMonitor singleton, which must exist first.
        PinMonitor.GetOrCreate(lm_config)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="kvstore-lmcache-loop", daemon=True)
        thread.start()
        cpu = CpuTier(lm_config, metadata, on_evict=lambda: metrics.evicted(Tier.CPU))
        disk = None
        if config.disk_dir is not None:
            disk = DiskTier(
                lm_config,
                loop,
                cpu,
                metadata,
                on_evict=lambda: metrics.evicted(Tier.DISK),
                align_bytes=cpu.memory_allocator.align_bytes,
            )
            adopted = disk.adopt_files()
            log.info("disk tier ready", path=disk.path, adopted_chunks=adopted)
        remote = None
        if config.redis_url is not None:
            remote = RemoteTier(
                lm_config,
                metadata,
                loop,
                cpu,
                timeout_s=config.remote_timeout_s,
                max_blob_bytes=config.max_chunk_bytes,
                probe_interval_s=config.remote_probe_interval_s,
                on_error=metrics.remote_error,
                on_available=lambda up: metrics.available.labels(Tier.REMOTE.value).set(int(up)),
                clock=clock,
            )
            remote.usable()  # logs now whether Redis answers
        return cls(cpu, disk, remote, loop, thread)

    def close(self, timeout_s: float) -> None:
        """Closes every backend; each step is bounded so a stuck one cannot hang shutdown."""
        steps: list[tuple[str, Callable[[], None]]] = []
        if self.remote is not None:
            steps.append(("remote", self.remote.close))
        if self.disk is not None:
            steps.append(("disk", self.disk.close))
        steps.append(("cpu", self.cpu.close))
        for name, step in steps:
            worker = threading.Thread(target=step, name=f"kvstore-close-{name}", daemon=True)
            worker.start()
            worker.join(timeout_s)
            if worker.is_alive():
                log.warning("closing a tier timed out; leaving it", tier=name, timeout_s=timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.loop.close()
