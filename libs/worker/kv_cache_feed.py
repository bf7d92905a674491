"""The engine's prefix cache for gateways (Worker.WatchKvCache): the blocks it holds now, then
each change its KV events report.

The engine publishes from wherever its events arrive (vLLM's: a thread reading its ZMQ
publisher, vllm_kv_events.py; the mock's: its output handler); each watcher is a gateway's
stream on the worker's event loop. A watcher that falls behind by more than `max_pending`
messages is not dropped and does not hold the engine up: its backlog is replaced by one
snapshot, which says the same thing in one message.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Sequence

from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate
from libs.kvevents.hashing import BlockHasher

MAX_PENDING = 1024


class KvCacheFeed:
    def __init__(self, hasher: BlockHasher, max_pending: int = MAX_PENDING) -> None:
        self.hasher = hasher  # how the engine names its blocks (WorkerInfo.kv_cache_events)
        self._max_pending = max_pending
        self._blocks = CachedBlocks()
        self._watchers: set[_Watcher] = set()
        self._lock = threading.Lock()  # publish() may run on the engine's event thread

    def publish(self, updates: Sequence[KvCacheUpdate]) -> None:
        """The engine's changes, in its order; from any thread."""
        if not updates:
            return
        with self._lock:
            for update in updates:
                self._blocks.apply(update)
            for watcher in self._watchers:
                watcher.loop.call_soon_threadsafe(watcher.push, tuple(updates))

    def lost(self) -> None:
        """Events were lost (a gap in the engine's sequence numbers): what the engine holds is
        no longer known, so it is said to hold nothing until new events say otherwise. Routing
        then underrates this worker's cache for a while, and never overrates it."""
        self.publish([KvCacheUpdate(cleared=True)])

    def block_count(self) -> int:
        return len(self._blocks)

    async def watch(self) -> AsyncGenerator[tuple[KvCacheUpdate, ...], None]:
        """A snapshot first, then each published batch of updates."""
        watcher = _Watcher(asyncio.get_running_loop(), self._max_pending)
        with self._lock:
            snapshot = self._blocks.snapshot()
            self._watchers.add(watcher)
        try:
            yield (snapshot,)
            while True:
                updates = await watcher.next()
                if updates is None:  # fell behind: its backlog is dropped
                    with self._lock:
                        updates = (self._blocks.snapshot(),)
                        watcher.resume()
                yield updates
        finally:
            with self._lock:
                self._watchers.discard(watcher)


class _Watcher:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int) -> None:
        self.loop = loop
        self._max_pending = max_pending
        self._pending: list[tuple[KvCacheUpdate, ...]] = []
        self._behind = False
        self._ready = asyncio.Event()

    def push(self, updates: tuple[KvCacheUpdate, ...]) -> None:
        if not self._behind:
            self._pending.append(updates)
            if len(self._pending) > self._max_pending:
                self._behind = True
                self._pending.clear()
        self._ready.set()

    def resume(self) -> None:
        """A snapshot taken under the feed's lock replaces everything pushed before it; what
        is pushed after it (on this loop, after the lock) follows it."""
        self._behind = False
        self._pending.clear()

    async def next(self) -> tuple[KvCacheUpdate, ...] | None:
        """The next batch, or None once this watcher fell behind."""
        while not self._pending and not self._behind:
            self._ready.clear()
            await self._ready.wait()
        if self._behind:
            return None
        return self._pending.pop(0)
