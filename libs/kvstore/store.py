"""The kvstore: KV chunks in CPU memory -> local disk -> Redis, found by prefix.

Writes go to every tier (write-through, as LMCache's StorageManager does), so a chunk
survives eviction from memory, a process restart (disk, Redis) and the loss of the machine
(Redis). A Put answers once every tier that was usable holds the chunk (or after
`write_timeout_s`). Reads try the tiers in order and copy disk and Redis hits back into the
faster tiers. Every read is checked (blob crc, key, layout) and a bad copy is dropped, never
served. A Redis that fails is skipped until a probe finds it back: callers only see fewer
hits, never an error.

This is the store's face: chunk checks and keys, lookup, stats; the read path (checks of
every copy read, promotion) is reads.py, the tiers' writes and their confirmation writes.py.
All methods block (LMCache's backends do) and are safe to call from several threads; the
gRPC service runs them in worker threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import prometheus_client
import structlog
from prometheus_client import CollectorRegistry

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvstore.auth import ChunkSealer
from libs.kvstore.chunks import ChunkRejected, RejectReason, check_chunk, encode_blob
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.identity import InvalidKey, layout_fingerprint
from libs.kvstore.keys import ChunkKeyer, engine_key
from libs.kvstore.metrics import KvStoreMetrics, Tier, TierCounts
from libs.kvstore.reads import Fetched, TierReader
from libs.kvstore.remote import RemoteUnavailable
from libs.kvstore.tiers import Tiers
from libs.kvstore.writes import PendingWrite, TierWriter

log = structlog.get_logger(__name__)

CLOSE_STEP_TIMEOUT_S = 10.0


class PutOutcome(StrEnum):
    STORED = "stored"
    EXISTS = "exists"  # every usable tier already held it
    REJECTED = "rejected"


@dataclass(frozen=True)
class LookupResult:
    matched_tokens: int
    # The stored leading chunks and the fastest tier holding each.
    located: list[tuple[kvstore_pb2.ChunkKey, Tier]]
    # Keys of every chunk of the prompt.
    keys: list[kvstore_pb2.ChunkKey]


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
    chunks_rejected: int


class KvStore:
    def __init__(
        self,
        config: KvStoreConfig,
        *,
        registry: CollectorRegistry | None = prometheus_client.REGISTRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._metrics = KvStoreMetrics(registry)
        self._keyer = ChunkKeyer(config.chunk_tokens)
        self._sealer = (
            ChunkSealer.from_file(config.kv_auth_key_file) if config.kv_auth_key_file is not None else None
        )
        self._tiers = Tiers.open(config, self._metrics, clock)
        self._reader = TierReader(self._tiers, self._metrics, self._sealer, self._reject)
        self._writer = TierWriter(self._tiers, self._metrics, config.write_timeout_s, clock)
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

    # --- keys ---------------------------------------------------------------------------

    def fingerprint(self, layout: common_pb2.KvLayout) -> str:
        return layout_fingerprint(layout, self.config.chunk_tokens)

    def chunk_keys(
        self,
        token_ids: Sequence[int],
        layout: common_pb2.KvLayout,
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> list[kvstore_pb2.ChunkKey]:
        return self._keyer.keys(token_ids, self.fingerprint(layout), cache_salt, lora)

    # --- put ----------------------------------------------------------------------------

    def put(self, layout: common_pb2.KvLayout, chunks: Sequence[kvstore_pb2.KvChunk]) -> list[PutOutcome]:
        """Stores chunks of `layout`; a bad chunk is rejected (counted, logged), never stored."""
        try:
            fingerprint = self.fingerprint(layout)
        except InvalidKey as error:
            for chunk in chunks:
                self._reject(ChunkRejected(RejectReason.LAYOUT, f"bad layout: {error}"), chunk.key, "put")
            return [PutOutcome.REJECTED] * len(chunks)
        outcomes: list[PutOutcome] = []
        pending: list[PendingWrite] = []
        for chunk in chunks:
            try:
                outcome, writes = self._put_one(chunk, layout, fingerprint)
            except ChunkRejected as rejection:
                self._reject(rejection, chunk.key, "put")
                outcome, writes = PutOutcome.REJECTED, []
            outcomes.append(outcome)
            pending.extend(writes)
        self._writer.wait(pending)
        return outcomes

    def _put_one(
        self, chunk: kvstore_pb2.KvChunk, layout: common_pb2.KvLayout, fingerprint: str
    ) -> tuple[PutOutcome, list[PendingWrite]]:
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
        to_remote = self._writer.remote_lacks(key)
        if not (to_cpu or to_disk or to_remote):
            return PutOutcome.EXISTS, []
        obj = tiers.cpu.stage(blob)
        if obj is None:
            raise ChunkRejected(RejectReason.NO_MEMORY, "no evictable room in the CPU tier")
        try:
            writes = self._writer.write(
                key, obj, len(blob), to_cpu=to_cpu, to_disk=to_disk, to_remote=to_remote
            )
            return PutOutcome.STORED, writes
        finally:
            obj.ref_count_down()  # the tiers took their own references

    # --- get ----------------------------------------------------------------------------

    def get(self, key: kvstore_pb2.ChunkKey) -> Fetched | None:
        """The chunk from the fastest tier holding a good copy, or None. Raises InvalidKey."""
        return self._reader.get(key)

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self,
        token_ids: Sequence[int],
        layout: common_pb2.KvLayout,
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> LookupResult:
        """How many leading tokens are stored under `cache_salt` and `lora`, and where. Raises
        InvalidKey."""
        keys = self.chunk_keys(token_ids, layout, cache_salt, lora)
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

    # --- stats and lifecycle ------------------------------------------------------------

    def stats(self) -> StoreStats:
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
        return StoreStats(statuses, self._metrics.rejected_total)

    def close(self) -> None:
        """Lets queued disk writes finish, closes every tier (bounded)."""
        if self._closed:
            return
        self._closed = True
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
