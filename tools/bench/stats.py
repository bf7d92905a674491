"""Aggregate statistics of a run (pure functions over RequestRecords)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tools.bench.config import Slos
from tools.bench.records import RequestRecord

PERCENTILES = (50, 90, 99)
MAX_ERROR_MESSAGES = 5


@dataclass(frozen=True)
class Distribution:
    """A latency distribution in milliseconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class Summary:
    duration_s: float
    requests: int  # started
    completed: int  # finished without error
    errors: int
    error_messages: tuple[str, ...]  # the first distinct ones, in start order
    input_tokens: int
    output_tokens: int
    request_throughput: float  # completed requests/s
    output_throughput: float  # output tokens/s
    total_token_throughput: float  # (input + output) tokens/s
    goodput: float | None  # completed requests/s meeting every SLO; None without SLOs
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    e2e_ms: Distribution | None


def tpot_s(record: RequestRecord) -> float | None:
    """Time per output token after the first: (E2E - TTFT) / (output_tokens - 1)."""
    if record.ttft_s is None or record.e2e_s is None or record.output_tokens <= 1:
        return None
    return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)


def distribution(values_s: Iterable[float]) -> Distribution | None:
    """Mean and percentiles (numpy's linear interpolation) of seconds, in ms; None if empty."""
    ms = np.asarray(list(values_s), dtype=float) * 1000.0
    if ms.size == 0:
        return None
    p50, p90, p99 = (float(v) for v in np.percentile(ms, PERCENTILES))
    return Distribution(count=int(ms.size), mean=float(ms.mean()), p50=p50, p90=p90, p99=p99)


def meets_slos(record: RequestRecord, slos: Slos) -> bool:
    """Whether a successful request met every given SLO. A request with one output token
    has no TPOT and so cannot miss a TPOT objective."""
    if not record.ok:
        return False
    checks = [
        (slos.ttft_ms, record.ttft_s),
        (slos.tpot_ms, tpot_s(record) or 0.0),
        (slos.e2e_ms, record.e2e_s),
    ]
    return all(limit is None or (value is not None and value * 1000.0 <= limit) for limit, value in checks)


def input_tokens(record: RequestRecord) -> int:
    """The server's prompt token count when it reported one, else the workload's estimate."""
    return record.prompt_tokens if record.prompt_tokens is not None else record.input_len


def summarize(records: Sequence[RequestRecord], duration_s: float, slos: Slos) -> Summary:
    """Summary of a run that took `duration_s` from the first request to the last answer."""
    ok = [r for r in records if r.ok]
    messages: list[str] = []
    for record in sorted(records, key=lambda r: r.start_s):
        if record.error is not None and record.error not in messages and len(messages) < MAX_ERROR_MESSAGES:
            messages.append(record.error)
    in_tokens = sum(input_tokens(r) for r in ok)
    out_tokens = sum(r.output_tokens for r in ok)

    def per_second(amount: float) -> float:
        return amount / duration_s if duration_s > 0 else 0.0

    tpots = [t for t in (tpot_s(r) for r in ok) if t is not None]
    return Summary(
        duration_s=duration_s,
        requests=len(records),
        completed=len(ok),
        errors=len(records) - len(ok),
        error_messages=tuple(messages),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        request_throughput=per_second(len(ok)),
        output_throughput=per_second(out_tokens),
        total_token_throughput=per_second(in_tokens + out_tokens),
        goodput=per_second(sum(meets_slos(r, slos) for r in ok)) if slos.any else None,
        ttft_ms=distribution(r.ttft_s for r in ok if r.ttft_s is not None),
        tpot_ms=distribution(tpots),
        itl_ms=distribution(gap for r in ok for gap in r.itl_s),
        e2e_ms=distribution(r.e2e_s for r in ok if r.e2e_s is not None),
    )
