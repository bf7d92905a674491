"""The CPU-memory and local-disk tiers: LMCache's LocalCPUBackend and LocalDiskBackend,
with the few things Cleave needs that LMCache 0.5.6 does not do.

Used from LMCache as is: the CPU allocator (one pool of `cpu_bytes`, 4 KiB-aligned
allocations), LRU eviction on allocation, the disk writer threads, LRU eviction within
`disk_bytes`, and the file layout (one file per key, named by CacheEngineKey.to_string()).

Gaps filled here:
* Eviction counts: LMCache evicts inside allocate()/submit_put_task() and reports nothing
  per tier; `remove(force=False)` is its eviction path, so the subclasses count those calls.
* LRU on reads: LocalCPUBackend.get_blocking() does not refresh recency (LMCache refreshes
  it at lookup time, through keys_in_request); `touch()` does it for served chunks.
* Disk restart: LocalDiskBackend keeps its index in memory only, so a restarted process
  ignores the files its directory still holds. `adopt_files()` indexes them again (oldest
  first, within the byte bound); a file torn by a crash fails the blob crc on first read.
* Privacy: LMCache creates the directory and its files with the process umask (usually
  world-readable). KV is the prompt in another form, so the directory is created (or
  tightened) to 0700 and every chunk file is written 0600.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import torch
from lmcache.utils import CacheEngineKey, DiskCacheMetadata
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

from libs.kvstore.keys import BLOB_DTYPE, KEY_NAMESPACE

log = structlog.get_logger(__name__)

# LMCache's pinned pool only hands out memory for its KV formats; the format only decides
# which shape dimension get_num_tokens() reads, which nothing on our path calls. Blobs are
# 1-D uint8, so every tier (Redis metadata, disk index) records their exact length.
BLOB_FORMAT = MemoryFormat.KV_2TD
DISK_SUFFIX = ".pt"  # what LocalDiskBackend appends to key.to_string()
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_directory(path: str) -> None:
    """Creates `path` (and parents) if missing and makes it owner-only."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)


def blob_shape(nbytes: int) -> torch.Size:
    return torch.Size([nbytes])


class CpuTier(LocalCPUBackend):
    def __init__(self, config: Any, metadata: Any, on_evict: Callable[[], None]) -> None:
        super().__init__(config, metadata, dst_device="cpu")
        self._on_evict = on_evict

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        removed = bool(super().remove(key, force))
        if removed and not force:
            self._on_evict()
        return removed

    def stage(self, blob: bytes) -> MemoryObj | None:
        """A MemoryObj (ref count 1, owned by the caller) holding `blob`, evicting LRU
        entries for room; None when nothing evictable frees enough (never busy-waits)."""
        obj = self.allocate(blob_shape(len(blob)), BLOB_DTYPE, BLOB_FORMAT, eviction=True, busy_loop=False)
        if obj is not None:
            obj.byte_array.cast("B")[:] = blob
        return obj

    def read(self, key: CacheEngineKey) -> MemoryObj | None:
        """The stored entry with one more reference, which the caller owns."""
        obj: MemoryObj | None = self.get_blocking(key)
        return obj

    def touch(self, key: CacheEngineKey) -> None:
        with self.cpu_lock:
            if key in self.hot_cache:
                self.cache_policy.update_on_hit(key, self.hot_cache)

    def drop(self, key: CacheEngineKey) -> None:
        """Removes a bad entry."""
        self.remove(key, force=True)

    def held(self) -> tuple[int, int]:
        """(bytes, chunks) held, counting each chunk's aligned allocation."""
        with self.cpu_lock:
            return sum(int(obj.get_physical_size()) for obj in self.hot_cache.values()), len(self.hot_cache)


class DiskTier(LocalDiskBackend):
    def __init__(
        self,
        config: Any,
        loop: Any,
        cpu: CpuTier,
        metadata: Any,
        on_evict: Callable[[], None],
        align_bytes: int,
    ) -> None:
        private_directory(str(config.local_disk))  # before LMCache creates it with the umask
        super().__init__(config, loop, cpu, dst_device="cpu", metadata=metadata)
        self._on_evict = on_evict
        self._align_bytes = align_bytes

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        removed = bool(super().remove(key, force))
        if removed and not force:
            self._on_evict()
        return removed

    def write(self, key: CacheEngineKey, obj: MemoryObj) -> threading.Event | None:
        """Queues a write of `obj` under `key`; the event is set once the file is complete.
        None when LMCache did not queue it (already stored or being written, larger than
        the tier, or no evictable room)."""
        done = threading.Event()
        if self.contains(key) or self.exists_in_put_tasks(key):
            return None
        self.submit_put_task(key, obj, on_complete_callback=lambda _key: done.set())
        return done if self.exists_in_put_tasks(key) or self.contains(key) else None

    def write_file(self, buffer: Any, path: str) -> None:
        """LMCache's writer (a plain open(), umask permissions), owner-only. Called on
        LMCache's disk threads; O_DIRECT is never configured here."""
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as file:
            os.fchmod(fd, FILE_MODE)  # a file left by an older process keeps its mode otherwise
            file.write(buffer)

    def read(self, key: CacheEngineKey) -> MemoryObj | None:
        """The stored blob, staged in CPU memory (the caller owns one reference)."""
        try:
            return self.get_blocking(key)
        except (KeyError, OSError) as error:
            # LMCache's read path raises KeyError when the file vanished under it.
            log.warning("disk tier read failed", key=key.to_string(), error=str(error))
            return None

    def drop(self, key: CacheEngineKey) -> None:
        with self.disk_lock:
            meta = self.dict.get(key)
            if meta is None:
                return
            # Keep the budget honest: LMCache subtracts sizes only on eviction.
            self.current_cache_size -= meta.size
        self.remove(key, force=True)

    def held(self) -> tuple[int, int]:
        with self.disk_lock:
            return int(self.current_cache_size), len(self.dict)

    def adopt_files(self) -> int:
        """Indexes the chunk files a previous process left in the directory, oldest first,
        as long as they fit the byte bound; deletes the ones that do not. Returns how many
        were adopted."""
        directory = Path(self.path)
        found: list[tuple[float, Path, CacheEngineKey, int]] = []
        for entry in os.scandir(directory):
            name = entry.name
            if not (name.startswith(KEY_NAMESPACE) and name.endswith(DISK_SUFFIX) and entry.is_file()):
                continue
            try:
                key = CacheEngineKey.from_string(name[: -len(DISK_SUFFIX)])
                stat = entry.stat()
            except (ValueError, KeyError, OSError):
                continue
            found.append((stat.st_mtime, Path(entry.path), key, stat.st_size))
        found.sort(key=lambda item: item[0], reverse=True)  # newest first: they are kept
        adopted: list[tuple[Path, CacheEngineKey, int]] = []
        budget = self.max_cache_size
        for _mtime, path, key, size in found:
            physical = -(-size // self._align_bytes) * self._align_bytes
            if physical <= budget:
                budget -= physical
                adopted.append((path, key, size))
                with contextlib.suppress(OSError):  # not ours to change: still readable
                    path.chmod(FILE_MODE)
            else:
                path.unlink(missing_ok=True)
        with self.disk_lock:
            for path, key, size in reversed(adopted):  # oldest first = least recently used
                physical = -(-size // self._align_bytes) * self._align_bytes
                self.dict[key] = DiskCacheMetadata(
                    str(path), physical, blob_shape(size), BLOB_DTYPE, None, BLOB_FORMAT, 0
                )
                self.current_cache_size += physical
                self.usage += physical
        return len(adopted)
