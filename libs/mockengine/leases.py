"""Prefill side: blocks kept for a decode engine to pull, each under a lease.

As vLLM's NIXL connector does for a finished prefill (`do_remote_decode`), the request's
blocks stay allocated after it finishes until a decode engine has pulled them, the decode
side releases them (ReleaseKv), or the lease (the worker's --kv-lease-s) runs out. Ending a
lease unpins the blocks: they stay in the prefix cache until evicted. Leases run on the
wall clock, not the simulated one: the worker stamps the same expiry on its handoffs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from libs.mockengine.blocks import BlockPool, KvBlock

# How many ended leases are remembered, to tell "expired" and "released" from "unknown".
REMEMBERED_ENDINGS = 4096


@dataclass
class Lease:
    request_id: str
    blocks: list[KvBlock]
    num_tokens: int
    expires_at: float  # on the table's clock


class LeaseTable:
    def __init__(self, pool: BlockPool, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self.lease_s = lease_s
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._leases

    def hold(self, request_id: str, blocks: list[KvBlock], num_tokens: int) -> Lease:
        lease = Lease(request_id, blocks, num_tokens, self._clock() + self.lease_s)
        self._leases[request_id] = lease
        self._ended.pop(request_id, None)
        return lease

    def end(self, request_id: str, why: str) -> str | None:
        """Ends a live lease (`why`: "pulled" or "released") and unpins its blocks; or says
        why there is none: "unknown", "expired", "pulled" or "released" (already ended)."""
        self.expire()
        lease = self._leases.pop(request_id, None)
        if lease is None:
            return self._ended.get(request_id, "unknown")
        self._pool.free(reversed(lease.blocks))
        self._remember(request_id, why)
        return None

    def expire(self) -> int:
        """Ends every lease past its expiry; returns how many."""
        now = self._clock()
        expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
        for lease in expired:
            del self._leases[lease.request_id]
            self._pool.free(reversed(lease.blocks))
            self._remember(lease.request_id, "expired")
        return len(expired)

    def next_expiry(self) -> float | None:
        return min((lease.expires_at for lease in self._leases.values()), default=None)

    def _remember(self, request_id: str, why: str) -> None:
        self._ended[request_id] = why
        while len(self._ended) > REMEMBERED_ENDINGS:
            self._ended.popitem(last=False)
