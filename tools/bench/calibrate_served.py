"""The served calibration of the mock engine's CPU profile: engine steps timed through the real
serving stack, as the stacks the profile must predict run them.

`calibrate_mock --method served` (the default) calls `measure_served`. Why not time the engine
alone: on 2026-12-06 the offline method (vLLM's `LLM` in a loop of its own, calibrate_mock.py)
timed a 2-core batch-1 decode step at ~72 ms where the served pd stack streamed one token every
34-48 ms, and the profile it gave missed the served stacks by up to +188% (docs/benchmarks.md).

For each core count N, a pd stack whose worker runs on the last N cores, and the same stack on
the mock engine's zero profile (every step instant, so its TTFT is the serving layer alone):

- decode points: B streams at once, each a fresh random prompt of C token ids and 48 tokens
  with EOS ignored; a point's time is the median inter-token gap of every stream between its
  8th and 40th token, when all B streams decode together (a step of B sequences; relaying is
  pipelined with the next step, so the gap is the step);
- prefill points: one prompt of L fresh token ids at a time, 2 tokens; the point's time is
  the median TTFT on the real stack less the median TTFT on the zero-profile stack.

Then the KV handoff, with every core: 1p1d on the real engine, and 1p1d on the mock engine
with the coefficients just fitted and an instant transfer; the handoff's own cost at each
prompt length is the difference of their median TTFTs, fitted as latency + bytes / bandwidth.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from tools.bench.client import stream_request

DECODE_TOKENS = 48
DECODE_WINDOW = (8, 40)  # inter-token gaps counted: all streams decoding together
PREFILL_TOKENS = 2  # two, so a 1p1d request is handed off (one token ends it on prefill)
VOCAB = (100, 49000)


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    prefills: tuple[int, ...]
    repeats: int


@contextmanager
def running(name: str, settings: Any, log_dir: Path) -> Iterator[str]:
    """The system `name` started and ready; yields its base URL and stops it afterwards."""
    from libs.rpc.ports import free_port
    from libs.stack.process import Launched, start, wait_ready
    from tools.bench.systems.catalog import plan_system

    plan = plan_system(name, settings, free_port)
    launched = Launched()
    try:
        for spec in plan.processes:
            launched.processes.append(start(spec, log_dir / name))
        asyncio.run(wait_ready(launched.processes, settings.startup_timeout_s))
        yield plan.base_url
    finally:
        launched.stop(60.0)


class Driver:
    """Streams token-id prompts to one stack's /v1/completions."""

    def __init__(self, url: str, rng: random.Random) -> None:
        self.url = url
        self.rng = rng

    def prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(*VOCAB) for _ in range(length)]

    async def _streams(self, prompts: list[list[int]], max_tokens: int) -> list[Any]:
        async with httpx.AsyncClient(base_url=self.url, timeout=600.0) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            bodies = [
                {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 0.0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for prompt in prompts
            ]
            outcomes = await asyncio.gather(*(stream_request(client, "/v1/completions", b) for b in bodies))
        failed = [o.error for o in outcomes if o.error is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(outcomes)} calibration requests failed: {failed[0]}")
        return list(outcomes)

    def decode_step_s(self, batch: int, context: int) -> float:
        outcomes = asyncio.run(self._streams([self.prompt(context) for _ in range(batch)], DECODE_TOKENS))
        low, high = DECODE_WINDOW
        gaps = [gap for o in outcomes for gap in o.itl_s[low:high]]
        if not gaps:
            raise RuntimeError(f"no inter-token gaps in {DECODE_WINDOW} (batch {batch}, context {context})")
        return statistics.median(gaps)

    def ttft_s(self, length: int, repeats: int) -> float:
        samples = []
        for _ in range(repeats):
            (outcome,) = asyncio.run(self._streams([self.prompt(length)], PREFILL_TOKENS))
            samples.append(outcome.ttft_s)
        return statistics.median(samples)

    def warm_up(self) -> None:
        asyncio.run(self._streams([self.prompt(64), self.prompt(64)], 8))


def _log(text: str) -> None:
    print(f"calibrate_served: {text}", file=sys.stderr, flush=True)


def _ttfts(name: str, settings: Any, grid: Grid, log_dir: Path, rng: random.Random) -> dict[int, float]:
    with running(name, settings, log_dir) as url:
        driver = Driver(url, rng)
        driver.warm_up()
        found = {length: driver.ttft_s(length, grid.repeats) for length in grid.prefills}
    _log(f"{name}: TTFT " + ", ".join(f"{k} tokens {v * 1e3:.1f} ms" for k, v in found.items()))
    return found


def measure_served(cores: int, settings: Any, grid: Grid, log_dir: Path) -> dict[str, Any]:
    """Decode and prefill points of the real engine on `cores` cores (see the module's text)."""
    usable = tuple(sorted(settings.cores))
    group = usable[-cores:]
    on_group = replace(settings, cores=group)
    rng = random.Random(cores)
    points: list[dict[str, Any]] = []
    with running("cleave-pd", on_group, log_dir / f"cores{cores}") as url:
        driver = Driver(url, rng)
        driver.warm_up()
        middle = sum(DECODE_WINDOW) / 2
        for context in grid.contexts:
            for batch in grid.batches:
                seconds = driver.decode_step_s(batch, context)
                points.append(
                    {
                        "kind": "decode",
                        "batch": batch,
                        "context": context,
                        "seconds": seconds,
                        "shape": [1, batch, 0, batch * (context + middle), 0.0],
                    }
                )
                _log(f"{cores} core(s): decode batch {batch} context {context}: {seconds * 1e3:.2f} ms")
        real = {length: driver.ttft_s(length, grid.repeats) for length in grid.prefills}
    serving = _ttfts("cleave-pd-mock-zero", on_group, grid, log_dir / f"cores{cores}", rng)
    for length in grid.prefills:
        seconds = real[length] - serving[length]
        points.append(
            {
                "kind": "prefill",
                "length": length,
                "seconds": seconds,
                "ttft_real_s": real[length],
                "ttft_serving_s": serving[length],
                "shape": [1, 1, length, 0, length * length / 2],
            }
        )
        _log(f"{cores} core(s): prefill {length}: {seconds * 1e3:.1f} ms (TTFT {real[length] * 1e3:.1f} ms)")
    return {"cores": cores, "device_group": list(group), "method": "served", "points": points}


def measure_handoff(
    settings: Any, grid: Grid, profile: dict[str, Any], kv_bytes_per_token: int, log_dir: Path
) -> dict[str, Any]:
    """The KV handoff's cost on 1p1d beyond what the fitted steps explain (module text)."""
    instant = {**profile, "kv_transfer": {"bandwidth_bytes_per_s": 0, "latency_s": 0}}
    path = log_dir / "profile-instant-transfer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(instant, indent=2) + "\n")
    rng = random.Random(7)
    real = _ttfts("cleave-1p1d", settings, grid, log_dir / "handoff", rng)
    mock = _ttfts(
        "cleave-1p1d-mock", replace(settings, mock_profile=str(path)), grid, log_dir / "handoff", rng
    )
    points = [
        {"length": n, "bytes": n * kv_bytes_per_token, "seconds": real[n] - mock[n], "ttft_real_s": real[n]}
        for n in grid.prefills
    ]
    return {"points": points, "transfer": fit_transfer(points)}


def fit_transfer(points: Sequence[dict[str, Any]]) -> dict[str, float]:
    """latency + bytes / bandwidth by least squares, neither term negative (a term the fit
    makes negative is dropped: bandwidth 0 means instant in a profile)."""
    import numpy as np

    rows = np.array([[1.0, p["bytes"]] for p in points])
    seconds = np.array([p["seconds"] for p in points])
    (latency, per_byte), *_ = np.linalg.lstsq(rows, seconds, rcond=None)
    if per_byte <= 0:
        latency, per_byte = max(float(np.mean(seconds)), 0.0), 0.0
    elif latency < 0:
        latency = 0.0
        per_byte = max(float(np.dot(rows[:, 1], seconds) / np.dot(rows[:, 1], rows[:, 1])), 0.0)
    return {"latency_s": float(latency), "bandwidth_bytes_per_s": 1.0 / per_byte if per_byte > 0 else 0.0}
