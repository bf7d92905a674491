"""The kvstore's read path: a chunk from the fastest tier holding a good copy. Every copy read
is checked (blob crc, key, layout; the HMAC tag of copies from disk and Redis) and a bad one is
dropped, never served. Disk and Redis hits are kept in the faster tiers that lack them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.auth import ChunkSealer
from libs.kvstore.chunks import ChunkRejected, RejectReason, decode_blob
from libs.kvstore.keys import engine_key
from libs.kvstore.metrics import KvStoreMetrics, Tier
from libs.kvstore.remote import RemoteUnavailable, UnreadableEntry
from libs.kvstore.tiers import Tiers

# How a rejected chunk is counted and logged: (rejection, its key, where it was read).
Reject = Callable[[ChunkRejected, kvstore_pb2.ChunkKey, str], None]


@dataclass(frozen=True)
class Fetched:
    chunk: kvstore_pb2.KvChunk
    tier: Tier


class TierReader:
    def __init__(
        self, tiers: Tiers, metrics: KvStoreMetrics, sealer: ChunkSealer | None, reject: Reject
    ) -> None:
        self._tiers = tiers
        self._metrics = metrics
        self._sealer = sealer
        self._reject = reject

    def get(self, key: kvstore_pb2.ChunkKey) -> Fetched | None:
        """The chunk from the fastest tier holding a good copy, or None. Raises InvalidKey."""
        stored_key = engine_key(key)
        tiers = self._tiers
        held = tiers.cpu.read(stored_key)
        if held is not None:
            try:
                chunk = self._accept(
                    bytes(held.byte_array), key, Tier.CPU, lambda: tiers.cpu.drop(stored_key)
                )
            finally:
                held.ref_count_down()
            if chunk is not None:
                tiers.cpu.touch(stored_key)
                return Fetched(chunk, Tier.CPU)
        else:
            self._metrics.miss(Tier.CPU)
        disk = tiers.disk
        if disk is not None:
            obj = disk.read(stored_key)
            if obj is None:
                self._metrics.miss(Tier.DISK)
            else:
                chunk = self._accept_staged(obj, key, stored_key, Tier.DISK, lambda: disk.drop(stored_key))
                if chunk is not None:
                    return Fetched(chunk, Tier.DISK)
        remote = tiers.remote
        if remote is not None and remote.usable():
            try:
                obj = remote.read(stored_key)
            except RemoteUnavailable:
                obj = None
            except UnreadableEntry as error:
                # Not Redis' fault: one foreign or garbled value. Drop it; the tier stays up.
                self._reject(ChunkRejected(RejectReason.MALFORMED, str(error)), key, "read from remote")
                self._metrics.dropped(Tier.REMOTE, RejectReason.MALFORMED.value)
                remote.delete(stored_key)
                obj = None
            if obj is None:
                self._metrics.miss(Tier.REMOTE)
            else:
                chunk = self._accept_staged(
                    obj, key, stored_key, Tier.REMOTE, lambda: remote.delete(stored_key)
                )
                if chunk is not None:
                    return Fetched(chunk, Tier.REMOTE)
        return None

    def _accept(
        self, blob: bytes, key: kvstore_pb2.ChunkKey, tier: Tier, drop: Callable[[], None]
    ) -> kvstore_pb2.KvChunk | None:
        try:
            # Copies in CPU memory were checked on their way in (put or promotion).
            chunk = decode_blob(blob, key, self._sealer, authenticate=tier is not Tier.CPU)
        except ChunkRejected as rejection:
            self._reject(rejection, key, f"read from {tier.value}")
            self._metrics.dropped(tier, rejection.reason.value)
            self._metrics.miss(tier)
            drop()
            return None
        self._metrics.hit(tier, len(blob))
        return chunk

    def _accept_staged(
        self,
        obj: MemoryObj,
        key: kvstore_pb2.ChunkKey,
        stored_key: CacheEngineKey,
        tier: Tier,
        drop: Callable[[], None],
    ) -> kvstore_pb2.KvChunk | None:
        """Checks a chunk LMCache staged in CPU memory and, if good, keeps that copy in the
        faster tiers that lack it (no extra copy: the tiers share the MemoryObj)."""
        try:
            chunk = self._accept(bytes(obj.byte_array), key, tier, drop)
            if chunk is None:
                return None
            nbytes = int(obj.get_size())
            tiers = self._tiers
            if not tiers.cpu.contains(stored_key):
                tiers.cpu.submit_put_task(stored_key, obj)
                self._metrics.stored(Tier.CPU, nbytes)
            if (
                tier is Tier.REMOTE
                and tiers.disk is not None
                and tiers.disk.write(stored_key, obj) is not None
            ):
                self._metrics.stored(Tier.DISK, nbytes)
            return chunk
        finally:
            obj.ref_count_down()
