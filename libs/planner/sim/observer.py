"""The simulated fleet's Observation, built from what the simulation knows over a window, in
the same terms the live planner reads from the gateways' /metrics (observe.py): arrivals,
prompt and completion lengths, TTFT and the pooled gaps between tokens, queue depth, and each
role's engines."""

from __future__ import annotations

import itertools

import numpy as np

from libs.config.roles import Role
from libs.planner.sim.gateway import Flight, SimGateway
from libs.planner.sim.worker import State
from libs.planner.state import Observation, RoleLoad


class WindowObserver:
    def __init__(self, gateway: SimGateway, quantile: float) -> None:
        self.gateway = gateway
        self.quantile = quantile
        self._since = 0.0
        self._arrivals = 0
        self._isl = 0
        self._osl: list[int] = []
        self._ttft: list[float] = []
        self._gaps: list[float] = []

    def arrived(self, flight: Flight) -> None:
        self._arrivals += 1
        self._isl += flight.isl

    def finished(self, flight: Flight) -> None:
        times = flight.token_times
        if not times:
            return
        self._osl.append(len(times))
        self._ttft.append(times[0] - flight.arrival_s)
        self._gaps.extend(b - a for a, b in itertools.pairwise(times))

    def take(self, now: float) -> Observation:
        window = max(now - self._since, 1e-9)
        q = 100 * self.quantile
        observation = Observation(
            now=now,
            window_s=window,
            arrival_rate=self._arrivals / window,
            isl_mean=self._isl / self._arrivals if self._arrivals else None,
            osl_mean=float(np.mean(self._osl)) if self._osl else None,
            ttft_q=float(np.percentile(self._ttft, q)) if self._ttft else None,
            itl_q=float(np.percentile(self._gaps, q)) if self._gaps else None,
            queue_depth=self.gateway.queue_depth,
            roles={role: self._role(role) for role in Role},
        )
        self._since = now
        self._arrivals = self._isl = 0
        self._osl, self._ttft, self._gaps = [], [], []
        return observation

    def _role(self, role: Role) -> RoleLoad:
        workers = [w for w in self.gateway.workers if w.role is role]
        ready = [w for w in workers if w.state is State.READY]
        return RoleLoad(
            ready=len(ready),
            starting=sum(w.state is State.STARTING for w in workers),
            retiring=sum(w.state is State.RETIRING for w in workers),
            running=sum(w.num_running for w in ready),
            waiting=sum(w.num_waiting for w in ready),
            kv_usage=float(np.mean([w.kv_usage for w in ready])) if ready else 0.0,
        )
