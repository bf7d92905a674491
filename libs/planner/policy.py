"""The control law: from an Observation and the fleet's current counts to the counts wanted.

Each tick:
1. Load. The arrival rate of the last window, and a forecast one start-up time ahead (the
   recent trend, never below the present rate nor above 1.5 times it), since a worker asked
   for now serves only after it has started. Prompt and output lengths: the window's means (the last known when
   the window had none).
2. Capacity. What one worker of each role sustains within the objectives (capacity.py) at
   those lengths, planned at `utilization` of it.
3. Backlog. Requests waiting (the gateways' queue, the engines' waiting sequences) are work
   to drain within `drain_s` on top of the arrivals.
4. Feedback. An objective missed in the window adds one worker to the role that owns it
   (TTFT: prefill, or the colocated workers; ITL: decode) unless one is already starting or
   a backlog (more than a second of arrivals) explains it: the model is first-order and the
   fleet's real behaviour wins.
5. Up at once, down slowly (hysteresis): a role shrinks only when even at `down_utilization`
   (lower than `utilization`) it needs fewer workers, for `down_delay_s` on end, and by at
   most `down_step` per tick; starting workers count as present so none is asked for twice.
6. Within each role's [min, max].

Which roles it sizes follows the fleet: colocated workers (`pd`) or prefill and decode.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from libs.config.roles import Role
from libs.planner.capacity import Capacity, Engine, Shape, capacity
from libs.planner.slo import Slo
from libs.planner.state import Counts, Observation

DEFAULT_SHAPE = Shape.of_means(1000.0, 200.0)  # until the fleet has served a request
TREND_WINDOWS = 6  # windows the rate trend is fitted over
MAX_FORECAST_FACTOR = 1.5  # the forecast never exceeds the present rate by more


@dataclass(frozen=True)
class PolicyConfig:
    slo: Slo
    minimum: Counts
    maximum: Counts
    startup_s: float
    interval_s: float = 10.0
    utilization: float = 0.85  # of the predicted capacity, when adding workers
    down_utilization: float = 0.6  # ... when removing them (the hysteresis band)
    down_delay_s: float = 60.0
    down_step: int = 1
    drain_s: float = 30.0  # how fast a backlog should be worked off
    feedback: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.down_utilization <= self.utilization <= 1:
            raise ValueError("need 0 < down_utilization <= utilization <= 1")
        for role in Role:
            if self.minimum.get(role) > self.maximum.get(role):
                raise ValueError(
                    f"{role.value}: minimum {self.minimum.get(role)} > maximum {self.maximum.get(role)}"
                )
        if self.interval_s <= 0 or self.drain_s <= 0 or self.startup_s < 0:
            raise ValueError("interval_s and drain_s must be > 0, startup_s >= 0")


@dataclass(frozen=True)
class Decision:
    target: Counts
    forecast_rate: float
    capacity: Capacity
    reasons: tuple[str, ...] = ()


@dataclass
class Policy:
    config: PolicyConfig
    engine: Engine
    _rates: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=TREND_WINDOWS))
    _isl: float | None = None
    _osl: float | None = None
    _below_since: dict[Role, float] = field(default_factory=dict)
    last: Decision | None = None

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    @property
    def quantile(self) -> float:
        return self.config.slo.attainment

    def shape(self) -> Shape:
        if self._isl is None or self._osl is None:
            return DEFAULT_SHAPE
        return Shape.of_means(self._isl, self._osl)

    def forecast(self, now: float, rate: float) -> float:
        """The rate one start-up time ahead: the last windows' linear trend, never below now."""
        self._rates.append((now, rate))
        if len(self._rates) < 3:
            return rate
        ts = [t for t, _ in self._rates]
        rs = [r for _, r in self._rates]
        t_mean, r_mean = sum(ts) / len(ts), sum(rs) / len(rs)
        var = sum((t - t_mean) ** 2 for t in ts)
        slope = sum((t - t_mean) * (r - r_mean) for t, r in zip(ts, rs, strict=True)) / var if var else 0.0
        # Bounded: a step in the rate is not a trend to extrapolate for a whole start-up.
        return min(max(rate, rate + slope * self.config.startup_s), MAX_FORECAST_FACTOR * rate)

    def decide(self, observation: Observation, current: Counts) -> Counts:
        return self.decide_in_full(observation, current).target

    def decide_in_full(self, observation: Observation, current: Counts) -> Decision:
        cfg = self.config
        if observation.isl_mean:
            self._isl = observation.isl_mean
        if observation.osl_mean:
            self._osl = observation.osl_mean
        rate = self.forecast(observation.now, observation.arrival_rate)
        caps = capacity(self.engine, self.shape(), cfg.slo)
        roles = (
            [Role.BOTH] if current.colocated and not current.disaggregated else [Role.PREFILL, Role.DECODE]
        )
        reasons: list[str] = []
        target = current
        for role in roles:
            per_worker = {Role.PREFILL: caps.prefill, Role.DECODE: caps.decode, Role.BOTH: caps.colocated}[
                role
            ]
            backlog = self._backlog(observation, role) / cfg.drain_s
            up = _workers(rate + backlog, per_worker * cfg.utilization)
            down = _workers(rate + backlog, per_worker * cfg.down_utilization)
            have = current.get(role)
            starting = observation.role(role).starting
            # Misses a backlog explains are the backlog term's; others mean the model is off.
            if (
                cfg.feedback
                and starting == 0
                and backlog * cfg.drain_s <= rate
                and self._missed(observation, role)
            ):
                up = max(up, have + 1)
                reasons.append(f"{role.value}: objective missed, +1")
            wanted = self._hysteresis(role, observation.now, have, up, down)
            wanted = min(max(wanted, cfg.minimum.get(role)), cfg.maximum.get(role))
            if wanted != have:
                reasons.append(
                    f"{role.value}: {have} -> {wanted} (rate {rate:.2f}/s, {per_worker:.2f}/s per worker)"
                )
            target = target.with_role(role, wanted)
        self.last = Decision(target, rate, caps, tuple(reasons))
        return self.last

    def _backlog(self, observation: Observation, role: Role) -> float:
        waiting = observation.role(role).waiting
        # The gateways' queue holds requests for whichever role is full; the decode slot is
        # taken first (or the colocated one), so that is where it counts.
        if role in (Role.DECODE, Role.BOTH):
            waiting += observation.queue_depth
        return float(waiting)

    def _missed(self, observation: Observation, role: Role) -> bool:
        slo = self.config.slo
        ttft_missed = observation.ttft_q is not None and observation.ttft_q > slo.ttft_s
        itl_missed = observation.itl_q is not None and observation.itl_q > slo.itl_s
        if role is Role.BOTH:
            return ttft_missed or itl_missed
        return ttft_missed if role is Role.PREFILL else itl_missed

    def _hysteresis(self, role: Role, now: float, have: int, up: int, down: int) -> int:
        if up > have:
            self._below_since.pop(role, None)
            return up
        if down >= have:
            self._below_since.pop(role, None)
            return have
        since = self._below_since.setdefault(role, now)
        if now - since < self.config.down_delay_s:
            return have
        self._below_since[role] = now  # the next step down waits its own delay
        return max(down, have - self.config.down_step)


def _workers(rate: float, per_worker: float) -> int:
    if rate <= 0:
        return 0
    if per_worker <= 0:
        return 10**6  # the objectives cannot be met by this role: as many as allowed
    return math.ceil(rate / per_worker - 1e-9)
