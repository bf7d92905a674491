"""A worker's drain on SIGTERM (libs/rpc/server.py calls `WorkerService.drain` with a deadline).

1. From the signal on, health says NOT_SERVING (the gateway's health watch stops routing here
   at once) and new requests are refused with a draining UNAVAILABLE (libs/rpc/draining.py):
   nothing of them ran, so the gateway sends them to another worker.
2. Running requests finish. A prefill worker also waits for the KV it holds for decode
   workers (its leases), which they pull within moments of the prefill, or the lease ends.
3. What has not finished a short while before the deadline is handed off: each request ends
   with the draining UNAVAILABLE, which the gateway takes as this worker's failure and moves
   the request to another decode worker from the tokens already streamed (migration: text
   only; a structured-output or n > 1 stream ends with its error event instead), and the
   engine aborts it, freeing its KV.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

import structlog

from libs.rpc import draining
from libs.worker import metrics
from libs.worker.errors import EngineUnavailable

log = structlog.get_logger(__name__)

# Of the drain's time, what is kept for handing off the requests still running at its end
# (the engine aborts them, their streams end): this much, or a fifth of the drain if less.
HANDOFF_RESERVE_S = 3.0
POLL_S = 0.05


class WorkerDraining(EngineUnavailable):
    """This worker is shutting down: gRPC UNAVAILABLE (ERROR_CODE_OVERLOADED mid-stream), with
    details the gateway recognizes as a draining refusal (libs/rpc/draining.py)."""


REFUSED = draining.message("this worker is shutting down and takes no new requests")
HANDED_OFF = draining.message("the worker's shutdown grace ended before this request; continue it elsewhere")


class DrainState:
    """Whether the worker still takes requests, and which of its running ones it gave up."""

    def __init__(self) -> None:
        self.draining = False
        self._handed_off: set[str] = set()
        self._listeners: set[Callable[[], None]] = set()

    def begin(self) -> None:
        """From now on new requests are refused; listeners (each open GenerateMany call, which
        ends once its requests have) are told."""
        self.draining = True
        for listener in list(self._listeners):
            listener()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Calls `listener()` when the drain begins; returns the unsubscribe function."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def check_accepting(self) -> None:
        """Raises WorkerDraining once the drain has begun."""
        if self.draining:
            metrics.DRAIN_REFUSED.inc()
            raise WorkerDraining(REFUSED)

    def check_running(self, request_id: str) -> None:
        """Raises WorkerDraining for a request that was handed off (checked at every step)."""
        if request_id in self._handed_off:
            raise WorkerDraining(HANDED_OFF)

    def hand_off(self, request_ids: Collection[str]) -> None:
        self._handed_off.update(request_ids)
        metrics.DRAIN_HANDED_OFF.inc(len(request_ids))


async def wait_until(done: Callable[[], bool], deadline: float) -> bool:
    """Polls `done` until it holds (True) or the loop time passes `deadline` (False)."""
    loop = asyncio.get_running_loop()
    while not done():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(POLL_S, max(deadline - loop.time(), 0.0)))
    return True


def handoff_time(now: float, deadline: float) -> float:
    """When the drain stops waiting and hands off what is still running."""
    return deadline - min(HANDOFF_RESERVE_S, max(deadline - now, 0.0) / 5)


async def drain_worker(
    state: DrainState,
    running: Collection[str],
    leased: Callable[[], int],
    abort: Callable[[str], Awaitable[None]],
    deadline: float,
) -> None:
    """Steps 1-3 above for a worker whose running requests are `running` (a live view), whose
    KV held for decode workers is `leased()`, and whose engine aborts a request with `abort`;
    `deadline` is the loop's time."""
    state.begin()
    loop = asyncio.get_running_loop()
    log.info("draining", running=len(running), leased=leased())
    idle = await wait_until(lambda: not running and not leased(), handoff_time(loop.time(), deadline))
    if idle:
        log.info("drained: every request finished")
        return
    left = sorted(running)
    if left:
        log.warning("handing off the requests the shutdown grace leaves no time for", requests=len(left))
        state.hand_off(left)
        await asyncio.gather(*(abort(request_id) for request_id in left))
        await wait_until(lambda: not running, deadline)
    log.info("drained", handed_off=len(left), still_leased=leased())
