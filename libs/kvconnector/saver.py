"""Sends saved chunks to the kvstore on a background thread, off the request's path.

The forward step only copies a chunk out of the paged cache (the blocks may be reused right
after); encoding, checksumming and the Put RPC happen here. The queue is bounded: when the
kvstore is slower than prefill, chunks are dropped (counted, logged) rather than buffered
without limit in engine memory.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

from cleave.kvstore.v1 import kvstore_pb2
from libs.kvconnector import paged
from libs.kvconnector.client import KvStoreClient
from libs.kvconnector.counters import CounterBox
from libs.kvstore.chunks import tensor_crc32c

log = logging.getLogger(__name__)

SaveItem = tuple[str, kvstore_pb2.ChunkKey, torch.Tensor]  # request id, key, dense chunk


class BackgroundSaver:
    def __init__(
        self,
        client_factory: Callable[[], KvStoreClient],
        counters: CounterBox,
        *,
        encode_mxint8: bool,
        max_queued_chunks: int = 64,
    ) -> None:
        self._client_factory = client_factory
        self._counters = counters
        self._encode_mxint8 = encode_mxint8
        self._queue: queue.Queue[list[SaveItem] | threading.Event | None] = queue.Queue()
        self._max_queued = max_queued_chunks
        self._queued = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cleave-kvstore-saver", daemon=True)
        self._thread.start()

    def submit(self, items: list[SaveItem]) -> None:
        with self._lock:
            if self._queued + len(items) > self._max_queued:
                self._counters.add(save_failures=len(items))
                log.warning("kvstore saver queue full; %d chunks not saved", len(items))
                return
            self._queued += len(items)
        self._queue.put(items)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every chunk submitted so far was sent or dropped (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        client: KvStoreClient | None = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            if client is None:
                client = self._client_factory()
            self._send(client, item)
            with self._lock:
                self._queued -= len(item)
        if client is not None:
            client.close()

    def _send(self, client: KvStoreClient, items: list[SaveItem]) -> None:
        chunks = []
        try:
            for _request_id, key, tensor in items:
                kv = paged.to_proto(tensor, encode_mxint8=self._encode_mxint8)
                chunks.append(kvstore_pb2.KvChunk(key=key, kv=kv, crc32c=tensor_crc32c(kv)))
            response = client.put(items[0][0], chunks)
        except Exception as error:  # anything: this thread must keep serving later saves
            self._counters.add(save_failures=len(items))
            log.warning("KV chunks not saved to the kvstore: %s", error)
            return
        if response.rejected:
            log.warning("kvstore rejected %d of %d chunks", response.rejected, len(chunks))
        self._counters.add(
            chunks_saved=response.stored + response.skipped_existing,
            save_failures=response.rejected,
            bytes_saved=sum(len(c.kv.data) + len(c.kv.mx_scales) for c in chunks),
        )
