"""Injected faults: the option string, a crash at step N, a stall, refused KV pulls."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from libs.mockengine.engine import MockEngine
from libs.mockengine.faults import ALL, FaultPlan
from libs.mockengine.options import MockEngineOptions
from libs.worker.engine import EngineStep
from libs.worker.errors import EngineUnavailable, KvTransferFailed
from tests.libs.mockengine.helpers import collect, token_ids, write_profile

PROMPT = list(range(3000, 3100))
PREFILL_PARAMS = {"do_remote_decode": True}


def test_the_option_string() -> None:
    plan = FaultPlan.parse("crash-at-step=40, stall-at-step=3:1.5,stall-at-step=7:0.25,refuse-pulls=2")
    assert plan.crash_at_step == 40 and plan.crashes_at(40) and not plan.crashes_at(39)
    assert (plan.stall_seconds(3), plan.stall_seconds(7), plan.stall_seconds(4)) == (1.5, 0.25, 0.0)
    assert [plan.take_pull_refusal() for _ in range(3)] == [True, True, False]
    assert FaultPlan.parse("refuse-pulls").refused_pulls_left == ALL
    assert FaultPlan.parse("refuse-pulls=all").take_pull_refusal()
    assert FaultPlan.parse("") == FaultPlan()


@pytest.mark.parametrize("text", ["crash-at-step=0", "explode=1", "stall-at-step=2", "refuse-pulls=some"])
def test_bad_option_strings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad mock fault"):
        FaultPlan.parse(text)


async def start(**options: Any) -> MockEngine:
    return await MockEngine.start(MockEngineOptions(**{"profile": "zero", "startup_s": 0, **options}))


@pytest.mark.anyio
async def test_a_crash_at_step_n_kills_the_core(tmp_path: Path) -> None:
    engine = await start(profile=write_profile(tmp_path, base_s=0.005), faults="crash-at-step=4")
    try:
        received: list[EngineStep] = []

        async def consume() -> None:
            async for step in engine.generate("r", PROMPT, {"max_tokens": 10}):
                received.append(step)

        with pytest.raises(EngineUnavailable):
            await consume()
        assert len(token_ids(received)) == 3  # steps 1..3 delivered, step 4 never
        assert engine.dead
    finally:
        await engine.shutdown()


@pytest.mark.anyio
async def test_a_stall_delays_one_step() -> None:
    engine = await start(faults="stall-at-step=2:0.5")
    try:
        times = []
        async for _ in engine.generate("r", PROMPT, {"max_tokens": 4}):
            times.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 0.45  # step 2 came about half a second after step 1 (less delivery jitter)
        assert max(gaps[1:]) < 0.5
    finally:
        await engine.shutdown()


@pytest.mark.anyio
async def test_a_prefill_that_refuses_the_next_pull() -> None:
    prefill = await start(engine_id="p", kv_port=0, faults="refuse-pulls=1")
    decode = await start(engine_id="d")
    try:
        for attempt, request_id in enumerate(("first", "second")):
            steps = await collect(prefill.generate(request_id, PROMPT, {"max_tokens": 1}, PREFILL_PARAMS))
            params = {
                **(steps[-1].kv_transfer_params or {}),
                "do_remote_prefill": True,
                "do_remote_decode": False,
            }
            stream = decode.generate(request_id, PROMPT, {"max_tokens": 2}, params)
            if attempt == 0:
                with pytest.raises(KvTransferFailed, match="fault injection"):
                    await collect(stream)
            else:
                assert len(token_ids(await collect(stream))) == 2
    finally:
        await prefill.shutdown()
        await decode.shutdown()


@pytest.mark.anyio
async def test_a_decode_that_refuses_every_pull_leaves_the_lease_alone() -> None:
    prefill = await start(engine_id="p", kv_port=0)
    decode = await start(engine_id="d", faults="refuse-pulls")
    try:
        steps = await collect(prefill.generate("r", PROMPT, {"max_tokens": 1}, PREFILL_PARAMS))
        params = {
            **(steps[-1].kv_transfer_params or {}),
            "do_remote_prefill": True,
            "do_remote_decode": False,
        }
        with pytest.raises(KvTransferFailed):
            await collect(decode.generate("r", PROMPT, {"max_tokens": 2}, params))
        assert (await prefill.fresh_stats()).kv_cache_usage > 0  # never asked: still leased
    finally:
        await prefill.shutdown()
        await decode.shutdown()
