"""Worker endpoints with health: polled stats and a circuit breaker per worker.

Only the worker's own failures count against it (its process unreachable, its engine
unavailable, its stats poll failing); a request it refuses as invalid is the client's mistake
and never does (libs/gateway/serving/generate.py). The breaker (libs/gateway/fleet/breaker.py) decides when
a worker is routed to: the stats poller reports every poll to it, and its answered polls are
the probes that bring an open worker back after the cool-down. Besides the breaker, a worker
is routed to only while its own health service says it serves (health_watch.py): a worker
that loads or drains says NOT_SERVING, and the gateway stops sending it requests at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import structlog

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.roles import Role
from libs.gateway.fleet.breaker import BreakerConfig, BreakerState, CircuitBreaker
from libs.gateway.fleet.health_watch import watch_health
from libs.gateway.fleet.kv_cache_watch import watch_kv_cache
from libs.gateway.fleet.shared_stream import GenerateCall, SharedStream
from libs.kvevents.cached_blocks import CachedBlocks
from libs.kvevents.hashing import BlockHasher
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)

# How long a worker that refused a request at its bound counts as full without a report saying
# otherwise; then one request tries it again (a refusal costs a round trip; nothing runs).
FULL_RETRY_S = 0.1


@dataclass
class Endpoint:
    address: str
    role: Role
    channel: grpc.aio.Channel | None
    stub: worker_pb2_grpc.WorkerStub
    # Routed to: its breaker is closed and the worker says it serves. Kept in step by the
    # breaker and the health watch; given here only by tests that build an endpoint without a
    # pool (True starts the breaker closed).
    healthy: bool = False
    stats: worker_pb2.WorkerStats = field(default_factory=worker_pb2.WorkerStats)
    # Requests admission control let onto this worker that have not ended (admission.py):
    # the load routing sees, fresher than polled stats. A decode slot is taken before the
    # request's prefill, so requests arriving together spread over the decode workers.
    admitted: int = 0
    # What the worker serves (vocabulary, context, max_num_seqs), asked once it first answers a poll.
    info: worker_pb2.WorkerInfo | None = None
    breaker: CircuitBreaker = field(default=None)  # type: ignore[assignment]  # set in __post_init__
    # The worker's GenerateMany call, which every request to it shares (when it serves one
    # and `shared_streams` allows: --worker-streams).
    shared_streams: bool = True
    shared_stream: SharedStream | None = None
    # The worker's own health service: False while it says NOT_SERVING (loading, draining).
    serving: bool = True
    # What its engine's prefix cache holds and how it names blocks, from its KV events, while
    # the pool watches them (kv_cache_watch.py); None: not known.
    cached_blocks: CachedBlocks | None = None
    kv_hasher: BlockHasher | None = None
    # Other gateways' requests on the worker: its own count of running requests (each stats
    # poll and GenerateMany message) less this gateway's, as last reported. Admission counts
    # them with `admitted` against the worker's bound, which the worker itself enforces.
    elsewhere: int = 0
    # The worker refused a request for being at its bound (libs/rpc/at_capacity.py): none is
    # sent to it until it reports room, or FULL_RETRY_S passes.
    full: bool = False
    _full_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    # Called when a report shows room that was not there (the pool's listeners: waiters may go).
    on_room: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        given: CircuitBreaker | None = self.breaker
        if given is None:
            self.breaker = CircuitBreaker(self.address, self.role, closed=self.healthy)
        self.healthy = self.breaker.state is BreakerState.CLOSED and self.serving
        self.breaker.listeners.append(self._breaker_changed)

    def _breaker_changed(self, state: BreakerState) -> None:
        self.healthy = state is BreakerState.CLOSED and self.serving

    def set_serving(self, serving: bool) -> bool:
        """What the worker's health service said; True when that changed anything."""
        if serving == self.serving:
            return False
        self.serving = serving
        self.healthy = self.breaker.state is BreakerState.CLOSED and serving
        return True

    def report_inflight(self, inflight: int) -> None:
        """The worker's own count of the requests it runs, from every gateway."""
        elsewhere, full = self.elsewhere, self.full
        self.elsewhere = max(0, inflight - self.admitted)
        bound = self.info.max_inflight_requests if self.info is not None else 0
        if self.full and (bound <= 0 or inflight < bound):
            self.full = False
        if (self.elsewhere < elsewhere or (full and not self.full)) and self.on_room is not None:
            self.on_room()

    def refused_at_capacity(self) -> None:
        """The worker refused a request at its bound: it has no room until it says so, or
        until FULL_RETRY_S passes (a worker this gateway has nothing running on sends it no
        message, and its next poll may be a second away)."""
        self.full = True
        if self._full_timer is not None:
            self._full_timer.cancel()
        self._full_timer = asyncio.get_running_loop().call_later(FULL_RETRY_S, self._retry_when_full)

    def _retry_when_full(self) -> None:
        self._full_timer = None
        if self.full:
            self.full = False
            if self.on_room is not None:
                self.on_room()

    def generate(self, request: worker_pb2.GenerateRequest, timeout: float | None) -> GenerateCall:
        """The request's Generate stream: on the worker's shared GenerateMany call when it
        serves one (libs/gateway/fleet/shared_stream.py), else a Generate call of its own."""
        if (
            self.shared_streams
            and self.info is not None
            and self.info.generate_many
            and request.metadata.request_id
        ):
            if self.shared_stream is None:
                # Weakly: the stream must not keep its endpoint (and its channel) alive.
                report = weakref.WeakMethod(self.report_inflight)

                def on_inflight(inflight: int) -> None:
                    method = report()
                    if method is not None:
                        method(inflight)

                self.shared_stream = SharedStream(self.stub, self.address, on_inflight)
            return self.shared_stream.open(request, timeout)
        call: GenerateCall = self.stub.Generate(request, timeout=timeout)
        return call


