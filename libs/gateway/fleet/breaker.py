"""A circuit breaker per worker: stop routing to a worker that keeps failing, probe it after a
cool-down, route to it again once a probe succeeds.

Only the worker's own failures count (its process unreachable, its engine unavailable, its
stats poll failing); a request the worker refuses as invalid is the client's mistake and is
never reported here (libs/gateway/serving/generate.py decides).

States:
- closed: routed to. K consecutive failed requests, or K consecutive failed stats polls,
  open it. Requests and polls keep separate streaks: a worker whose process answers polls but
  whose engine fails every request must still open, however the two interleave.
- open: not routed to for the cool-down, which doubles each time the breaker opens again
  without a request having succeeded in between (a worker that answers polls but fails
  requests is probed ever more rarely), up to `max_cooldown_s`.
- half-open (after the cool-down, or at once when the worker's health turns SERVING again):
  one request at a time is let through as a probe, and the stats poller's next GetStats is a
  probe too; the first success closes the breaker, a failure opens it again. A probe request that succeeds closes it even when the poll's probe failed
  while it ran.

A new breaker (unless told it starts closed) starts half-open: the worker's first answered
poll closes it (the pool polls every worker once before it serves).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Counter, Gauge

from libs.config.roles import Role

log = structlog.get_logger(__name__)


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


_GAUGE_VALUE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}

STATE = Gauge(
    "cleave_gateway_worker_breaker_state",
    "Circuit breaker of each worker: 0 closed (routed to), 1 half-open (probing), 2 open",
    ["worker", "role"],
    # With several API processes (--api-server-count), the worst any running one sees.
    multiprocess_mode="livemax",
)
TRANSITIONS = Counter(
    "cleave_gateway_worker_breaker_transitions_total",
    "Circuit breaker transitions of each worker, by the state entered",
    ["worker", "role", "to"],
)


@dataclass(frozen=True)
class BreakerConfig:
    failures_to_open: int = 3
    cooldown_s: float = 5.0
    max_cooldown_s: float = 60.0


class CircuitBreaker:
    def __init__(
        self,
        worker: str,
        role: Role,
        config: BreakerConfig | None = None,
        *,
        closed: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._worker = worker
        self._role = str(role)  # the metrics' and logs' label
        self._config = config or BreakerConfig()
        self._clock = clock
        self._state = BreakerState.CLOSED if closed else BreakerState.HALF_OPEN
        self._opened_at = clock()
        self._openings = 0  # times opened since a request last succeeded
        self._request_failures = 0
        self._poll_failures = 0
        self._probing = False  # a half-open probe request is in flight
        # Called with the new state on each transition (the pool's endpoint and admission).
        self.listeners: list[Callable[[BreakerState], None]] = []
        STATE.labels(worker, self._role).set(_GAUGE_VALUE[self._state])

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._enter(BreakerState.HALF_OPEN, "cool-down over")
        return self._state

    @property
    def cooldown_s(self) -> float:
        doublings = max(0, self._openings - 1)
        return min(self._config.cooldown_s * 2**doublings, self._config.max_cooldown_s)

    def available(self) -> bool:
        """Whether a request may be sent now: closed, or half-open with no probe in flight."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._probing)

    def start_request(self) -> None:
        """A request was sent; when half-open it is the probe, and no other goes until it ends."""
        if self.state is BreakerState.HALF_OPEN:
            self._probing = True

    def end_request(self) -> None:
        """The request ended in any way (its outcome, if it has one, was reported first)."""
        self._probing = False

    def request_succeeded(self) -> None:
        self._request_failures = 0
        self._openings = 0
        if self.state is not BreakerState.CLOSED:
            # The request was let through as the half-open probe. The stats poll probes at the
            # same time, and if its GetStats timed out while this request ran (a worker just
            # restarted, busy with its first prompt), it reopened the breaker meanwhile. A
            # request served end to end is the stronger evidence: close.
            self._enter(BreakerState.CLOSED, "probe request succeeded")

    def request_failed(self, reason: str) -> None:
        self._request_failures += 1
        self._failed(self._request_failures, reason)

    def poll_succeeded(self) -> None:
        # Not a request's success: it clears only the polls' streak (see the module's doc).
        self._poll_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            self._enter(BreakerState.CLOSED, "stats poll answered")

    def serving_again(self) -> None:
        """The worker's health turned SERVING (restarted, or loaded): an open breaker probes it
        now instead of at the end of a cool-down that grew while it was down (measured: a
        restarted worker idled 22 s behind a 40 s cool-down after its engine was ready)."""
        if self.state is BreakerState.OPEN:
            self._enter(BreakerState.HALF_OPEN, "worker says it serves again")

    def poll_failed(self, reason: str) -> None:
        self._poll_failures += 1
        self._failed(self._poll_failures, reason)

    def _failed(self, streak: int, reason: str) -> None:
        state = self.state
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and streak >= self._config.failures_to_open
        ):
            self._open(reason)

    def _open(self, reason: str) -> None:
        self._openings += 1
        self._opened_at = self._clock()
        self._request_failures = self._poll_failures = 0
        self._enter(BreakerState.OPEN, reason)

    def _enter(self, state: BreakerState, reason: str) -> None:
        self._state = state
        if state is BreakerState.CLOSED:
            # A streak counts failures while closed. The polls that failed while the worker was
            # down (its breaker open) must not count against it once a probe has closed it:
            # with them, one slow poll right after a restart would open it again.
            self._request_failures = self._poll_failures = 0
        STATE.labels(self._worker, self._role).set(_GAUGE_VALUE[state])
        TRANSITIONS.labels(self._worker, self._role, state.value).inc()
        level = log.warning if state is BreakerState.OPEN else log.info
        level(
            "worker circuit breaker " + state.value.replace("_", "-"),
            address=self._worker,
            role=self._role,
            reason=reason,
            cooldown_s=self.cooldown_s if state is BreakerState.OPEN else None,
        )
        for listener in self.listeners:
            listener(state)
