"""Small simulators and requests for the mock engine's unit tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from libs.mockengine.config import CoreConfig, resolve
from libs.mockengine.profiles import PROFILES_DIR
from libs.mockengine.protocol import AddRequest, EngineCoreOutput, SamplingSpec
from libs.mockengine.simulator import Simulator
from libs.worker.engine import EngineStep

# SmolLM2's facts (zero profile) with a tiny cache: 16-token blocks, 64-token context.
SMALL = {
    "profile": "zero",
    "block_size": 16,
    "num_kv_blocks": 33,
    "max_model_len": 64,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 64,
    "startup_s": 0.0,
}


def simulator(side_channel: tuple[str, int] | None = None, **overrides: Any) -> Simulator:
    return Simulator(resolve(CoreConfig(**{**SMALL, **overrides})), side_channel=side_channel)


def add(sim: Simulator, request_id: str, prompt: Iterable[int], **sampling: Any) -> None:
    extra = {k: sampling.pop(k) for k in ("cache_salt", "kv_transfer_params", "lora") if k in sampling}
    sampling.setdefault("temperature", 0.0)
    sim.add(
        AddRequest(
            request_id=request_id, prompt_token_ids=list(prompt), sampling=SamplingSpec(**sampling), **extra
        )
    )


def run(sim: Simulator, max_steps: int = 1000) -> list[list[EngineCoreOutput]]:
    """Steps until no sequence can make progress; each step's outputs."""
    steps: list[list[EngineCoreOutput]] = []
    for _ in range(max_steps):
        if not sim.has_work:
            return steps
        steps.append(sim.step().outputs)
    raise AssertionError(f"still working after {max_steps} steps")


def tokens_by_request(steps: Iterable[list[EngineCoreOutput]]) -> dict[tuple[str, int], list[int]]:
    result: dict[tuple[str, int], list[int]] = {}
    for outputs in steps:
        for output in outputs:
            result.setdefault((output.request_id, output.index), []).extend(output.new_token_ids)
    return result


def finishes(steps: Iterable[list[EngineCoreOutput]]) -> dict[tuple[str, int], EngineCoreOutput]:
    return {(o.request_id, o.index): o for outputs in steps for o in outputs if o.finish_reason is not None}


def write_profile(
    directory: Path, name: str = "test", *, kv_latency_s: float = 0.0, **coefficients: float
) -> str:
    """A copy of the zero profile with other coefficients (and KV transfer latency); returns
    its path, which MockEngineOptions(profile=...) takes."""
    data = json.loads((PROFILES_DIR / "zero.json").read_text())
    data["name"] = name
    data["coefficients"].update(coefficients)
    data["kv_transfer"] = {"bandwidth_bytes_per_s": 0, "latency_s": kv_latency_s}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


async def collect(stream: AsyncIterator[EngineStep]) -> list[EngineStep]:
    return [step async for step in stream]


def token_ids(steps: Iterable[EngineStep], index: int = 0) -> list[int]:
    return [t for step in steps for s in step.sequences if s.index == index for t in s.token_ids]
