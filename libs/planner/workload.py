"""What a fleet is asked to serve: an arrival rate (constant or a piecewise trace) and the
prompt (ISL) and output (OSL) length distributions, in tokens.

A length distribution is a mixture of uniform components, written `MEAN[:SPREAD][@WEIGHT]`
and separated by commas: `2000:0.5` is uniform in [1000, 3000]; `40:0.5@0.85,1900:0.1@0.15`
is tools/bench's long-interference mix (85% short prompts, 15% long ones). SPREAD is the
half-width relative to the mean, as tools/bench's --len-spread; WEIGHT defaults to 1 and
weights are normalised.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from libs.config.errors import ConfigError


@dataclass(frozen=True)
class Uniform:
    mean: float
    spread: float = 0.0  # half-width / mean, in [0, 1)

    def __post_init__(self) -> None:
        if not self.mean >= 1 or not 0 <= self.spread < 1:
            raise ValueError(f"a length component needs mean >= 1 and 0 <= spread < 1, got {self}")

    @property
    def low(self) -> int:
        return max(1, round(self.mean * (1 - self.spread)))

    @property
    def high(self) -> int:
        return max(self.low, round(self.mean * (1 + self.spread)))

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def moment(self, power: int) -> float:
        """E[L**power] over the integers low..high."""
        values = range(self.low, self.high + 1)
        return sum(v**power for v in values) / len(values)


@dataclass(frozen=True)
class Lengths:
    """A mixture of uniform components (weights sum to 1)."""

    components: tuple[tuple[float, Uniform], ...]

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("a length distribution needs a component")
        total = sum(weight for weight, _ in self.components)
        if not abs(total - 1.0) < 1e-9:
            raise ValueError(f"component weights must sum to 1, got {total}")

    @classmethod
    def fixed(cls, mean: float, spread: float = 0.0) -> Lengths:
        return cls(((1.0, Uniform(mean, spread)),))

    def sample(self, rng: random.Random) -> int:
        pick = rng.random()
        for weight, component in self.components:
            pick -= weight
            if pick < 0:
                return component.sample(rng)
        return self.components[-1][1].sample(rng)

    def moment(self, power: int) -> float:
        return sum(weight * component.moment(power) for weight, component in self.components)

    @property
    def mean(self) -> float:
        return self.moment(1)

    @property
    def high(self) -> int:
        return max(component.high for _, component in self.components)

    def text(self) -> str:
        parts = []
        for weight, component in self.components:
            part = f"{component.mean:g}"
            if component.spread:
                part += f":{component.spread:g}"
            if len(self.components) > 1:
                part += f"@{weight:g}"
            parts.append(part)
        return ",".join(parts)


def parse_lengths(flag: str, text: str) -> Lengths:
    """`MEAN[:SPREAD][@WEIGHT],...` -> Lengths (ConfigError naming `flag` when malformed)."""
    raw: list[tuple[float, Uniform]] = []
    try:
        for part in text.split(","):
            body, _, weight = part.strip().partition("@")
            mean, _, spread = body.partition(":")
            raw.append((float(weight) if weight else 1.0, Uniform(float(mean), float(spread or 0))))
        total = sum(weight for weight, _ in raw)
        if not raw or total <= 0 or any(weight <= 0 for weight, _ in raw):
            raise ValueError("weights must be > 0")
        return Lengths(tuple((weight / total, component) for weight, component in raw))
    except ValueError:
        raise ConfigError(
            flag, text, "MEAN[:SPREAD][@WEIGHT],... with MEAN >= 1, 0 <= SPREAD < 1, WEIGHT > 0"
        ) from None


@dataclass(frozen=True)
class RateTrace:
    """Requests per second, piecewise constant: `(start_s, rate)` steps from time 0."""

    steps: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0][0] != 0:
            raise ValueError("a rate trace starts at time 0")
        starts = [start for start, _ in self.steps]
        if starts != sorted(starts) or any(rate < 0 for _, rate in self.steps):
            raise ValueError(f"a rate trace needs increasing start times and rates >= 0: {self.steps}")

    @classmethod
    def constant(cls, rate: float) -> RateTrace:
        return cls(((0.0, rate),))

    @classmethod
    def step(cls, base: float, factor: float, start_s: float, length_s: float) -> RateTrace:
        """`base` req/s, then `base * factor` from start_s for length_s, then base again."""
        return cls(((0.0, base), (start_s, base * factor), (start_s + length_s, base)))

    def rate_at(self, t: float) -> float:
        rate = self.steps[0][1]
        for start, value in self.steps:
            if start > t:
                break
            rate = value
        return rate

    def next_change(self, t: float) -> float | None:
        return next((start for start, _ in self.steps if start > t), None)

    @property
    def peak(self) -> float:
        return max(rate for _, rate in self.steps)


@dataclass(frozen=True)
class Workload:
    rate: RateTrace
    isl: Lengths
    osl: Lengths

    @classmethod
    def simple(cls, rate: float, isl: float, osl: float, spread: float = 0.0) -> Workload:
        return cls(RateTrace.constant(rate), Lengths.fixed(isl, spread), Lengths.fixed(osl, spread))

    def at_rate(self, rate: float) -> Workload:
        return Workload(RateTrace.constant(rate), self.isl, self.osl)

    def describe(self) -> str:
        steps = self.rate.steps
        rate = (
            f"{steps[0][1]:g} req/s"
            if len(steps) == 1
            else "trace " + ", ".join(f"{rate:g}@{start:g}s" for start, rate in steps)
        )
        return f"{rate}, ISL {self.isl.text()}, OSL {self.osl.text()}"
