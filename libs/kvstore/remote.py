"""The remote tier: LMCache's RemoteBackend with its Redis connector, plus health tracking.

Used from LMCache as is: RemoteBackend (write path with reference counting and in-flight
de-duplication) and its RedisConnector (value + metadata keys per chunk, a bounded
connection pool, a priority queue on the event loop), reached through
InstrumentedRemoteConnector.

Gaps filled here:
* Errors vs misses: RemoteBackend.get_blocking() and contains() turn every Redis error into
  "not found" (a warning log). Reads here call Redis directly so that an error marks Redis
  down: then it is skipped (memory and disk keep serving) until a probe finds it back,
  instead of paying a timeout on every request.
* Bad entries vs a bad Redis: RedisConnector.get() decodes the metadata value and copies
  the value into a buffer sized by it, inside the same call that talks to Redis, so a
  garbled entry raised like a dead connection and took the tier offline again after every
  probe (and leaked the staging buffer). read() fetches both values in one MGET (only that
  can mark Redis down) and checks them here: an entry that does not decode raises
  UnreadableEntry, which the store answers by deleting it and counting it.
* Health: RedisConnector has no ping (support_ping() is False); the redis client it holds
  is pinged directly, at most every `probe_interval_s`.
* Timeouts: the URL gets socket timeouts unless it sets its own, so a Redis host that
  stops answering costs at most `timeout_s` per operation.
* Shutdown: RedisConnector.close() in LMCache 0.5.6 calls the blocking
  AsyncPQExecutor.shutdown() from a coroutine running on the executor's own event loop, so
  it waits for a coroutine that its thread can never run; RemoteBackend.close() (and an
  LMCache engine's shutdown, "Closing storage backend: RemoteBackend") hangs forever.
  close() here stops the executor with shutdown_async() and closes the client itself,
  under a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import structlog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

from libs.config.errors import ConfigError
from libs.kvstore.local_tiers import CpuTier

log = structlog.get_logger(__name__)
T = TypeVar("T")


def with_timeouts(url: str, timeout_s: float) -> str:
    """The URL with redis-py's socket timeouts added where it sets none."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("socket_timeout", str(timeout_s))
    query.setdefault("socket_connect_timeout", str(timeout_s))
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_password(url: str, password_file: Path | None) -> str:
    """The URL with the password of `password_file` (its first line) in it, for redis-py; the
    URL as given without one. Raises ConfigError naming the flag for an unusable file."""
    if password_file is None:
        return url
    try:
        lines = [line.strip() for line in password_file.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError("--redis-password-file", str(password_file), f"a readable file ({error})") from None
    if not lines:
        raise ConfigError(
            "--redis-password-file", str(password_file), "a file with a password on its first line"
        )
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(lines[0], safe='')}@{host}"))


class RemoteUnavailable(Exception):
    """Redis failed or is known to be down; callers treat the remote tier as empty."""


class UnreadableEntry(Exception):
    """Redis answered, but what it holds under a key is not a chunk this store wrote."""


