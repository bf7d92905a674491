"""Service-level objectives and whether a request met them.

A request meets the objectives when its TTFT is at most `ttft_s` and its ITL is at most
`itl_s`, where a request's ITL is, by `itl_stat`:
- `mean`: its mean gap after the first token, (last - first) / (tokens - 1), the TPOT that
  DistServe's goodput and tools/bench's `--goodput tpot:` use;
- `p99`: the 99th percentile of its own gaps (numpy's linear interpolation), what
  tools/bench:compare's `--slo TTFT_MS:ITL_P99_MS` goodput uses.

Goodput (DistServe): the highest request rate per worker at which at least `attainment` of
the requests meet both.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ITL_STATS = ("mean", "p99")


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    itl_s: float
    itl_stat: str = "mean"
    attainment: float = 0.9  # the fraction of requests that must meet both

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"SLOs must be > 0, got TTFT {self.ttft_s} s, ITL {self.itl_s} s")
        if self.itl_stat not in ITL_STATS:
            raise ValueError(f"itl_stat is one of {ITL_STATS}, got {self.itl_stat!r}")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")

    def describe(self) -> str:
        itl = "TPOT (mean ITL)" if self.itl_stat == "mean" else "ITL p99 per request"
        return (
            f"TTFT <= {self.ttft_s * 1000:g} ms and {itl} <= {self.itl_s * 1000:g} ms"
            f" for >= {self.attainment:.0%} of requests"
        )


def request_itl(gaps: Sequence[float], stat: str) -> float:
    """A request's ITL by `stat` from its gaps between tokens (0 with no gap)."""
    if not gaps:
        return 0.0
    if stat == "mean":
        return float(sum(gaps)) / len(gaps)
    return float(np.percentile(np.asarray(gaps, dtype=float), 99))


@dataclass(frozen=True)
class Outcome:
    """One finished (or failed) request, as the objectives see it."""

    arrival_s: float
    ttft_s: float | None  # None: failed before a token
    itl_mean_s: float
    itl_p99_s: float
    output_tokens: int
    ok: bool = True
    end_s: float = 0.0  # when its last token came

    def itl(self, stat: str) -> float:
        return self.itl_mean_s if stat == "mean" else self.itl_p99_s

    def meets(self, slo: Slo) -> bool:
        return (
            self.ok
            and self.ttft_s is not None
            and self.ttft_s <= slo.ttft_s
            and self.itl(slo.itl_stat) <= slo.itl_s
        )


def outcome_of(arrival_s: float, token_times: Sequence[float], ok: bool = True) -> Outcome:
    """From the times each token reached the client."""
    if not token_times:
        return Outcome(arrival_s, None, 0.0, 0.0, 0, ok=False)
    gaps = [b - a for a, b in itertools.pairwise(token_times)]
    return Outcome(
        arrival_s,
        token_times[0] - arrival_s,
        request_itl(gaps, "mean"),
        request_itl(gaps, "p99"),
        len(token_times),
        ok=ok,
        end_s=token_times[-1],
    )


def goodput(outcomes: Sequence[Outcome], slo: Slo) -> float:
    """Requests per second that met both objectives, over the run (first arrival to last
    token): tools/bench's goodput."""
    if not outcomes:
        return 0.0
    span = max(o.end_s for o in outcomes) - min(o.arrival_s for o in outcomes)
    return sum(o.meets(slo) for o in outcomes) / span if span > 0 else 0.0


def attainment(outcomes: Sequence[Outcome], slo: Slo) -> float:
    """The fraction of requests that met both objectives (1.0 for no request)."""
    if not outcomes:
        return 1.0
    return sum(o.meets(slo) for o in outcomes) / len(outcomes)
