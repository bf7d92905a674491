"""vLLM's KV event stream into the worker's feed: vLLM's own publisher (ZmqEventPublisher) on
an ipc socket, read by the worker's EventReader; a gap in the sequence numbers forgets the
blocks instead of keeping a stale set."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

from libs.kvevents.hashing import BlockHasher
from libs.worker.kv_cache_feed import KvCacheFeed
from libs.worker.vllm_kv_events import EventReader, block_hasher, private_endpoint


def stored(*hashes: int, medium: str = "GPU") -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=[],
        block_size=16,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_vllms_published_events_reach_the_feed_in_order() -> None:
    endpoint = private_endpoint()
    publisher = ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint)
    feed = KvCacheFeed(BlockHasher(16))
    reader = EventReader(endpoint, feed)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher (ZMQ's slow joiner)
        publisher.publish(KVEventBatch(ts=0.0, events=[stored(1, 2, 3), stored(9, medium="CPU")]))
        publisher.publish(KVEventBatch(ts=0.0, events=[BlockRemoved(block_hashes=[2], medium="GPU")]))
        until(lambda: feed.block_count() == 2)
        publisher.publish(KVEventBatch(ts=0.0, events=[AllBlocksCleared(), stored(4)]))
        until(lambda: feed.block_count() == 1)
    finally:
        reader.close()
        publisher.shutdown()
    assert not Path(endpoint.removeprefix("ipc://")).parent.exists()  # the private folder is gone


def test_a_gap_in_the_sequence_numbers_clears_the_feed(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/events"
    socket = zmq.Context.instance().socket(zmq.PUB)
    socket.bind(endpoint)
    feed = KvCacheFeed(BlockHasher(16))
    reader = EventReader(endpoint, feed)
    try:
        time.sleep(0.3)

        def send(seq: int, *hashes: int) -> None:
            # vLLM's wire format: topic, 8-byte sequence number, the msgpack batch.
            payload = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[stored(*hashes)]))
            socket.send_multipart((b"", seq.to_bytes(8, "big"), payload))

        send(0, 1, 2)
        until(lambda: feed.block_count() == 2)
        send(2, 3)  # batch 1 was lost: blocks 1 and 2 may be gone by now
        until(lambda: feed.block_count() == 1)
    finally:
        reader.close()
        socket.close(linger=0)


class CacheConfig:
    def __init__(self, algo: str, prefix_caching: bool = True) -> None:
        self.prefix_caching_hash_algo = algo
        self.enable_prefix_caching = prefix_caching
        self.block_size = 128


def test_only_reproducible_hashes_are_published(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert block_hasher(CacheConfig("sha256")) == BlockHasher(128, "sha256", "vllm-none-hash")
    assert block_hasher(CacheConfig("xxhash")) is None  # a random seed per engine process
    assert block_hasher(CacheConfig("sha256", prefix_caching=False)) is None
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert block_hasher(CacheConfig("sha256_cbor")) == BlockHasher(128, "sha256_cbor", "7")
