"""A prefill worker's leases: the KV it computed and holds for a decode worker to pull.

vLLM frees a handed-over request's blocks when the decode says it has read them (NIXL's
notification); the worker is not told which request that was. What it can see is the engine's
stats: an engine with nothing running and no KV in use, in stats taken after a lease began,
holds nothing for that lease. Otherwise a lease lasts until it expires (--kv-lease-s). A drain
waits for the live leases (libs/worker/drain.py), and GetStats reports them (`num_leased`,
which the planner's scale-down waits on): counting pulled KV as held made every prefill's stop
wait out its leases (17 s per stop in the end-to-end tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.worker.engine import EngineStats


@dataclass(frozen=True)
class Lease:
    expires: float  # unix seconds
    stats_updates: int  # EngineStats.updates when the lease began


class Leases:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}

    def grant(self, request_id: str, expires: float, stats: EngineStats) -> None:
        self._leases[request_id] = Lease(expires, stats.updates)

    def live(self, now: float, stats: EngineStats) -> int:
        """How many leases may still hold KV a decode has not pulled; forgets the others."""
        holds_nothing = not (stats.kv_cache_usage or stats.num_running or stats.num_waiting)
        for request_id, lease in list(self._leases.items()):
            if lease.expires <= now or (holds_nothing and stats.updates > lease.stats_updates):
                del self._leases[request_id]
        return len(self._leases)
