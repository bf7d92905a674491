"""A prefill worker's leases (libs/worker/leases.py): over at expiry, or once the engine, in
stats taken after the lease began, holds no KV and runs nothing."""

from __future__ import annotations

from libs.worker.engine import EngineStats
from libs.worker.leases import Leases


def test_a_lease_lasts_until_it_expires_while_the_engine_holds_kv() -> None:
    leases = Leases()
    leases.grant("a", expires=100.0, stats=EngineStats(kv_cache_usage=0.2, updates=5))
    busy_later = EngineStats(kv_cache_usage=0.1, updates=9)
    assert leases.live(99.0, busy_later) == 1
    assert leases.live(100.0, busy_later) == 0


def test_an_engine_holding_nothing_after_the_lease_began_has_released_it() -> None:
    leases = Leases()
    leases.grant("a", expires=100.0, stats=EngineStats(kv_cache_usage=0.2, updates=5))
    leases.grant("b", expires=100.0, stats=EngineStats(kv_cache_usage=0.0, updates=7))
    freed = EngineStats(kv_cache_usage=0.0, updates=7)
    # Stats from update 7 are newer than a's lease, not than b's (b's KV may not show yet).
    assert leases.live(50.0, freed) == 1
    assert leases.live(50.0, EngineStats(kv_cache_usage=0.0, updates=8)) == 0


def test_a_running_or_waiting_request_keeps_the_leases() -> None:
    leases = Leases()
    leases.grant("a", expires=100.0, stats=EngineStats(updates=1))
    assert leases.live(50.0, EngineStats(num_running=1, updates=3)) == 1
    assert leases.live(50.0, EngineStats(num_waiting=1, updates=3)) == 1
    assert leases.live(50.0, EngineStats(updates=3)) == 0
