"""Admission control: a bounded number of requests in flight per worker, and a bounded FIFO
queue in the gateway for requests that find every eligible worker at its bound.

- Each worker runs at most its own bound of requests at once (WorkerInfo.max_inflight_requests,
  twice its `max_num_seqs` by default: one batch running and one waiting in the engine, so the
  engine's batch stays full while the next requests prefill or pull their KV), counted at the
  worker across every gateway (libs/worker/capacity.py). This gateway counts its own requests
  on the worker (`admitted`) plus the others' (`elsewhere`, from the worker's reports) against
  it, and `max_inflight_per_worker`, when set, bounds its own share lower. Beyond that a request
  waits here, where it can go to whichever worker frees first, instead of in one engine's queue.
- Another gateway may fill a worker between its reports: the worker then refuses the request
  before running it (at capacity), and the request takes its place back at the head of the
  queue (`Slot.move`) until a worker has room, that one included once it reports some.
- A request that finds no worker with room waits in the queue, first come first served
  (a waiter that may only use some workers, e.g. a prefill retry avoiding the one that
  failed, does not hold up those behind it that can use a free one).
- A full queue (`max_queued_requests`) or a wait longer than `queue_timeout_s` is a 429 with
  Retry-After; no worker of the role that is not open (breaker) at all is a 503, at once and
  for waiters when the last one opens. A waiter whose client went away is cancelled, which
  takes it out of the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from libs.config.roles import Role
from libs.gateway.common import errors
from libs.gateway.common.deadline import NO_DEADLINE, Deadline
from libs.gateway.fleet.breaker import BreakerState
from libs.gateway.fleet.pool import Endpoint, WorkerPool

# livesum: with several API processes (--api-server-count), /metrics adds up the running ones'.
QUEUE_DEPTH = Gauge(
    "cleave_gateway_queue_depth",
    "Requests waiting in the gateway for a worker with room",
    multiprocess_mode="livesum",
)
# The same queue by the role each request waits for: what an autoscaler adds to the workers'
# own vllm:num_requests_waiting (deploy/k8s/observability: decode scales on both).
QUEUED = Gauge(
    "cleave_gateway_queued_requests",
    "Requests waiting in the gateway for a worker with room, by the role they wait for",
    ["role"],
    multiprocess_mode="livesum",
)
REJECTED = Counter(
    "cleave_gateway_admission_rejected_total",
    "Requests refused by admission control: queue_full and queue_timeout (429), no_workers (503)",
    ["reason"],
)
# What the gateway assumes of a worker that has not said (WorkerInfo.max_num_seqs): Cleave's
# own default --max-num-seqs.
DEFAULT_MAX_NUM_SEQS = 8
# Seconds a refused client is asked to wait: queues drain in about a request's time, which the
# gateway does not know in advance; clients back off further on repeated 429s.
RETRY_AFTER_S = 1

Pick = Callable[[Sequence[Endpoint]], Endpoint]


@dataclass(frozen=True)
class AdmissionConfig:
    max_inflight_per_worker: int = 0  # 0: twice the worker's max_num_seqs
    max_queued_requests: int = 1024
    queue_timeout_s: float = 60.0  # 0: as long as the request's deadline allows


@dataclass(eq=False)
class _Waiter:
    role: Role
    pick: Pick
    exclude: frozenset[str]
    granted: asyncio.Future[Endpoint]


@dataclass(eq=False)
class Slot:
    """A request's place on one worker, held for an `admit` block; `move` trades it for a place
    on another (or the same) worker. None while the request waits for its next place."""

    endpoint: Endpoint | None


class Admission:
    def __init__(self, pool: WorkerPool, config: AdmissionConfig | None = None) -> None:
        self._pool = pool
        self._config = config or AdmissionConfig()
        self._waiters: deque[_Waiter] = deque()
        self._dispatch_scheduled = False
        pool.listeners.append(self._schedule_dispatch)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def limit(self, endpoint: Endpoint) -> int:
        """The requests `endpoint` runs at once, from every gateway (lower when this gateway's
        --max-inflight-per-worker says so)."""
        info = endpoint.info
        bound = info.max_inflight_requests if info is not None else 0
        if bound <= 0:  # a worker that does not say: twice its batch, as workers default to
            reported = info.max_num_seqs if info is not None else 0
            bound = 2 * (reported if reported > 0 else DEFAULT_MAX_NUM_SEQS)
        own = self._config.max_inflight_per_worker
        return min(own, bound) if own > 0 else bound

    @asynccontextmanager
    async def admit(
        self,
        role: Role,
        pick: Pick,
        *,
        exclude: frozenset[str] = frozenset(),
        deadline: Deadline = NO_DEADLINE,
    ) -> AsyncIterator[Slot]:
        """A worker of `role` (not in `exclude`) with room, chosen by `pick` among those with
        room, held for the block. Waits in the queue when none has room, or when others wait
        already (first come, first served)."""
        endpoint = None if self._waiters else self._try(role, pick, exclude)
        if endpoint is None:
            waiter = _Waiter(role, pick, exclude, asyncio.get_running_loop().create_future())
            endpoint = await self._wait(waiter, deadline)
        slot = Slot(endpoint)
        try:
            yield slot
        finally:
            if slot.endpoint is not None:
                self._release(slot.endpoint)

    async def move(
        self,
        slot: Slot,
        pick: Pick,
        *,
        role: Role | None = None,
        exclude: frozenset[str] = frozenset(),
        deadline: Deadline = NO_DEADLINE,
    ) -> Endpoint:
        """Gives up the slot's worker and waits, ahead of every request that came later, for a
        worker of `role` (the given-up worker's by default) with room, not in `exclude` (the
        one given up may be chosen again). For a request its worker refused at capacity or
        while draining, or that continues elsewhere after its worker failed."""
        given_up, slot.endpoint = slot.endpoint, None
        if given_up is None:
            raise RuntimeError("the slot holds no worker to move from")
        self._release(given_up, ran=False)
        role = role or given_up.role
        endpoint = self._try(role, pick, exclude)
        if endpoint is None:
            waiter = _Waiter(role, pick, exclude, asyncio.get_running_loop().create_future())
            endpoint = await self._wait(waiter, deadline, first=True)
        slot.endpoint = endpoint
        return endpoint

    def _candidates(self, role: Role, exclude: frozenset[str]) -> list[Endpoint]:
        return [
            e
            for e in self._pool.routable(role)
            if e.address not in exclude and not e.full and e.admitted + e.elsewhere < self.limit(e)
        ]

    def serviceable(self, role: Role, exclude: Collection[str] = ()) -> bool:
        """Some worker of `role` outside `exclude` is routable now or soon: its breaker is not
        open and it says it serves (one loading its model or draining is not soon)."""
        return any(
            e.role == role
            and e.address not in exclude
            and e.serving
            and e.breaker.state is not BreakerState.OPEN
            for e in self._pool.endpoints
        )

    def _try(self, role: Role, pick: Pick, exclude: frozenset[str]) -> Endpoint | None:
        candidates = self._candidates(role, exclude)
        if not candidates:
            return None
        endpoint = pick(candidates)
        endpoint.admitted += 1
        endpoint.breaker.start_request()
        return endpoint

    async def _wait(self, waiter: _Waiter, deadline: Deadline, *, first: bool = False) -> Endpoint:
        # Queued behind those already waiting (`first`: ahead of them, a request that had a
        # worker already); served at once if a slot is free for it (a waiter ahead may be
        # unable to use it), refused (503) if no worker can serve it.
        if first:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        self._dispatch()
        if waiter.granted.done():
            return waiter.granted.result()
        if not first and len(self._waiters) > self._config.max_queued_requests:
            self._waiters.remove(waiter)
            self._report_queue()
            REJECTED.labels("queue_full").inc()
            raise errors.queue_full(self._config.max_queued_requests, RETRY_AFTER_S)
        timeout = self._config.queue_timeout_s or None
        remaining = deadline.remaining()
        if remaining is not None:
            timeout = remaining if timeout is None else min(timeout, remaining)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                return await waiter.granted
        except BaseException as error:
            # A worker granted just as the wait ended (timeout, or the client went away)
            # before this task resumed: give the slot back.
            granted = waiter.granted
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self._release(granted.result())
            if not isinstance(error, TimeoutError):
                raise
            if deadline.expired():
                raise deadline.exceeded() from None
            REJECTED.labels("queue_timeout").inc()
            raise errors.queue_timeout(round(time.monotonic() - started, 1), RETRY_AFTER_S) from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            self._report_queue()

    def _report_queue(self) -> None:
        QUEUE_DEPTH.set(len(self._waiters))
        by_role = dict.fromkeys(Role, 0)
        for waiter in self._waiters:
            by_role[waiter.role] += 1
        for role, count in by_role.items():
            QUEUED.labels(str(role)).set(count)

    def _release(self, endpoint: Endpoint, *, ran: bool = True) -> None:
        endpoint.admitted -= 1
        if ran:
            # One of this gateway's requests there ended: the worker has room, unless another
            # gateway takes it first (then it refuses again). One it refused frees nothing.
            endpoint.full = False
        endpoint.breaker.end_request()
        self._dispatch()

    def _schedule_dispatch(self) -> None:
        # Called from breaker transitions, which may happen inside `_dispatch` itself (a
        # breaker's cool-down is noticed when its state is read): run it on the next turn.
        if self._dispatch_scheduled or not self._waiters:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, so nobody can be waiting
        self._dispatch_scheduled = True
        loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Hands free slots to waiters in arrival order; fails the waiters no worker can serve."""
        self._dispatch_scheduled = False
        for waiter in list(self._waiters):
            if waiter.granted.done():
                self._waiters.remove(waiter)
                continue
            endpoint = self._try(waiter.role, waiter.pick, waiter.exclude)
            if endpoint is not None:
                waiter.granted.set_result(endpoint)
            elif not self.serviceable(waiter.role, waiter.exclude):
                REJECTED.labels("no_workers").inc()
                waiter.granted.set_exception(errors.no_workers(waiter.role))
            else:
                continue
            self._waiters.remove(waiter)
        self._report_queue()
