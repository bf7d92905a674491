"""Prefill hosts a decode worker trusts by name: `--kv-allowed-dns prefill` trusts every address
the name resolves to (all A and AAAA records), looked up again when a descriptor names an
address the last answer lacked.

On Kubernetes a prefill pod's address is known only once it starts, and the network its pods
get addresses from differs by cluster (flannel's 10.244.0.0/16, Calico's 192.168.0.0/16, a
cloud VPC's ranges...). The prefill workers' headless Service names exactly the ready prefill
pods, the ones the gateway sends prompts to, so trusting its answer needs no range written into
a manifest, and trusts no other pod of the network.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import structlog

log = structlog.get_logger(__name__)

# A name is looked up again at most this often (a forged descriptor cannot make the worker
# flood DNS); a new prefill pod is trusted within one lookup of its first handoff.
MIN_LOOKUP_INTERVAL_S = 0.5

Resolver = Callable[[str], Awaitable[Sequence[str]]]


async def resolve_all(name: str) -> list[str]:
    """Every address of `name` (A and AAAA); [] when it has none."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return [str(info[4][0]) for info in infos]


class DnsPeers:
    def __init__(
        self,
        names: Iterable[str],
        resolver: Resolver = resolve_all,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._names = tuple(names)
        self._resolver = resolver
        self._clock = clock
        self._addresses: frozenset[str] = frozenset()
        self._looked_up_at = -MIN_LOOKUP_INTERVAL_S

    async def addresses(self, wanted: str = "") -> frozenset[str]:
        """The names' addresses; looked up again first when `wanted` is not among them and the
        last lookup is old enough."""
        host = wanted.strip("[]").lower()
        stale = self._clock() - self._looked_up_at >= MIN_LOOKUP_INTERVAL_S
        if stale and (not host or host not in self._addresses):
            self._looked_up_at = self._clock()
            found: set[str] = set()
            for name in self._names:
                try:
                    found.update(a.lower() for a in await self._resolver(name))
                except OSError as error:
                    log.warning("kv peer name lookup failed", name=name, error=str(error))
            self._addresses = frozenset(found)
        return self._addresses
