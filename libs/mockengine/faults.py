"""Faults a mock engine core injects on purpose, for the planner and chaos suites.

The option string is a comma-separated list of:
- `crash-at-step=N`: the core process exits (status 1, no goodbye) when step N begins,
  as an EngineCore that died; the client marks the engine dead.
- `stall-at-step=N:S`: step N takes S more seconds (wall clock, not scaled), as a stuck
  engine; several may be given.
- `refuse-pulls` or `refuse-pulls=all`: every KV pull this core serves (prefill side) or
  makes (decode side) fails; `refuse-pulls=K`: only the next K.
Steps count from 1, engine steps only (not messages sent while idle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL = -1


@dataclass
class FaultPlan:
    crash_at_step: int | None = None
    stalls: dict[int, float] = field(default_factory=dict)
    refused_pulls_left: int = 0  # ALL: every pull

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        plan = cls()
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            try:
                if name == "crash-at-step":
                    plan.crash_at_step = _positive(int(value))
                elif name == "stall-at-step":
                    step, _, seconds = value.partition(":")
                    plan.stalls[_positive(int(step))] = float(seconds)
                elif name == "refuse-pulls":
                    plan.refused_pulls_left = ALL if value in ("", "all") else _positive(int(value))
                else:
                    raise ValueError(f"unknown fault {name!r}")
            except ValueError as error:
                raise ValueError(
                    f"bad mock fault {item!r} ({error}); expected crash-at-step=N, stall-at-step=N:SECONDS,"
                    " refuse-pulls[=all|K]"
                ) from None
        return plan

    def crashes_at(self, step: int) -> bool:
        return self.crash_at_step == step

    def stall_seconds(self, step: int) -> float:
        return self.stalls.get(step, 0.0)

    def take_pull_refusal(self) -> bool:
        """Whether this pull is to fail (and counts it against refuse-pulls=K)."""
        if self.refused_pulls_left == ALL:
            return True
        if self.refused_pulls_left > 0:
            self.refused_pulls_left -= 1
            return True
        return False


def _positive(value: int) -> int:
    if value < 1:
        raise ValueError(f"{value} is not a positive count")
    return value
