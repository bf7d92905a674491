"""Interleaved rounds for `tools/bench:compare`, and the statistics over them.

Why rounds: on a shared machine one run per system ranks nothing (the same cleave-pd ÷ vllm
comparison gave throughput ratios of 0.74 and 1.01 on two runs, issue 17). So every system
runs once per round, the order rotated each round (a system is not always first, on a cold
machine, or last, after the others heated it), each ratio is taken within a round, and the
report gives each ratio's median and its spread (min to max) over the rounds.

Also here: goodput at SLO pairs (TTFT and each request's own p99 inter-token gap), and CPU
milliseconds per generated token by process role (tools/bench/proc_cpu.py's roles).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tools.bench.records import RequestRecord
from tools.bench.systems.tables import SystemOutcome, ratios


def round_orders(systems: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """Round r runs the systems rotated left by r: each system takes each position in turn."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    n = len(systems)
    return [tuple(systems[(r + i) % n] for i in range(n)) for r in range(rounds)] if n else []


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int  # rounds with a value

    def cell(self, digits: int = 2) -> str:
        if self.n == 1:
            return f"{self.median:.{digits}f} (1 round)"
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}–{self.high:.{digits}f}]"


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median, min and max of the finite values; None when there are none."""
    found = [v for v in values if v is not None and math.isfinite(v)]
    if not found:
        return None
    return Spread(statistics.median(found), min(found), max(found), len(found))


@dataclass(frozen=True)
class SloPair:
    """Goodput counts a request that met both: TTFT and its own p99 gap between tokens."""

    ttft_ms: float
    itl_p99_ms: float

    @property
    def label(self) -> str:
        return f"TTFT ≤ {self.ttft_ms:g} ms, ITL p99 ≤ {self.itl_p99_ms:g} ms"

    @property
    def key(self) -> str:
        return f"goodput_ttft{self.ttft_ms:g}_itl{self.itl_p99_ms:g}"


# The TTFT ≤ 2 s with an inter-token bound a reader of a stream notices (100 ms: about
# 3x SmolLM2's CPU decode step at batch 8 here), and a relaxed pair for loaded CPU runs.
DEFAULT_SLO_PAIRS = (SloPair(2000.0, 100.0), SloPair(5000.0, 250.0))


def parse_slo_pair(text: str) -> SloPair:
    """'2000:100' -> TTFT ≤ 2000 ms and ITL p99 ≤ 100 ms."""
    ttft, sep, itl = text.partition(":")
    try:
        pair = SloPair(float(ttft), float(itl))
    except ValueError:
        pair = None
    if not sep or pair is None or not (pair.ttft_ms > 0 and pair.itl_p99_ms > 0):
        raise ValueError(f"an SLO pair is TTFT_MS:ITL_P99_MS with both > 0, got {text!r}")
    return pair


def request_itl_p99_ms(record: RequestRecord) -> float:
    """The request's own 99th-percentile gap between content chunks (0 with fewer than 2)."""
    if not record.itl_s:
        return 0.0
    return float(np.percentile(np.asarray(record.itl_s, dtype=float), 99)) * 1000.0


def goodput(records: Sequence[RequestRecord], duration_s: float, pair: SloPair) -> float:
    """Completed requests per second that met both objectives of `pair`."""
    if duration_s <= 0:
        return 0.0
    met = sum(
        1
        for r in records
        if r.ok
        and r.ttft_s is not None
        and r.ttft_s * 1000.0 <= pair.ttft_ms
        and request_itl_p99_ms(r) <= pair.itl_p99_ms
    )
    return met / duration_s


def cpu_ms_per_token(cpu_s: Mapping[str, float], output_tokens: int) -> dict[str, float]:
    """CPU milliseconds per generated token by role, plus `serving` (all but the engine)."""
    if output_tokens <= 0:
        return {}
    per = {role: seconds * 1000.0 / output_tokens for role, seconds in cpu_s.items()}
    per["serving"] = sum(v for role, v in per.items() if role != "engine")
    return per


@dataclass(frozen=True)
class RatioSpread:
    system: str
    peer: str
    metric: str
    spread: Spread | None
    values: tuple[float | None, ...]  # one per round, in round order


def ratio_spreads(rounds: Sequence[Sequence[SystemOutcome]]) -> list[RatioSpread]:
    """Each Cleave ÷ peer ratio taken within each round, then its median and spread."""
    per_key: dict[tuple[str, str, str], list[float | None]] = {}
    for r, outcomes in enumerate(rounds):
        for ratio in ratios(outcomes):
            values = per_key.setdefault((ratio.system, ratio.peer, ratio.metric), [None] * len(rounds))
            values[r] = ratio.value
    return [RatioSpread(s, p, m, spread(v), tuple(v)) for (s, p, m), v in per_key.items()]


def _systems(rounds: Sequence[Sequence[SystemOutcome]]) -> list[str]:
    return list(dict.fromkeys(o.system for outcomes in rounds for o in outcomes))


def _by_system(rounds: Sequence[Sequence[SystemOutcome]], system: str) -> list[SystemOutcome | None]:
    return [next((o for o in outcomes if o.system == system), None) for outcomes in rounds]


def metric_spreads(rounds: Sequence[Sequence[SystemOutcome]]) -> dict[str, dict[str, Spread | None]]:
    """system -> metric key (METRICS, then the goodput keys) -> median and spread over rounds."""
    found: dict[str, dict[str, Spread | None]] = {}
    for system in _systems(rounds):
        per_round = [{**o.values(), **o.goodput} if o is not None else {} for o in _by_system(rounds, system)]
        keys = list(dict.fromkeys(k for values in per_round for k in values))
        found[system] = {key: spread([values.get(key) for values in per_round]) for key in keys}
    return found


def cpu_spreads(rounds: Sequence[Sequence[SystemOutcome]]) -> dict[str, dict[str, Spread | None]]:
    """system -> role -> CPU ms per generated token, median and spread over rounds."""
    found: dict[str, dict[str, Spread | None]] = {}
    for system in _systems(rounds):
        per_round = [
            cpu_ms_per_token(o.cpu_s, o.summary.output_tokens) if o is not None and o.summary else {}
            for o in _by_system(rounds, system)
        ]
        roles = sorted({role for p in per_round for role in p}, key=lambda r: (r == "serving", r))
        if roles:
            found[system] = {role: spread([p.get(role) for p in per_round]) for role in roles}
    return found
