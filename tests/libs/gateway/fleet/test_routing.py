from __future__ import annotations

from typing import Any

import pytest

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.fleet.pool import Endpoint
from libs.gateway.fleet.routing import POLICIES, create_policy
from libs.gateway.fleet.routing.kv_events import KvEvents
from libs.kvevents.cached_blocks import CachedBlocks, KvCacheUpdate
from libs.kvevents.hashing import BlockHasher


def endpoint(address: str, **stats: Any) -> Endpoint:
    # Policies only read addresses and stats; no channel is needed.
    unused: Any = None
    return Endpoint(
        address,
        Role.PREFILL,
        channel=unused,
        stub=unused,
        healthy=True,
        stats=worker_pb2.WorkerStats(**stats),
    )


def test_registry_knows_the_policies() -> None:
    assert {"round_robin", "least_load"} <= set(POLICIES)
    with pytest.raises(
        ValueError,
        match="unknown routing policy 'random'; known: kv_events, least_load, prefix_affinity, round_robin",
    ):
        create_policy("random")


def test_round_robin_cycles_in_address_order() -> None:
    policy = create_policy("round_robin")
    candidates = [endpoint("b:1"), endpoint("a:1"), endpoint("c:1")]
    assert [policy.pick(candidates, []).address for _ in range(4)] == ["a:1", "b:1", "c:1", "a:1"]


def test_least_load_prefers_fewer_admitted_then_queue_then_kv() -> None:
    policy = create_policy("least_load")
    busy, idle = endpoint("a:1", num_running=3), endpoint("b:1", num_running=1)
    assert policy.pick([busy, idle], []).address == "b:1"
    idle.admitted = 5
    assert policy.pick([busy, idle], []).address == "a:1"
    full, empty = endpoint("c:1", kv_cache_usage=0.9), endpoint("d:1", kv_cache_usage=0.1)
    assert policy.pick([full, empty], []).address == "d:1"
    # Other gateways' requests, as the worker reported them, count like this gateway's own.
    shared, own = endpoint("e:1"), endpoint("f:1")
    shared.report_inflight(4)
    own.admitted = 3
    assert shared.elsewhere == 4 and policy.pick([shared, own], []).address == "f:1"


@pytest.mark.anyio
async def test_failed_polls_stop_routing_after_several_and_an_answered_one_after_the_cool_down_resumes() -> (
    None
):
    import grpc

    from libs.gateway.fleet.breaker import BreakerConfig
    from libs.gateway.fleet.pool import WorkerPool
    from tests.libs.gateway.fake_workers import FakeWorker

    now = [0.0]
    pool = WorkerPool({}, breaker=BreakerConfig(failures_to_open=3, cooldown_s=5), clock=lambda: now[0])
    worker = FakeWorker()
    e = pool.add("a:1", Role.PREFILL, worker)
    await pool.poll_once()
    assert pool.healthy(Role.PREFILL) == [e] and e.info is not None and e.info.max_num_seqs == 8
    worker.poll_fail = grpc.StatusCode.UNAVAILABLE
    await pool.poll_once()
    await pool.poll_once()
    assert pool.healthy(Role.PREFILL) == [e]
    await pool.poll_once()
    assert pool.healthy(Role.PREFILL) == pool.routable(Role.PREFILL) == []
    worker.poll_fail = None
    await pool.poll_once()  # answers, but within the cool-down
    assert pool.healthy(Role.PREFILL) == []
    now[0] += 5
    await pool.poll_once()
    assert pool.healthy(Role.PREFILL) == pool.routable(Role.PREFILL) == [e]


def test_prefix_affinity_returns_a_prefix_to_the_worker_that_computed_it() -> None:
    policy = create_policy("prefix_affinity")
    a, b = endpoint("a:1"), endpoint("b:1")
    shared = list(range(1000, 1000 + 1024))
    first = policy.pick([a, b], [*shared, 1, 2, 3])
    first.admitted = 1  # still running when the next request with the same prefix comes
    assert policy.pick([a, b], [*shared, 4, 5, 6]) is first  # 1,024 cached tokens > 512 of load
    other = b if first is a else a
    assert policy.pick([a, b], list(range(5000, 5300))) is other  # no overlap: the idle one


