"""What the planner sees of a fleet at one tick, and what it asks for: the same types whether
the fleet is live (observe.py reads the gateways' /metrics) or simulated (sim/observer.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.config.roles import Role


@dataclass(frozen=True)
class Counts:
    """Workers per role: a fleet's shape (`XpYd`, or `Npd` colocated)."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.colocated) < 0:
            raise ValueError(f"worker counts must be >= 0: {self}")

    @classmethod
    def of(cls, by_role: dict[Role, int]) -> Counts:
        return cls(by_role.get(Role.PREFILL, 0), by_role.get(Role.DECODE, 0), by_role.get(Role.BOTH, 0))

    def get(self, role: Role) -> int:
        return {Role.PREFILL: self.prefill, Role.DECODE: self.decode, Role.BOTH: self.colocated}[role]

    def with_role(self, role: Role, count: int) -> Counts:
        values = {Role.PREFILL: self.prefill, Role.DECODE: self.decode, Role.BOTH: self.colocated}
        values[role] = count
        return Counts.of(values)

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.colocated

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0 or self.decode > 0

    @property
    def name(self) -> str:
        if self.disaggregated and self.colocated:
            return f"{self.prefill}p{self.decode}d+{self.colocated}pd"
        if self.disaggregated:
            return f"{self.prefill}p{self.decode}d"
        return "pd" if self.colocated == 1 else f"{self.colocated}pd"


@dataclass(frozen=True)
class RoleLoad:
    """One role's workers as polled: how many in each state, and their engines' load."""

    ready: int = 0
    starting: int = 0
    retiring: int = 0
    running: int = 0  # sequences running in the ready workers' engines
    waiting: int = 0  # sequences waiting in their engines
    kv_usage: float = 0.0  # mean over ready workers, 0..1


@dataclass(frozen=True)
class Observation:
    """The fleet over the last window (rates per second; latencies in seconds)."""

    now: float
    window_s: float
    arrival_rate: float
    isl_mean: float | None = None  # prompt tokens of requests in the window
    osl_mean: float | None = None  # completion tokens of requests finished in the window
    ttft_q: float | None = None  # the attainment quantile of TTFT in the window
    itl_q: float | None = None  # the attainment quantile of the gaps between tokens
    queue_depth: int = 0  # requests waiting in the gateways for a worker with room
    roles: dict[Role, RoleLoad] = field(default_factory=dict)

    def role(self, role: Role) -> RoleLoad:
        return self.roles.get(role, RoleLoad())
