"""--kv-allowed-dns: a decode worker trusts the addresses a name resolves to (the prefill
workers' headless Service on Kubernetes), looked up again for an address it has not seen."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cleave.worker.v1 import worker_pb2
from libs.config.errors import ConfigError
from libs.config.flags import parse
from libs.worker.config import WorkerConfig
from libs.worker.handoff import UntrustedPeer, check_peer, trusted_hosts
from libs.worker.peers import MIN_LOOKUP_INTERVAL_S, DnsPeers

pytestmark = pytest.mark.anyio


class Dns:
    """A resolver whose answers a test changes; counts lookups."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.lookups = 0

    async def __call__(self, name: str) -> Sequence[str]:
        self.lookups += 1
        return self.answers.get(name, [])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_flag_takes_names_not_addresses_or_networks() -> None:
    config = parse(WorkerConfig, ["--role", "decode", "--kv-allowed-dns", "prefill, prefill.cleave.svc"])
    assert config.kv_allowed_dns == ("prefill", "prefill.cleave.svc")
    for bad in ("10.0.0.1", "10.244.0.0/16", "prefill:50070"):
        with pytest.raises(ConfigError, match="--kv-allowed-dns"):
            parse(WorkerConfig, ["--kv-allowed-dns", bad])


async def test_a_new_prefill_pods_address_is_trusted_after_one_more_lookup() -> None:
    dns, clock = Dns({"prefill": ["10.1.0.5"]}), Clock()
    peers = DnsPeers(["prefill"], dns, clock)
    assert await peers.addresses("10.1.0.5") == {"10.1.0.5"}
    assert await peers.addresses("10.1.0.5") == {"10.1.0.5"} and dns.lookups == 1  # known: no lookup
    dns.answers["prefill"].append("10.2.3.4")  # a second prefill pod became ready
    clock.now += MIN_LOOKUP_INTERVAL_S
    assert "10.2.3.4" in await peers.addresses("10.2.3.4") and dns.lookups == 2


async def test_unknown_addresses_cannot_make_it_flood_dns() -> None:
    dns, clock = Dns({"prefill": ["10.1.0.5"]}), Clock()
    peers = DnsPeers(["prefill"], dns, clock)
    for forged in ("6.6.6.1", "6.6.6.2", "6.6.6.3"):
        assert forged not in await peers.addresses(forged)
    assert dns.lookups == 1


async def test_check_peer_trusts_resolved_addresses_and_nothing_else() -> None:
    config = parse(WorkerConfig, ["--role", "decode", "--kv-allowed-dns", "prefill"])
    peers = DnsPeers(config.kv_allowed_dns, Dns({"prefill": ["10.1.0.5", "fd00::7"]}), Clock())
    trusted = trusted_hosts(config.kv_host, config.kv_allowed_hosts)
    for host in ("10.1.0.5", "[fd00::7]"):
        handoff = worker_pb2.KvHandoff(host=host, port=50070)
        check_peer(handoff, trusted, await peers.addresses(host))
    stranger = worker_pb2.KvHandoff(host="10.1.0.6", port=50070)
    resolved = await peers.addresses("10.1.0.6")
    with pytest.raises(UntrustedPeer, match="--kv-allowed-dns"):
        check_peer(stranger, trusted, resolved)