def test_prefix_affinity_keeps_cache_salts_apart() -> None:
    # Engines reuse KV only within one cache salt (--cache-salt-per-api-key: one per tenant),
    # so a prefix computed under one salt is no reason to route another salt's request there.
    policy = create_policy("prefix_affinity")
    a, b = endpoint("a:1"), endpoint("b:1")
    prompt = list(range(1000, 1000 + 1024))
    first = policy.pick([a, b], prompt, "tenant-1")
    first.admitted = 1
    other = b if first is a else a
    assert policy.pick([a, b], prompt, "tenant-2") is other  # nothing of tenant 2's cached: less load
    assert policy.pick([a, b], prompt) is other  # nor unsalted
    other.admitted = 1
    assert policy.pick([a, b], prompt, "tenant-1") is first  # its own prefix, same salt


def test_prefix_affinity_gives_way_to_load_and_ignores_partial_blocks() -> None:
    policy = create_policy("prefix_affinity")
    a, b = endpoint("a:1"), endpoint("b:1")
    prompt = list(range(300))  # one full 256-token block
    owner = policy.pick([a, b], prompt)
    owner.admitted = 3  # 3 x 512 tokens of queueing outweigh 256 tokens of reuse
    assert policy.pick([a, b], prompt) is not owner
    assert policy.pick([a, b], list(range(200))) is not None  # shorter than a block: load only


def test_prefix_affinity_memory_is_bounded() -> None:
    from libs.gateway.fleet.routing.prefix_affinity import PrefixAffinity

    policy = PrefixAffinity(max_blocks=4)
    a = endpoint("a:1")
    for start in range(0, 10):
        policy.pick([a], list(range(start * 10_000, start * 10_000 + 512)))
    assert len(policy._owner) == 4
    assert policy.cached_tokens([a], list(range(90_000, 90_512))) == {"a:1": 512}
    assert policy.cached_tokens([a], list(range(0, 512))) == {"a:1": 0}


def cached(address: str, hasher: BlockHasher, prompt: list[int], blocks: int = -1, **stats: Any) -> Endpoint:
    """An endpoint whose engine said (through KV events) it holds `prompt`'s first `blocks` blocks."""
    chosen = endpoint(address, **stats)
    chosen.kv_hasher = hasher
    chosen.cached_blocks = CachedBlocks()
    keys = hasher.keys(prompt)
    chosen.cached_blocks.apply(KvCacheUpdate(stored=tuple(keys if blocks < 0 else keys[:blocks])))
    return chosen


def test_kv_events_sends_a_prompt_where_the_engine_says_its_prefix_is_cached() -> None:
    policy = KvEvents()
    hasher = BlockHasher(16)
    prompt = list(range(160))  # 10 blocks
    candidates = [
        cached("a:1", hasher, prompt, blocks=2),
        cached("b:1", hasher, prompt, blocks=8),
        cached("c:1", hasher, list(range(1000, 1160))),  # another prompt's blocks
        endpoint("d:1"),  # no events heard: nothing known cached
    ]
    assert policy.pick(candidates, prompt).address == "b:1"
    assert policy.cached_tokens(candidates, prompt) == {"a:1": 32, "b:1": 128, "c:1": 0, "d:1": 0}
    # The same prompt under a cache salt is another prefix to the engines: nothing cached.
    assert set(policy.cached_tokens(candidates, prompt, cache_salt="tenant").values()) == {0}


def test_kv_events_weighs_the_cached_prefix_against_load() -> None:
    policy = create_policy("kv_events")
    hasher = BlockHasher(16)
    prompt = list(range(160))
    # 128 cached tokens are worth less than one queued request (512 tokens): the idle one wins.
    assert (
        policy.pick([cached("a:1", hasher, prompt, num_waiting=1), endpoint("b:1")], prompt).address == "b:1"
    )
    long_prompt = list(range(2000))  # 125 blocks, 2,000 cached tokens: worth queueing behind one
    busy = cached("a:1", hasher, long_prompt, num_waiting=1)
    assert policy.pick([busy, endpoint("b:1")], long_prompt).address == "a:1"