class RemoteTier:
    def __init__(
        self,
        config: Any,
        metadata: Any,
        loop: asyncio.AbstractEventLoop,
        cpu: CpuTier,
        *,
        timeout_s: float,
        probe_interval_s: float,
        on_error: Callable[[str], None],
        on_available: Callable[[bool], None],
        max_blob_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._cpu = cpu
        self._max_blob_bytes = max_blob_bytes
        self.backend = RemoteBackend(config, metadata, loop, cpu, dst_device="cpu")
        if self.backend.connection is None:  # LMCache logged why
            raise RuntimeError("LMCache could not create a connector for the Redis URL (--redis-url)")
        self._connector = self.backend.connection  # InstrumentedRemoteConnector
        self._redis = self._connector.getWrappedConnector()  # RedisConnector
        self._timeout_s = timeout_s
        self._probe_interval_s = probe_interval_s
        self._on_error = on_error
        self._on_available = on_available
        self._clock = clock
        self._lock = threading.Lock()
        self._available = False
        self._next_probe = 0.0  # probe on first use

    # --- health -------------------------------------------------------------------------

    def usable(self) -> bool:
        """Whether to use Redis now; probes it when the last probe is old enough."""
        now = self._clock()
        with self._lock:
            due = now >= self._next_probe
            if due:
                self._next_probe = now + self._probe_interval_s
        if due:
            try:
                self._run(self._redis.connection.ping())
            except RemoteUnavailable:
                pass  # _run marked it down
            else:
                self._set_available(True)
        return self.available

    @property
    def available(self) -> bool:
        with self._lock:
            return self._available

    def _set_available(self, available: bool, error: BaseException | None = None) -> None:
        with self._lock:
            changed = self._available != available
            self._available = available
            if not available:
                self._next_probe = self._clock() + self._probe_interval_s
        if changed:
            if available:
                log.info("redis tier available")
            else:
                log.warning(
                    "redis tier unavailable; serving from memory and disk",
                    error=f"{type(error).__name__}: {error}",
                    retry_in_s=self._probe_interval_s,
                )
            self._on_available(available)

    def _failed(self, op: str, error: BaseException) -> None:
        self._on_error(op)
        self._set_available(False, error)

    def _run(self, coro: Coroutine[Any, Any, T], op: str = "ping") -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self._timeout_s)
        except Exception as error:  # redis errors, timeouts: all mean "Redis is not usable"
            future.cancel()
            self._failed(op, error)
            raise RemoteUnavailable(str(error)) from error

    # --- data ---------------------------------------------------------------------------

    def contains(self, key: CacheEngineKey) -> bool:
        return bool(self._run(self._connector.exists(key), "exists"))

    def read(self, key: CacheEngineKey) -> MemoryObj | None:
        """The stored blob staged in CPU memory (caller owns one reference); None if absent
        or if the CPU tier has no room to stage it. Raises RemoteUnavailable (Redis failed)
        or UnreadableEntry (the entry is not one of ours; the caller deletes it)."""
        name = key.to_string()
        metadata, blob = self._run(self._fetch(name), "get")
        if metadata is None:
            return None  # absent, or a put between its two SETs (the value is written first)
        if blob is None:
            # Redis evicted the value but not its metadata (LMCache's reader drops it too).
            self.delete(key)
            return None
        check_entry(metadata, blob, self._max_blob_bytes)
        obj: MemoryObj | None = self._cpu.stage(blob)
        return obj

    async def _fetch(self, name: str) -> tuple[bytes | None, bytes | None]:
        async with self._redis.sem:  # the connector's bound on concurrent connections
            values = await self._redis.connection.mget([name + "metadata", name + "kv_bytes"])
        return values[0], values[1]

    def write(self, key: CacheEngineKey, obj: MemoryObj) -> Future[Any]:
        """Starts a write; the future completes when Redis holds the chunk. A failure marks
        Redis down (the caller only waits)."""
        future: Future[Any] = self.backend.submit_put_task(key, obj)

        def done(f: Future[Any]) -> None:
            if not f.cancelled() and f.exception() is not None:
                self._failed("put", f.exception())  # type: ignore[arg-type]

        future.add_done_callback(done)
        return future

    def delete(self, key: CacheEngineKey) -> None:
        """Drops a bad chunk (best effort)."""
        name = key.to_string()
        with contextlib.suppress(RemoteUnavailable):
            self._run(self._redis.connection.delete(name + "kv_bytes", name + "metadata"), "delete")

    def close(self) -> None:
        async def close_connector() -> None:
            await self._redis.pq_executor.shutdown_async(wait=False)
            await self._redis.connection.aclose()
            await self._redis.pool.aclose()

        future = asyncio.run_coroutine_threadsafe(close_connector(), self._loop)
        try:
            future.result(self._timeout_s)
        except Exception as error:
            log.warning("closing the redis connection failed", error=str(error))


def check_entry(metadata: bytes, blob: bytes, max_blob_bytes: int) -> None:
    """Raises UnreadableEntry unless `metadata` is LMCache's RemoteMetadata for a blob of
    exactly len(blob) bytes, within the store's chunk bound."""
    if len(blob) > max_blob_bytes:
        raise UnreadableEntry(f"value of {len(blob)} bytes is larger than any chunk ({max_blob_bytes})")
    try:
        length = RemoteMetadata.deserialize(memoryview(metadata)).length
    except Exception as error:  # struct.error, ValueError, KeyError: all "not LMCache's"
        raise UnreadableEntry(f"metadata does not decode: {type(error).__name__}") from None
    if length != len(blob):
        raise UnreadableEntry(f"metadata says {length} bytes, the value has {len(blob)}")
