"""The worker's view of its engine's prefix cache for gateways (Worker.WatchKvCache)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate
from libs.kvevents.hashing import BlockHasher
from libs.worker.kv_cache_feed import KvCacheFeed

pytestmark = pytest.mark.anyio


def replay(batches: list[tuple[KvCacheUpdate, ...]]) -> CachedBlocks:
    blocks = CachedBlocks()
    for batch in batches:
        for update in batch:
            blocks.apply(update)
    return blocks


async def take(watch, count: int) -> list[tuple[KvCacheUpdate, ...]]:  # type: ignore[no-untyped-def]
    return [await asyncio.wait_for(anext(watch), 5) for _ in range(count)]


async def test_a_watcher_gets_what_is_cached_then_each_change() -> None:
    feed = KvCacheFeed(BlockHasher(16))
    feed.publish([KvCacheUpdate(stored=(1, 2))])
    watch = feed.watch()
    [snapshot] = await take(watch, 1)
    assert snapshot[0].cleared and sorted(snapshot[0].stored) == [1, 2]
    feed.publish([KvCacheUpdate(removed=(1,)), KvCacheUpdate(stored=(3,))])
    [changes] = await take(watch, 1)
    assert changes == (KvCacheUpdate(removed=(1,)), KvCacheUpdate(stored=(3,)))
    seen = replay([snapshot, changes])
    assert (1 in seen, 2 in seen, 3 in seen) == (False, True, True)
    await watch.aclose()


async def test_events_published_on_another_thread_arrive_in_order() -> None:
    feed = KvCacheFeed(BlockHasher(16))
    watch = feed.watch()
    await take(watch, 1)

    def engine_thread() -> None:
        for key in range(50):
            feed.publish([KvCacheUpdate(stored=(key,))])
        feed.publish([KvCacheUpdate(removed=tuple(range(0, 50, 2)))])

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    batches = await take(watch, 51)
    assert [b[0].stored for b in batches[:50]] == [(k,) for k in range(50)]
    seen = replay(batches)
    assert len(seen) == 25 and all(k in seen for k in range(1, 50, 2))
    await watch.aclose()


async def test_a_watcher_that_falls_behind_gets_one_snapshot_instead_of_its_backlog() -> None:
    feed = KvCacheFeed(BlockHasher(16), max_pending=4)
    watch = feed.watch()
    await take(watch, 1)
    for key in range(10):  # nobody reads meanwhile
        feed.publish([KvCacheUpdate(stored=(key,))])
    await asyncio.sleep(0)  # the pushes run on this loop
    [snapshot] = await take(watch, 1)
    assert snapshot[0].cleared and set(snapshot[0].stored) == set(range(10))
    feed.publish([KvCacheUpdate(stored=(99,))])
    [after] = await take(watch, 1)
    assert after == (KvCacheUpdate(stored=(99,)),)
    await watch.aclose()


async def test_lost_events_clear_the_view_instead_of_keeping_it_stale() -> None:
    feed = KvCacheFeed(BlockHasher(16))
    feed.publish([KvCacheUpdate(stored=(1, 2))])
    feed.lost()
    assert feed.block_count() == 0
