"""How the planner changes a fleet: a connector reports each role's workers and scales a role
to a count. Removing a worker always drains it: it is retired from routing first and stopped
(SIGTERM) only once its requests have finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from libs.config.roles import Role
from libs.planner.state import Counts


@dataclass(frozen=True)
class FleetState:
    desired: Counts  # workers asked for and not being removed (starting + ready)
    starting: dict[Role, int] = field(default_factory=dict)
    retiring: dict[Role, int] = field(default_factory=dict)


class Connector(Protocol):
    async def state(self) -> FleetState: ...

    async def scale_to(self, target: Counts, load: dict[str, float] | None = None) -> None:
        """Starts or drains workers of each role to reach `target`. `load`: requests in
        flight per worker address (the least loaded are removed first)."""
        ...

    async def close(self) -> None: ...
