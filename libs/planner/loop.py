"""The planner's control loop: every interval, read the fleet (the gateways' metrics and the
connector's counts), decide (policy.py), and ask the connector for the new counts.

Times: the policy works in the profile's seconds. On mock workers run at a time scale S
(every simulated duration S times longer on the wall clock), observed latencies are divided
by S and rates multiplied by it, and the loop waits interval_s * S between decisions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog
from prometheus_client import Counter, Gauge

from libs.config.roles import Role
from libs.planner.connectors.base import Connector
from libs.planner.observe import FleetObserver, Scrape
from libs.planner.policy import Decision, Policy
from libs.planner.state import Counts, Observation

log = structlog.get_logger(__name__)

TARGET = Gauge("cleave_planner_target_workers", "Workers of each role the planner asks for", ["role"])
CAPACITY = Gauge(
    "cleave_planner_capacity_per_worker",
    "Requests/s one worker of each role sustains within the objectives (the capacity model)",
    ["role"],
)
FORECAST = Gauge(
    "cleave_planner_forecast_rate", "Arrival rate the planner sizes for, requests/s (profile time)"
)
OBSERVED_RATE = Gauge(
    "cleave_planner_observed_rate", "Arrival rate of the last window, requests/s (profile time)"
)
CHANGES = Counter(
    "cleave_planner_changes_total", "Workers added or removed by the planner", ["role", "direction"]
)

Scraper = Callable[[], Awaitable[list[Scrape]]]


def to_profile_time(observation: Observation, time_scale: float) -> Observation:
    """Wall-clock observation -> the profile's clock (mock workers at --mock-time-scale)."""
    if time_scale == 1.0:
        return observation

    def scaled(value: float | None) -> float | None:
        return None if value is None else value / time_scale

    return replace(
        observation,
        now=observation.now / time_scale,
        window_s=observation.window_s / time_scale,
        arrival_rate=observation.arrival_rate * time_scale,
        ttft_q=scaled(observation.ttft_q),
        itl_q=scaled(observation.itl_q),
    )


class Planner:
    def __init__(
        self,
        policy: Policy,
        connector: Connector,
        scrape: Scraper,
        *,
        time_scale: float = 1.0,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.connector = connector
        self._scrape = scrape
        self._observer = FleetObserver(policy.quantile)
        self._time_scale = time_scale
        self._dry_run = dry_run
        self._clock = clock
        self.history: list[tuple[Observation, Counts, Decision | None]] = []

    async def tick(self) -> Decision | None:
        scrapes = await self._scrape()
        state = await self.connector.state()
        observation = self._observer.observe(self._clock(), scrapes, state.starting, state.retiring)
        if observation.window_s <= 0:  # the first scrape: a baseline only
            self.history.append((observation, state.desired, None))
            return None
        observation = to_profile_time(observation, self._time_scale)
        decision = self.policy.decide_in_full(observation, state.desired)
        self._export(observation, decision)
        self.history.append((observation, state.desired, decision))
        if decision.target != state.desired:
            log.info(
                "planner: resizing",
                current=state.desired.name,
                target=decision.target.name,
                reasons=list(decision.reasons),
                dry_run=self._dry_run,
            )
            for role in Role:
                change = decision.target.get(role) - state.desired.get(role)
                if change:
                    CHANGES.labels(role.value, "up" if change > 0 else "down").inc(abs(change))
            if not self._dry_run:
                await self.connector.scale_to(decision.target, _in_flight(scrapes))
        return decision

    def _export(self, observation: Observation, decision: Decision) -> None:
        for role in Role:
            TARGET.labels(role.value).set(decision.target.get(role))
        CAPACITY.labels(Role.PREFILL.value).set(decision.capacity.prefill)
        CAPACITY.labels(Role.DECODE.value).set(decision.capacity.decode)
        CAPACITY.labels(Role.BOTH.value).set(decision.capacity.colocated)
        FORECAST.set(decision.forecast_rate)
        OBSERVED_RATE.set(observation.arrival_rate)

    async def run(self) -> None:
        """Ticks until cancelled; a failed tick (a gateway or the API unreachable) is logged
        and the next one tries again: the fleet stays as it is meanwhile."""
        while True:
            try:
                await self.tick()
            except Exception as error:
                log.warning("planner: tick failed; fleet unchanged", error=repr(error))
            await asyncio.sleep(self.policy.interval_s * self._time_scale)


def _in_flight(scrapes: list[Scrape]) -> dict[str, float]:
    """Requests in flight per worker address, summed over the gateways."""
    load: dict[str, float] = {}
    for scrape in scrapes:
        for (worker, _role), value in scrape.by_worker("cleave_gateway_worker_admitted").items():
            load[worker] = load.get(worker, 0.0) + value
    return load
