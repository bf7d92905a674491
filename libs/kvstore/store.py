"""The kvstore: KV chunks in CPU memory -> local disk -> Redis, found by prefix.

Writes go to every tier (write-through, as LMCache's StorageManager does), so a chunk
survives eviction from memory, a process restart (disk, Redis) and the loss of the machine
(Redis). A Put answers once every tier that was usable holds the chunk (or after
`write_timeout_s`). Reads try the tiers in order and copy disk and Redis hits back into the
faster tiers. Every read is checked (blob crc, key, layout) and a bad copy is dropped, never
served. A Redis that fails is skipped until a probe finds it back: callers only see fewer
hits, never an error.

All methods block (LMCache's backends do) and are safe to call from several threads; the
gRPC service runs them in worker threads.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import prometheus_client
import structlog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from prometheus_client import CollectorRegistry

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.auth import ChunkSealer
from libs.kvstore.chunks import ChunkRejected, RejectReason, check_chunk, decode_blob, encode_blob
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.identity import InvalidKey, layout_fingerprint
from libs.kvstore.keys import ChunkKeyer, engine_key
from libs.kvstore.leases import Lease, LeaseTable
from libs.kvstore.metrics import KvStoreMetrics, Tier, TierCounts
from libs.kvstore.remote import RemoteUnavailable, UnreadableEntry
from libs.kvstore.tiers import Tiers

log = structlog.get_logger(__name__)

CLOSE_STEP_TIMEOUT_S = 10.0


class PutOutcome(StrEnum):
    STORED = "stored"
    EXISTS = "exists"  # every usable tier already held it
    REJECTED = "rejected"


@dataclass(frozen=True)
class Fetched:
    chunk: kvstore_pb2.KvChunk
    tier: Tier


@dataclass(frozen=True)
class LookupResult:
    matched_tokens: int
    # The stored leading chunks and the fastest tier holding each.
    located: list[tuple[kvstore_pb2.ChunkKey, Tier]]
    # Keys of every chunk of the prompt.
    keys: list[kvstore_pb2.ChunkKey]


@dataclass(frozen=True)
class LeaseGrant:
    lease_id: str
    expires_unix_ms: int
    num_pinned: int


@dataclass(frozen=True)
class TierStatus:
    tier: Tier
    bytes_used: int
    bytes_capacity: int
    num_chunks: int
    counts: TierCounts
    available: bool


@dataclass(frozen=True)
class StoreStats:
    tiers: list[TierStatus]
    num_leases: int
    chunks_rejected: int


@dataclass
class _PendingWrite:
    tier: Tier
    key: CacheEngineKey
    nbytes: int
    event: Any = None  # threading.Event for disk
    future: Future[Any] | None = None  # for Redis


class KvStore:
    def __init__(
        self,
        config: KvStoreConfig,
        *,
        registry: CollectorRegistry | None = prometheus_client.REGISTRY,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._metrics = KvStoreMetrics(registry)
        self._keyer = ChunkKeyer(config.chunk_tokens)
        self._sealer = (
            ChunkSealer.from_file(config.kv_auth_key_file) if config.kv_auth_key_file is not None else None
        )
        self._leases = LeaseTable()
        self._tiers = Tiers.open(config, self._metrics, clock)
        self._closed = False
        metrics, tiers = self._metrics, self._tiers
        metrics.bytes_capacity.labels(Tier.CPU.value).set(config.cpu_bytes)
        metrics.available.labels(Tier.CPU.value).set(1)
        metrics.bytes_used.labels(Tier.CPU.value).set_function(lambda: tiers.cpu.held()[0])
        disk = tiers.disk
        if disk is not None:
            metrics.bytes_capacity.labels(Tier.DISK.value).set(config.disk_bytes)
            metrics.available.labels(Tier.DISK.value).set(1)
            metrics.bytes_used.labels(Tier.DISK.value).set_function(lambda: disk.held()[0])
        metrics.leases.set_function(lambda: len(self._leases))

    # --- keys ---------------------------------------------------------------------------

    def fingerprint(self, layout: common_pb2.KvLayout) -> str:
        return layout_fingerprint(layout, self.config.chunk_tokens)

    def chunk_keys(
        self, token_ids: Sequence[int], layout: common_pb2.KvLayout, cache_salt: str = ""
    ) -> list[kvstore_pb2.ChunkKey]:
        return self._keyer.keys(token_ids, self.fingerprint(layout), cache_salt)

    # --- put ----------------------------------------------------------------------------

    def put(self, layout: common_pb2.KvLayout, chunks: Sequence[kvstore_pb2.KvChunk]) -> list[PutOutcome]:
        """Stores chunks of `layout`; a bad chunk is rejected (counted, logged), never stored."""
        self.expire_leases()
        try:
            fingerprint = self.fingerprint(layout)
        except InvalidKey as error:
            for chunk in chunks:
                self._reject(ChunkRejected(RejectReason.LAYOUT, f"bad layout: {error}"), chunk.key, "put")
            return [PutOutcome.REJECTED] * len(chunks)
        outcomes: list[PutOutcome] = []
        pending: list[_PendingWrite] = []
        for chunk in chunks:
            try:
                outcome, writes = self._put_one(chunk, layout, fingerprint)
            except ChunkRejected as rejection:
                self._reject(rejection, chunk.key, "put")
                outcome, writes = PutOutcome.REJECTED, []
            outcomes.append(outcome)
            pending.extend(writes)
        self._wait(pending)
        return outcomes

    def _put_one(
        self, chunk: kvstore_pb2.KvChunk, layout: common_pb2.KvLayout, fingerprint: str
    ) -> tuple[PutOutcome, list[_PendingWrite]]:
        check_chunk(chunk, layout, fingerprint, self.config.chunk_tokens)
        key = engine_key(chunk.key)
        blob = encode_blob(chunk, self._sealer)
        if len(blob) > self.config.max_chunk_bytes:
            raise ChunkRejected(
                RejectReason.TOO_LARGE,
                f"{len(blob)} bytes; this store takes chunks up to {self.config.max_chunk_bytes} "
                f"({self.config.max_chunk_fraction:.0%} of --cpu-bytes)",
            )
        tiers = self._tiers
        to_cpu = not tiers.cpu.contains(key)
        to_disk = (
            tiers.disk is not None
            and not tiers.disk.contains(key)
            and not tiers.disk.exists_in_put_tasks(key)
        )
        to_remote = self._remote_lacks(key)
        if not (to_cpu or to_disk or to_remote):
            return PutOutcome.EXISTS, []
        obj = tiers.cpu.stage(blob)
        if obj is None:
            raise ChunkRejected(RejectReason.NO_MEMORY, "no evictable room in the CPU tier (leases pin it)")
        try:
            return PutOutcome.STORED, self._write(key, obj, len(blob), to_cpu, to_disk, to_remote)
        finally:
            obj.ref_count_down()  # the tiers took their own references

    def _write(
        self, key: CacheEngineKey, obj: MemoryObj, nbytes: int, to_cpu: bool, to_disk: bool, to_remote: bool
    ) -> list[_PendingWrite]:
        tiers = self._tiers
        pending: list[_PendingWrite] = []
        if to_cpu:
            tiers.cpu.submit_put_task(key, obj)
            self._metrics.stored(Tier.CPU, nbytes)
        if to_disk and tiers.disk is not None:
            event = tiers.disk.write(key, obj)
            if event is not None:
                pending.append(_PendingWrite(Tier.DISK, key, nbytes, event=event))
        if to_remote and tiers.remote is not None:
            pending.append(_PendingWrite(Tier.REMOTE, key, nbytes, future=tiers.remote.write(key, obj)))
        return pending

    def _remote_lacks(self, key: CacheEngineKey) -> bool:
        remote = self._tiers.remote
        if remote is None or not remote.usable():
            return False
        try:
            return not remote.contains(key)
        except RemoteUnavailable:
            return False

    def _wait(self, pending: list[_PendingWrite]) -> None:
        deadline = self._clock() + self.config.write_timeout_s
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

    # --- get ----------------------------------------------------------------------------

    def get(self, key: kvstore_pb2.ChunkKey) -> Fetched | None:
        """The chunk from the fastest tier holding a good copy, or None. Raises InvalidKey."""
        self.expire_leases()
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

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self, token_ids: Sequence[int], layout: common_pb2.KvLayout, cache_salt: str = ""
    ) -> LookupResult:
        """How many leading tokens are stored under `cache_salt`, and where. Raises InvalidKey."""
        self.expire_leases()
        keys = self.chunk_keys(token_ids, layout, cache_salt)
        remote = self._tiers.remote
        remote_ok = remote is not None and remote.usable()
        located: list[tuple[kvstore_pb2.ChunkKey, Tier]] = []
        for key in keys:
            stored_key = engine_key(key)
            tier: Tier | None = None
            if self._tiers.cpu.contains(stored_key):
                tier = Tier.CPU
            elif self._tiers.disk is not None and self._tiers.disk.contains(stored_key):
                tier = Tier.DISK
            elif remote_ok and remote is not None:
                try:
                    tier = Tier.REMOTE if remote.contains(stored_key) else None
                except RemoteUnavailable:
                    remote_ok = False
            if tier is None:
                break
            located.append((key, tier))
        matched = sum(key.num_tokens for key, _ in located)
        self._metrics.looked_up(matched, len(token_ids))
        return LookupResult(matched, located, keys)

    # --- leases -------------------------------------------------------------------------

    def lease(self, keys: Sequence[kvstore_pb2.ChunkKey], ttl_s: float | None = None) -> LeaseGrant:
        """Pins the keys' local copies until release() or the TTL. Raises InvalidKey.

        Pins in CPU memory stop at `max_pinned_fraction` of the tier (see KvStoreConfig);
        keys past that are pinned on disk only. Redis cannot pin: it evicts by its own policy.
        """
        self.expire_leases()
        stored_keys = [engine_key(key) for key in keys]
        if ttl_s is None or ttl_s <= 0:
            ttl_s = self.config.default_lease_s
        ttl_s = min(ttl_s, self.config.max_lease_s)
        tiers = self._tiers
        cpu_budget = self.config.max_pinned_cpu_bytes - self._leases.pinned_cpu_bytes()
        lease = Lease(
            lease_id=LeaseTable.new_id(),
            expires_at=self._clock() + ttl_s,
            expires_unix_ms=int((self._wall_clock() + ttl_s) * 1000),
            num_pinned=0,
            pinned_cpu_bytes=0,
        )
        for stored_key in stored_keys:
            pinned = False
            size = tiers.cpu.entry_size(stored_key)
            if size is not None and lease.pinned_cpu_bytes + size <= cpu_budget:
                obj = tiers.cpu.pin_entry(stored_key)
                if obj is not None:
                    lease.unpins.append(obj.unpin)
                    lease.pinned_cpu_bytes += int(obj.get_physical_size())
                    pinned = True
            disk = tiers.disk
            if disk is not None:
                meta = disk.pin_entry(stored_key)
                if meta is not None:
                    lease.unpins.append(functools.partial(disk.unpin_entry, meta))
                    pinned = True
            lease.num_pinned += pinned
        self._leases.add(lease)
        return LeaseGrant(lease.lease_id, lease.expires_unix_ms, lease.num_pinned)

    def release(self, lease_id: str) -> bool:
        lease = self._leases.pop(lease_id)
        if lease is None:
            return False
        lease.release()
        return True

    def expire_leases(self) -> int:
        expired = self._leases.pop_expired(self._clock())
        for lease in expired:
            lease.release()
            log.info("lease expired", lease_id=lease.lease_id, num_pinned=lease.num_pinned)
        return len(expired)

    # --- stats and lifecycle ------------------------------------------------------------

    def stats(self) -> StoreStats:
        self.expire_leases()
        tiers = self._tiers
        cpu_bytes, cpu_chunks = tiers.cpu.held()
        statuses = [
            TierStatus(
                Tier.CPU, cpu_bytes, self.config.cpu_bytes, cpu_chunks, self._metrics.counts(Tier.CPU), True
            )
        ]
        if tiers.disk is not None:
            disk_bytes, disk_chunks = tiers.disk.held()
            statuses.append(
                TierStatus(
                    Tier.DISK,
                    disk_bytes,
                    self.config.disk_bytes,
                    disk_chunks,
                    self._metrics.counts(Tier.DISK),
                    True,
                )
            )
        if tiers.remote is not None:
            statuses.append(
                TierStatus(Tier.REMOTE, 0, 0, 0, self._metrics.counts(Tier.REMOTE), tiers.remote.usable())
            )
        return StoreStats(statuses, len(self._leases), self._metrics.rejected_total)

    def close(self) -> None:
        """Releases leases, lets queued disk writes finish, closes every tier (bounded)."""
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.pop_all():
            lease.release()
        self._tiers.close(CLOSE_STEP_TIMEOUT_S)

    def __enter__(self) -> KvStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reject(self, rejection: ChunkRejected, key: kvstore_pb2.ChunkKey, where: str) -> None:
        self._metrics.rejected(rejection.reason.value)
        log.warning(
            "kv chunk rejected",
            where=where,
            reason=rejection.reason.value,
            detail=str(rejection),
            prefix_hash=key.prefix_hash[:16],
            chunk_index=key.chunk_index,
        )
