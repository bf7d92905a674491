"""Leases: pins on stored chunks that end by Release or by their TTL, whichever is first.

A lease holds unpin callbacks (one per pinned entry), so whoever ends it releases exactly
what it pinned. Expiry is checked lazily by every store call and periodically by the
service, so an abandoned lease (a client that died between Lease and Get) frees its pins
within about a second of its TTL.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Lease:
    lease_id: str
    expires_at: float  # on the store's monotonic clock
    expires_unix_ms: int
    num_pinned: int
    pinned_cpu_bytes: int
    unpins: list[Callable[[], None]] = field(default_factory=list)

    def release(self) -> None:
        for unpin in self.unpins:
            unpin()
        self.unpins.clear()


class LeaseTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases[lease.lease_id] = lease

    def pop(self, lease_id: str) -> Lease | None:
        with self._lock:
            return self._leases.pop(lease_id, None)

    def pop_expired(self, now: float) -> list[Lease]:
        with self._lock:
            expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
            for lease in expired:
                del self._leases[lease.lease_id]
        return expired

    def pop_all(self) -> list[Lease]:
        with self._lock:
            leases = list(self._leases.values())
            self._leases.clear()
        return leases

    def pinned_cpu_bytes(self) -> int:
        with self._lock:
            return sum(lease.pinned_cpu_bytes for lease in self._leases.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)