class WorkerPool:
    def __init__(
        self,
        addresses: Mapping[Role, Sequence[str]],
        poll_interval_s: float = 1.0,
        poll_timeout_s: float = 3.0,
        breaker: BreakerConfig | None = None,
        security: RpcSecurity | None = None,
        clock: Callable[[], float] = time.monotonic,
        shared_streams: bool = True,
        watch_kv_cache: bool = False,
    ) -> None:
        self._shared_streams = shared_streams  # --worker-streams shared
        # Follow each worker's KV events (a routing policy reads them: kv_events).
        self._watch_kv_cache = watch_kv_cache
        self._poll_interval_s = poll_interval_s
        self._poll_timeout_s = poll_timeout_s
        self._breaker = breaker or BreakerConfig()
        self._clock = clock  # the breakers' (tests step it)
        self._security = security
        self.endpoints: list[Endpoint] = []
        # Retired (libs/gateway/fleet/discovery.py) but with requests still running: closed once idle.
        self.retiring: list[Endpoint] = []
        # Called (with no argument) after each poll round, on each breaker transition and
        # each change of a worker's health status.
        self.listeners: list[Callable[[], None]] = []
        # Each endpoint's health watch (health_watch.py) and KV cache watch, once the pool has started.
        self._watches: dict[int, list[asyncio.Task[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        for role, role_addresses in addresses.items():
            for address in role_addresses:
                self.connect(address, role)

    def connect(self, address: str, role: Role, server_name: str | None = None) -> Endpoint:
        """A new endpoint with its own channel to `address`; `server_name` is the name a TLS
        certificate is checked against when `address` was resolved from it."""
        security = self._security
        if security is not None and security.tls and server_name and not security.server_name:
            security = dataclasses.replace(security, server_name=server_name)
        channel = open_channel(address, security=security)
        endpoint = self.add(address, role, worker_pb2_grpc.WorkerStub(channel), channel)
        if self._task is not None:
            self._watch(endpoint)
        self._changed()  # waiting requests may go to it once it answers a poll
        return endpoint

    def retire(self, endpoint: Endpoint) -> None:
        """No new request goes to `endpoint`; requests already on it finish, then its
        channel closes (checked at each poll round)."""
        self.endpoints.remove(endpoint)
        self.retiring.append(endpoint)
        self._unwatch(endpoint)
        self._changed()  # waiters no remaining worker can serve are refused now

    def add(self, address: str, role: Role, stub: Any, channel: grpc.aio.Channel | None = None) -> Endpoint:
        """An endpoint with this pool's breaker settings (tests pass in-memory stubs)."""
        endpoint = Endpoint(
            address,
            role,
            channel,
            stub,
            breaker=CircuitBreaker(address, role, self._breaker, clock=self._clock),
            shared_streams=self._shared_streams,
        )
        endpoint.breaker.listeners.append(lambda _state: self._changed())
        endpoint.on_room = self._changed
        self.endpoints.append(endpoint)
        return endpoint

    def healthy(self, role: Role) -> list[Endpoint]:
        """Endpoints of `role` whose breaker is closed and that say they serve."""
        return [e for e in self.endpoints if e.role == role and e.healthy]

    def routable(self, role: Role) -> list[Endpoint]:
        """Endpoints of `role` a request may go to now: serving, and closed, or half-open with
        no probe in flight (the request is then the probe)."""
        return [e for e in self.endpoints if e.role == role and e.serving and e.breaker.available()]

    def vocab_size(self) -> int | None:
        """The smallest vocabulary the workers reported (token ids below it are valid on
        every worker), or None while no worker has said."""
        sizes = [e.info.vocab_size for e in self.endpoints if e.info is not None and e.info.vocab_size > 0]
        return min(sizes) if sizes else None

    def request_failed(self, endpoint: Endpoint, reason: str) -> None:
        """The worker failed a request by its own fault (unreachable, engine unavailable)."""
        endpoint.breaker.request_failed(reason)

    def request_succeeded(self, endpoint: Endpoint) -> None:
        endpoint.breaker.request_succeeded()

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(e) for e in self.endpoints))
        await self._close_idle_retired()
        self._changed()

    async def _close_idle_retired(self) -> None:
        idle = [e for e in self.retiring if e.admitted == 0]
        self.retiring = [e for e in self.retiring if e.admitted > 0]
        await asyncio.gather(*(e.channel.close() for e in idle if e.channel is not None))

    async def _poll(self, endpoint: Endpoint) -> None:
        try:
            endpoint.stats = await endpoint.stub.GetStats(
                worker_pb2.GetStatsRequest(), timeout=self._poll_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            endpoint.breaker.poll_failed(f"stats poll failed: {error.code().name}")
            return
        if endpoint.info is None:
            await self._fetch_info(endpoint)
        endpoint.report_inflight(endpoint.stats.num_inflight)
        endpoint.breaker.poll_succeeded()

    async def _fetch_info(self, endpoint: Endpoint) -> None:
        try:
            endpoint.info = await endpoint.stub.GetInfo(
                worker_pb2.GetInfoRequest(), timeout=self._poll_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            # Only edge checks and the in-flight bound depend on it: asked at the next poll.
            log.debug("worker info not available yet", address=endpoint.address, code=error.code().name)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    async def start(self) -> None:
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever())
        for endpoint in self.endpoints:
            self._watch(endpoint)

    def _watch(self, endpoint: Endpoint) -> None:
        if endpoint.channel is None:
            return  # an in-memory stub (tests): no health service to watch

        def heard(serving: bool) -> None:
            if endpoint.set_serving(serving):
                if serving:
                    endpoint.breaker.serving_again()
                log.info(
                    "worker serving"
                    if serving
                    else "worker not serving (loading or draining); not routed to",
                    address=endpoint.address,
                    role=str(endpoint.role),
                )
                self._changed()

        tasks = [
            asyncio.create_task(
                watch_health(endpoint.channel, endpoint.address, heard, self._poll_interval_s)
            )
        ]
        if self._watch_kv_cache:
            tasks.append(asyncio.create_task(watch_kv_cache(endpoint, self._poll_interval_s)))
        self._watches[id(endpoint)] = tasks

    def _unwatch(self, endpoint: Endpoint) -> None:
        for task in self._watches.pop(id(endpoint), []):
            task.cancel()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            await self.poll_once()

    async def close(self) -> None:
        # The poller and the health watches end before their channels close, so that no call
        # of theirs is still in flight (grpc.aio would finish it on a loop that may be gone).
        watches = [t for endpoint_tasks in self._watches.values() for t in endpoint_tasks]
        tasks = [t for t in (self._task, *watches) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._watches.clear()
        channels = [e.channel for e in self.endpoints + self.retiring if e.channel is not None]
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
