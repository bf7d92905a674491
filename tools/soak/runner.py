"""The soak itself: N clients sending requests back to back for the duration, memory
sampled on the side, then checks that the stack is still whole: a valid request succeeds,
every worker is healthy and has nothing left running."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tools.soak.client import Outcome, run_one
from tools.soak.memory import TreeSampler
from tools.soak.workload import Mix, draw

SKIPPED = "skipped"


@dataclass(frozen=True)
class SoakOptions:
    base_url: str
    duration_s: float
    concurrency: int = 8
    stall_s: float = 120.0
    sample_s: float = 5.0
    seed: int = 0
    mix: Mix = field(default_factory=Mix)
    progress_s: float = 30.0
    api_key: str | None = None  # sent as `Authorization: Bearer` (a gateway with --api-key)


@dataclass
class SoakResult:
    options: SoakOptions
    model: str
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)  # name -> "ok" or what failed

    def count(self, result: str) -> int:
        return sum(1 for o in self.outcomes if o.result == result)

    @property
    def hung(self) -> int:
        return self.count("hung")

    def errors_by_detail(self) -> dict[str, int]:
        return dict(Counter(o.detail for o in self.outcomes if o.result == "error").most_common())

    def error_examples(self) -> dict[str, str]:
        """The first message seen for each kind of error."""
        examples: dict[str, str] = {}
        for o in self.outcomes:
            if o.result == "error":
                examples.setdefault(o.detail, o.message)
        return examples

    def by_kind(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter[str]] = {}
        for o in self.outcomes:
            table.setdefault(o.scenario.kind, Counter())[o.result] += 1
        return {kind: dict(counts) for kind, counts in sorted(table.items())}

    @property
    def failed_checks(self) -> list[str]:
        return [
            f"{name}: {verdict}"
            for name, verdict in self.checks.items()
            if verdict != "ok" and not verdict.startswith(SKIPPED)
        ]


async def soak(options: SoakOptions, sampler: TreeSampler | None) -> SoakResult:
    limits = httpx.Limits(
        max_connections=options.concurrency + 4, max_keepalive_connections=options.concurrency
    )
    headers = {"authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    async with httpx.AsyncClient(limits=limits, headers=headers) as client:
        models = await client.get(options.base_url + "/v1/models", timeout=30)
        models.raise_for_status()
        result = SoakResult(options, models.json()["data"][0]["id"])
        rng = random.Random(options.seed)
        started = time.monotonic()
        end = started + options.duration_s

        async def one_client() -> None:
            while time.monotonic() < end:
                scenario = draw(rng, result.model, options.mix)
                result.outcomes.append(await run_one(client, options.base_url, scenario, options.stall_s))

        async def sample() -> None:
            while True:
                if sampler is not None:
                    sampler.sample()
                await asyncio.sleep(options.sample_s)

        async def progress() -> None:
            while True:
                await asyncio.sleep(options.progress_s)
                _print_progress(result, time.monotonic() - started)

        side = [asyncio.create_task(sample()), asyncio.create_task(progress())]
        try:
            await asyncio.gather(*(one_client() for _ in range(options.concurrency)))
        finally:
            for task in side:
                task.cancel()
        result.seconds = time.monotonic() - started
        if sampler is not None:
            sampler.sample()
        result.checks = await _after_checks(client, options.base_url, result.model)
        return result


def _print_progress(result: SoakResult, elapsed_s: float) -> None:
    print(
        f"soak: {elapsed_s:5.0f}s  requests {len(result.outcomes)}  completed {result.count('completed')}  "
        f"aborted {result.count('aborted')}  errors {result.count('error')}  hung {result.hung}",
        file=sys.stderr,
        flush=True,
    )


async def _after_checks(client: httpx.AsyncClient, base_url: str, model: str) -> dict[str, str]:
    checks: dict[str, str] = {}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 8,
        "temperature": 0,
        "stream": False,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    try:
        response = await client.post(base_url + "/v1/chat/completions", json=body, timeout=180)
        ok = response.status_code == 200 and bool(response.json()["choices"][0]["message"]["content"])
        checks["valid request afterwards"] = "ok" if ok else f"{response.status_code} {response.text[:200]}"
    except (httpx.HTTPError, ValueError, LookupError) as error:
        checks["valid request afterwards"] = f"{type(error).__name__}: {error}"[:300]
    # The gateway polls worker stats about once a second: wait for the last aborts to land.
    deadline = time.monotonic() + 30
    verdict = "no /health answer"
    while time.monotonic() < deadline:
        try:
            health = (await client.get(base_url + "/health", timeout=10)).json()
        except ValueError:
            verdict = f"{SKIPPED}: /health is not JSON (not a Cleave gateway?)"
            break
        except httpx.HTTPError as error:
            verdict = f"/health: {type(error).__name__}"
        else:
            if not isinstance(health, dict) or "workers" not in health:
                verdict = f"{SKIPPED}: /health lists no workers (not a Cleave gateway?)"
                break
            workers = health["workers"]
            unhealthy = [w["address"] for w in workers if not w.get("healthy")]
            busy = {w["address"]: w.get("running") for w in workers if w.get("running")}
            verdict = (
                "ok" if workers and not unhealthy and not busy else f"unhealthy {unhealthy}, running {busy}"
            )
            if verdict == "ok":
                break
        await asyncio.sleep(1)
    checks["workers healthy and idle afterwards"] = verdict
    return checks
