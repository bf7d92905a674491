"""Runs a benchmark in-process: `await run_benchmark(config)` or `await run_sweep(config, rates)`."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import httpx
from tqdm import tqdm

from tools.bench import workloads
from tools.bench.arrival import inter_arrival_gaps
from tools.bench.client import PATHS, Exchange, Outcome, request_body, stream_request
from tools.bench.config import BenchConfig
from tools.bench.records import RequestRecord
from tools.bench.stats import Summary, summarize

# Warmup prompts come from their own random stream, so they never prime a cache with the
# measured prompts (any 32-bit user seed stays clear of it).
WARMUP_SEED_OFFSET = 2**32


class BenchError(Exception):
    """A problem that keeps the benchmark from running; its message is one line for the user."""


@dataclass(frozen=True)
class BenchResult:
    config: BenchConfig
    records: tuple[RequestRecord, ...]
    summary: Summary


class _Budget:
    """Hands out request ids until num_requests have started or the deadline has passed."""

    def __init__(self, config: BenchConfig, start: float) -> None:
        self._limit = config.num_requests
        self._deadline = None if config.duration_s is None else start + config.duration_s
        self._started = 0

    def exhausted(self, at: float | None = None) -> bool:
        """Whether a request arriving `at` (default: now) would be refused."""
        if self._limit is not None and self._started >= self._limit:
            return True
        when = time.perf_counter() if at is None else at
        return self._deadline is not None and when >= self._deadline

    def take(self) -> int | None:
        if self.exhausted():
            return None
        self._started += 1
        return self._started - 1


@contextlib.asynccontextmanager
async def _http_client(config: BenchConfig) -> AsyncIterator[httpx.AsyncClient]:
    # No pool limit below the benchmark's own: a pool queue would hide as extra TTFT.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
    async with httpx.AsyncClient(
        base_url=config.base_url, timeout=config.timeout_s, limits=limits, headers=headers
    ) as client:
        yield client


async def check_server(client: httpx.AsyncClient, config: BenchConfig) -> None:
    """Fails fast, with one line, when the server is unreachable or does not serve the model."""
    try:
        response = await client.get("/v1/models", timeout=min(10.0, config.timeout_s))
    except httpx.TransportError as exc:
        raise BenchError(f"cannot reach {config.base_url}: {exc or type(exc).__name__}") from None
    if response.status_code != httpx.codes.OK:
        return  # not every OpenAI-compatible server lists models; the requests will tell
    try:
        served = [str(model["id"]) for model in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return
    if served and config.model not in served:
        raise BenchError(
            f"{config.base_url} does not serve model {config.model!r} (it serves: {', '.join(served)})"
        )


async def _warmup(client: httpx.AsyncClient, config: BenchConfig) -> None:
    sessions = workloads.sessions(config.workload, config.seed + WARMUP_SEED_OFFSET)
    turns = [next(sessions).turns[0] for _ in range(config.warmup_requests)]
    limit = asyncio.Semaphore(config.concurrency or 1)

    async def one(turn: workloads.Turn) -> Outcome:
        async with limit:
            body = request_body(config, (), turn.text, turn.max_tokens)
            return await stream_request(client, PATHS[config.api], body)

    outcomes = await asyncio.gather(*(one(turn) for turn in turns))
    if all(outcome.error is not None for outcome in outcomes):
        raise BenchError(f"all {len(outcomes)} warmup requests failed, e.g.: {outcomes[0].error}")


def _record(
    request_id: int,
    session: workloads.Session,
    turn_index: int,
    context_len: int,
    start_s: float,
    outcome: Outcome,
) -> RequestRecord:
    turn = session.turns[turn_index]
    return RequestRecord(
        request_id=request_id,
        session_id=session.session_id,
        turn=turn_index,
        start_s=start_s,
        input_len=context_len + turn.input_len,
        max_tokens=turn.max_tokens,
        ok=outcome.error is None,
        error=outcome.error,
        ttft_s=outcome.ttft_s,
        e2e_s=outcome.e2e_s,
        itl_s=tuple(outcome.itl_s),
        output_tokens=outcome.output_tokens,
        prompt_tokens=outcome.prompt_tokens,
    )


async def _measure(client: httpx.AsyncClient, config: BenchConfig, progress: bool) -> BenchResult:
    sessions: Iterator[workloads.Session] = workloads.sessions(config.workload, config.seed)
    limit = asyncio.Semaphore(config.concurrency) if config.concurrency is not None else None
    records: list[RequestRecord] = []
    label = "closed loop" if config.rate is None else f"rate {config.rate:g}/s"
    bar = tqdm(
        total=config.num_requests, desc=f"bench ({label})", unit="req", file=sys.stderr, disable=not progress
    )
    start = time.perf_counter()
    budget = _Budget(config, start)

    async def run_session(session: workloads.Session, request_id: int | None) -> None:
        history: list[Exchange] = []
        context_len = 0  # estimated tokens of the earlier turns and answers
        for index, turn in enumerate(session.turns):
            if index > 0:
                request_id = budget.take()
            if request_id is None:
                return
            async with limit if limit is not None else contextlib.nullcontext():
                sent = time.perf_counter() - start
                body = request_body(config, history, turn.text, turn.max_tokens)
                outcome = await stream_request(client, PATHS[config.api], body)
            records.append(_record(request_id, session, index, context_len, sent, outcome))
            bar.update(1)
            if outcome.error is not None:
                return  # no answer to build the session's next turn on
            history.append(Exchange(turn.text, outcome.text))
            context_len += turn.input_len + outcome.output_tokens

    async def closed_loop_worker() -> None:
        while (request_id := budget.take()) is not None:
            await run_session(next(sessions), request_id)

    with bar:
        async with asyncio.TaskGroup() as group:
            if config.rate is None:
                for _ in range(config.concurrency or 1):
                    group.create_task(closed_loop_worker())
            else:
                # Arrivals follow an absolute schedule, so time spent dispatching never
                # accumulates into a lower rate. The first request goes out at once.
                arrival = start
                for gap in inter_arrival_gaps(config.rate, config.burstiness, config.seed):
                    delay = arrival - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    request_id = budget.take()
                    if request_id is None:
                        break
                    group.create_task(run_session(next(sessions), request_id))
                    arrival += gap
                    if budget.exhausted(at=arrival):
                        break
    duration = time.perf_counter() - start
    ordered = tuple(sorted(records, key=lambda r: r.request_id))
    return BenchResult(config, ordered, summarize(ordered, duration, config.goodput))


async def run_benchmark(config: BenchConfig, *, progress: bool = False) -> BenchResult:
    """Checks the server, sends the warmup requests, then measures one run."""
    return (await run_sweep(config, [config.rate], progress=progress))[0]


async def run_sweep(
    config: BenchConfig,
    rates: Sequence[float | None],
    *,
    progress: bool = False,
    on_result: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """One run per rate, after one server check and one warmup. Run i uses seed + i, so a
    server's prefix cache never holds a later run's prompts from an earlier run."""
    results = []
    async with _http_client(config) as client:
        await check_server(client, config)
        if config.warmup_requests:
            await _warmup(client, config)
        for index, rate in enumerate(rates):
            seed = config.seed + index
            result = await _measure(client, replace(config, rate=rate, seed=seed), progress)
            if on_result is not None:
                on_result(result)
            results.append(result)
    return results
