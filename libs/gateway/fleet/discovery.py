"""Worker discovery by DNS: a host name in --prefill-workers / --decode-workers / --pd-workers
stands for every worker its DNS records name, re-resolved every --worker-dns-refresh-s.

This is how workers added to a running stack reach the gateway without a restart: Docker's
embedded DNS answers a compose service name (`decode`) with one address per container, so
`docker compose up --scale decode=2` adds one; a Kubernetes headless Service answers with one
address per ready pod. gRPC's own `dns:` resolver would spread calls over those addresses too,
but behind one channel, where the gateway could neither route by each worker's load nor keep
a breaker per worker; so each address becomes its own endpoint of the pool (libs/gateway/fleet/pool.py).

- An address whose host is an IP literal is used as given, never resolved.
- A name's endpoints are the addresses of one family, IPv4 when it has any (Cleave's services
  listen on IPv4 addresses by default, `--host 0.0.0.0`), else IPv6: on a dual-stack network
  each worker has an address of each family, and both would count it twice.
- A new address is connected and polled like any other endpoint; a vanished one is retired:
  no new request goes to it and its channel closes once its requests have ended.
- A failed lookup, or a name that resolves to nothing (a lone worker restarting, a Service
  with no ready pod), keeps the name's last endpoints: their breakers report them down until
  they answer again or the name resolves to other addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from libs.config.roles import Role
from libs.gateway.fleet.pool import WorkerPool

log = structlog.get_logger(__name__)

# Seconds between lookups when the flag is not given: a new worker is routed to within about
# this plus one stats poll; Docker's and CoreDNS's answers change no faster (CoreDNS caches 5 s).
DEFAULT_REFRESH_S = 5.0

# host -> the IP addresses its records name, best first (getaddrinfo's order).
Resolver = Callable[[str], Awaitable[Sequence[str]]]

LOOKUPS_FAILED = Counter(
    "cleave_gateway_worker_dns_lookups_failed_total",
    "Worker host names that failed to resolve (their last endpoints are kept)",
    ["host"],
)
ENDPOINT_CHANGES = Counter(
    "cleave_gateway_worker_dns_endpoint_changes_total",
    "Worker endpoints added or retired because their host name's DNS answer changed",
    ["role", "change"],
)


async def resolve_host(host: str) -> list[str]:
    """The addresses of `host` by the system's resolver (all A/AAAA records, /etc/hosts),
    in its preference order; [] when the name has no address (NXDOMAIN, no data)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise
    return [str(info[4][0]) for info in infos]


def split_address(address: str) -> tuple[str, str]:
    """host:port -> (host, port); an IPv6 host loses its brackets."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def join_address(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def one_family(addresses: Sequence[str]) -> list[str]:
    """The distinct IPv4 addresses in order, or the IPv6 ones when there is no IPv4 address."""
    by_version: dict[int, list[str]] = {4: [], 6: []}
    for address in addresses:
        by_version[ipaddress.ip_address(address).version].append(address)
    return list(dict.fromkeys(by_version[4] or by_version[6]))


@dataclass(frozen=True)
class _Entry:
    role: Role
    address: str  # as configured: host:port
    host: str
    port: str


class WorkerDiscovery:
    """Keeps `pool`'s endpoints in step with the configured worker addresses' DNS answers."""

    def __init__(
        self,
        pool: WorkerPool,
        addresses: Mapping[Role, Sequence[str]],
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        resolver: Resolver = resolve_host,
    ) -> None:
        self._pool = pool
        self._refresh_s = refresh_s
        self._resolver = resolver
        self._entries = [
            _Entry(role, address, *split_address(address))
            for role, role_addresses in addresses.items()
            for address in role_addresses
        ]
        # What each configured address stood for at its last successful, non-empty lookup.
        self._current: dict[_Entry, list[str]] = {}
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Resolves every configured name once and adds/retires endpoints to match."""
        for entry in self._entries:
            if is_literal(entry.host):
                self._current[entry] = [entry.address]
                continue
            try:
                found = one_family(await self._resolver(entry.host))
            except OSError as error:  # socket.gaierror included: a failed lookup, not an answer
                LOOKUPS_FAILED.labels(entry.host).inc()
                log.warning("worker name lookup failed", host=entry.host, error=str(error))
                continue
            if not found:
                LOOKUPS_FAILED.labels(entry.host).inc()
                log.warning("worker name has no address; keeping its endpoints", host=entry.host)
                continue
            self._current[entry] = [join_address(ip, entry.port) for ip in found]
        self._apply()

    def _apply(self) -> None:
        # Server names for TLS: a resolved endpoint's certificate names the host, not the IP.
        wanted: dict[tuple[Role, str], str | None] = {}
        for entry, endpoints in self._current.items():
            for address in endpoints:
                wanted.setdefault((entry.role, address), None if is_literal(entry.host) else entry.host)
        present = {(e.role, e.address): e for e in self._pool.endpoints}
        for (role, address), endpoint in present.items():
            if (role, address) not in wanted:
                log.info("worker endpoint gone from DNS; retiring it", role=str(role), address=address)
                ENDPOINT_CHANGES.labels(role, "retired").inc()
                self._pool.retire(endpoint)
        for (role, address), host in wanted.items():
            if (role, address) not in present:
                log.info("worker endpoint found", role=str(role), address=address, host=host)
                ENDPOINT_CHANGES.labels(role, "added").inc()
                self._pool.connect(address, role, server_name=host)

    async def start(self) -> None:
        """The first lookup (before the pool's first poll), then one every `refresh_s`."""
        await self.refresh()
        if self._refresh_s > 0 and not all(is_literal(e.host) for e in self._entries):
            self._task = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
