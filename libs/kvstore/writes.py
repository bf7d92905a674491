"""The kvstore's write path: a staged chunk handed to every tier that lacks it (write-through,
as LMCache's StorageManager does), then waited for, so that a Put answers once every usable
tier holds its chunks (or after `write_timeout_s`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import structlog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj

from libs.kvstore.metrics import KvStoreMetrics, Tier
from libs.kvstore.remote import RemoteUnavailable
from libs.kvstore.tiers import Tiers

log = structlog.get_logger(__name__)


@dataclass
class PendingWrite:
    tier: Tier
    key: CacheEngineKey
    nbytes: int
    event: Any = None  # threading.Event for disk
    future: Future[Any] | None = None  # for Redis


class TierWriter:
    def __init__(
        self, tiers: Tiers, metrics: KvStoreMetrics, write_timeout_s: float, clock: Callable[[], float]
    ) -> None:
        self._tiers = tiers
        self._metrics = metrics
        self._write_timeout_s = write_timeout_s
        self._clock = clock

    def remote_lacks(self, key: CacheEngineKey) -> bool:
        """Whether a usable Redis lacks `key` (an unusable one is skipped: no write to it)."""
        remote = self._tiers.remote
        if remote is None or not remote.usable():
            return False
        try:
            return not remote.contains(key)
        except RemoteUnavailable:
            return False

    def write(
        self,
        key: CacheEngineKey,
        obj: MemoryObj,
        nbytes: int,
        *,
        to_cpu: bool,
        to_disk: bool,
        to_remote: bool,
    ) -> list[PendingWrite]:
        """Hands `obj` to the tiers named; the CPU tier holds it at once, the others' writes
        are returned to wait for."""
        tiers = self._tiers
        pending: list[PendingWrite] = []
        if to_cpu:
            tiers.cpu.submit_put_task(key, obj)
            self._metrics.stored(Tier.CPU, nbytes)
        if to_disk and tiers.disk is not None:
            event = tiers.disk.write(key, obj)
            if event is not None:
                pending.append(PendingWrite(Tier.DISK, key, nbytes, event=event))
        if to_remote and tiers.remote is not None:
            pending.append(PendingWrite(Tier.REMOTE, key, nbytes, future=tiers.remote.write(key, obj)))
        return pending

    def wait(self, pending: list[PendingWrite]) -> None:
        """Waits for the writes until `write_timeout_s`; each confirmed one is counted stored,
        each other one logged."""
        deadline = self._clock() + self._write_timeout_s
        for write in pending:
            remaining = max(0.0, deadline - self._clock())
            if write.event is not None:
                ok = write.event.wait(remaining) or (
                    self._tiers.disk is not None and self._tiers.disk.contains(write.key)
                )
            else:
                assert write.future is not None
                try:
                    write.future.result(remaining)
                    ok = True
                except FutureTimeout:
                    ok = False
                except Exception:
                    ok = False  # RemoteTier marked Redis down and counted the error
            if ok:
                self._metrics.stored(write.tier, write.nbytes)
            else:
                log.warning(
                    "chunk not confirmed by a tier in time", tier=write.tier.value, key=write.key.to_string()
                )
