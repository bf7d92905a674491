"""vLLM's KV cache events into the worker's KvCacheFeed.

vLLM publishes them from its engine core on a ZMQ PUB socket (`--kv-events-config`, publisher
"zmq"): each message is (topic, sequence number, a msgpack KVEventBatch). The worker has its
engine publish on an ipc socket of its own and reads it on a thread, so gateways learn what
each engine caches over the worker's gRPC port (Worker.WatchKvCache) and no other port is
opened. A gap in the sequence numbers (the PUB socket drops what a slow reader misses) makes
the feed forget the engine's blocks instead of keeping a stale set.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import msgspec
import structlog
import zmq
from vllm.distributed.kv_events import KVEventBatch

from libs.kvevents.cached_blocks import updates_from_events
from libs.kvevents.hashing import BlockHasher, none_hash_seed
from libs.worker.kv_cache_feed import KvCacheFeed

log = structlog.get_logger(__name__)


def events_config(endpoint: str) -> dict[str, Any]:
    """vLLM's KVEventsConfig for a publisher the worker reads at `endpoint`."""
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}


PRIVATE_PREFIX = "cleave-kv-events-"


def private_endpoint() -> str:
    """An ipc socket in a directory of its own (mode 0700): only this worker's user reaches it."""
    return f"ipc://{tempfile.mkdtemp(prefix=PRIVATE_PREFIX)}/events"


def block_hasher(cache_config: Any) -> BlockHasher | None:
    """How the engine hashes its blocks (its engine-core process inherits this environment), or
    None when nobody outside it can (xxhash with a random seed)."""
    algo = str(cache_config.prefix_caching_hash_algo)
    seed = none_hash_seed(algo, os.environ)
    if seed is None or not cache_config.enable_prefix_caching:
        return None
    return BlockHasher(int(cache_config.block_size), algo, seed)


class EventReader:
    """Reads the engine's event socket on a daemon thread until closed."""

    def __init__(self, endpoint: str, feed: KvCacheFeed) -> None:
        self.feed = feed
        self._endpoint = endpoint
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        # The engine has bound its socket and published nothing yet (no request has run).
        self._socket.connect(endpoint)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        expected: int | None = None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._closed.is_set():
            if not poller.poll(timeout=200):
                continue
            _topic, seq_bytes, payload = self._socket.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if expected is not None and seq != expected:
                log.warning(
                    "kv events lost; the gateways' view of this cache restarts", expected=expected, got=seq
                )
                self.feed.lost()
            expected = seq + 1
            try:
                batch = self._decoder.decode(payload)
            except msgspec.DecodeError as error:
                log.warning("undecodable kv event batch; the gateways' view restarts", error=str(error))
                self.feed.lost()
                continue
            self.feed.publish(updates_from_events(batch.events))
        self._socket.close(linger=0)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=1.0)
        folder = Path(self._endpoint.removeprefix("ipc://")).parent
        if self._endpoint.startswith("ipc://") and folder.name.startswith(PRIVATE_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)  # private_endpoint's, with the socket file
