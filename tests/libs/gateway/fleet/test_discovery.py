"""Worker discovery by DNS (libs/gateway/fleet/discovery.py) with an injected resolver (no lookup
leaves the process), and the pool's retirement of endpoints with requests in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from libs.config.roles import Role
from libs.gateway.fleet.admission import Admission
from libs.gateway.fleet.discovery import WorkerDiscovery, one_family, resolve_host
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from tests.libs.gateway.fake_workers import FakeDetokenizer, FakeWorker, fake_pool, simple_spec, text, until

pytestmark = pytest.mark.anyio


class Dns:
    """Answers from a table the test edits; a name mapped to an exception raises it."""

    def __init__(self, records: dict[str, Sequence[str] | OSError]) -> None:
        self.records = records
        self.asked: list[str] = []

    async def __call__(self, host: str) -> Sequence[str]:
        self.asked.append(host)
        answer = self.records[host]
        if isinstance(answer, OSError):
            raise answer
        return answer


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    # Channels to 127.0.0.x are opened but never used: nothing here polls them.
    pool = WorkerPool({})
    yield pool
    await pool.close()


def addresses(pool: WorkerPool, role: str) -> list[str]:
    return sorted(e.address for e in pool.endpoints if e.role == role)


async def test_a_name_stands_for_every_address_it_resolves_to(pool: WorkerPool) -> None:
    dns = Dns({Role.DECODE: ["127.0.0.2", "127.0.0.3"], Role.PREFILL: ["127.0.0.4"]})
    discovery = WorkerDiscovery(
        pool, {Role.DECODE: ["decode:50061"], Role.PREFILL: ["prefill:50060"]}, resolver=dns
    )
    await discovery.refresh()
    assert addresses(pool, "decode") == ["127.0.0.2:50061", "127.0.0.3:50061"]
    assert addresses(pool, "prefill") == ["127.0.0.4:50060"]


async def test_new_addresses_are_added_and_vanished_ones_retired(pool: WorkerPool) -> None:
    dns = Dns({Role.DECODE: ["127.0.0.2"]})
    discovery = WorkerDiscovery(pool, {Role.DECODE: ["decode:50061"]}, resolver=dns)
    await discovery.refresh()
    first = pool.endpoints[0]
    dns.records["decode"] = ["127.0.0.2", "127.0.0.3"]  # scaled out
    await discovery.refresh()
    assert addresses(pool, "decode") == ["127.0.0.2:50061", "127.0.0.3:50061"]
    assert first in pool.endpoints  # the same endpoint: its breaker and stats are kept
    dns.records["decode"] = ["127.0.0.3"]  # the first one went away
    await discovery.refresh()
    assert addresses(pool, "decode") == ["127.0.0.3:50061"]
    assert pool.retiring == [first]


async def test_a_failed_or_empty_lookup_keeps_the_last_endpoints(pool: WorkerPool) -> None:
    dns = Dns({Role.DECODE: ["127.0.0.2"]})
    discovery = WorkerDiscovery(pool, {Role.DECODE: ["decode:50061"]}, resolver=dns)
    await discovery.refresh()
    dns.records["decode"] = OSError("temporary failure in name resolution")
    await discovery.refresh()
    dns.records["decode"] = []  # the lone worker's container is restarting
    await discovery.refresh()
    assert addresses(pool, "decode") == ["127.0.0.2:50061"]
    assert pool.retiring == []
    assert dns.asked == ["decode"] * 3


async def test_a_name_unknown_at_start_is_added_once_it_resolves(pool: WorkerPool) -> None:
    dns = Dns({"decode": OSError("no such name yet")})
    discovery = WorkerDiscovery(pool, {Role.DECODE: ["decode:50061"]}, resolver=dns)
    await discovery.refresh()
    assert pool.endpoints == []
    dns.records["decode"] = ["127.0.0.2"]
    await discovery.refresh()
    assert addresses(pool, "decode") == ["127.0.0.2:50061"]


async def test_ip_literals_are_used_as_given_and_never_looked_up(pool: WorkerPool) -> None:
    dns = Dns({})
    discovery = WorkerDiscovery(pool, {Role.BOTH: ["127.0.0.5:50070", "[::1]:50071"]}, resolver=dns)
    await discovery.start()
    await discovery.close()
    assert addresses(pool, "both") == ["127.0.0.5:50070", "[::1]:50071"]
    assert dns.asked == []


async def test_one_address_family_per_name_so_dual_stack_workers_count_once(pool: WorkerPool) -> None:
    dns = Dns({"pd": ["::1", "127.0.0.2", "::2", "127.0.0.3", "127.0.0.2"], "v6": ["::2", "::1", "::2"]})
    discovery = WorkerDiscovery(pool, {Role.BOTH: ["pd:50070", "v6:50071"]}, resolver=dns)
    await discovery.refresh()
    assert addresses(pool, "both") == ["127.0.0.2:50070", "127.0.0.3:50070", "[::1]:50071", "[::2]:50071"]
    assert one_family([]) == []


async def test_the_system_resolver_answers_from_hosts_file() -> None:
    assert "127.0.0.1" in await resolve_host("localhost") or "::1" in await resolve_host("localhost")


async def test_a_retired_worker_finishes_its_requests_and_gets_no_new_ones() -> None:
    old, new = FakeWorker(), FakeWorker()
    old.hold = asyncio.Event()
    pool = await fake_pool({Role.BOTH: [old, new]})
    closed: list[str] = []

    class Channel:
        async def close(self) -> None:
            closed.append("both-0")

    retiring = pool.endpoints[0]
    retiring.channel = Channel()  # grpc is untyped here: any object passes
    admission = Admission(pool)
    policy = create_policy("round_robin")
    pipeline = Serving(pool, FakeDetokenizer(), policy, policy, admission=admission)  # type: ignore[arg-type]
    # Round robin starts at the first worker: the held request runs on the one retired next.
    in_flight = asyncio.create_task(text(pipeline, simple_spec("held")))
    await until(lambda: retiring.admitted == 1)
    pool.retire(retiring)
    assert await text(pipeline, simple_spec("after")) == "<3><4>"
    assert new.calls["Generate"] == 1
    await pool.poll_once()
    assert closed == []  # a request still runs on it
    old.hold.set()
    assert await in_flight == "<3><4>"
    await pool.poll_once()
    assert closed == ["both-0"]
    assert pool.retiring == []
