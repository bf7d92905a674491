"""MockEngine end to end through a real engine-core process: the worker's Engine protocol."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import anyio
import pytest

from libs.mockengine.engine import MockEngine
from libs.mockengine.kv_events import BlockStored
from libs.mockengine.options import MockEngineOptions
from libs.mockengine.protocol import EngineCoreOutputs
from libs.worker.engine import Engine
from libs.worker.errors import EngineUnavailable, InvalidRequest
from tests.libs.mockengine.helpers import collect, token_ids, write_profile

pytestmark = pytest.mark.anyio

PROMPT = list(range(1000, 1300))  # 300 tokens: 2 full 128-token blocks


def as_engine(mock: MockEngine) -> Engine:
    """mypy checks here that MockEngine satisfies the worker's Engine protocol."""
    return mock


@pytest.fixture
async def engine() -> AsyncIterator[MockEngine]:
    started = await MockEngine.start(MockEngineOptions(profile="zero", startup_s=0))
    yield started
    await started.shutdown()


async def test_generate_streams_deltas_and_finishes(engine: MockEngine) -> None:
    steps = await collect(as_engine(engine).generate("r", PROMPT, {"max_tokens": 6, "temperature": 0.0}))
    assert [len(s.sequences[0].token_ids) for s in steps] == [1] * 6
    assert [s.finished for s in steps] == [False] * 5 + [True]
    assert steps[-1].sequences[0].finish_reason == "length"
    assert {s.num_prompt_tokens for s in steps} == {300}
    again = await collect(engine.generate("r2", PROMPT, {"max_tokens": 6, "temperature": 0.0}))
    assert token_ids(again) == token_ids(steps)
    assert again[0].num_cached_tokens == 256  # the prefix cache held the first run's full blocks
    stats = engine.stats()
    assert (stats.requests_finished, stats.num_running, stats.num_waiting) == (2, 0, 0)
    assert stats.prompt_tokens_computed == 300 + 44
    assert stats.prompt_tokens_local_cache_hit == 256


async def test_every_core_message_reaches_the_outputs_hook() -> None:
    seen: list[EngineCoreOutputs] = []
    engine = await MockEngine.start(MockEngineOptions(startup_s=0), on_outputs=seen.append)
    try:
        await collect(engine.generate("r", PROMPT, {"max_tokens": 3}))
        stored = [e for m in seen for e in m.kv_events if isinstance(e, BlockStored)]
        assert sum(len(e.block_hashes) for e in stored) == 2
        assert sum(len(o.new_token_ids) for m in seen for o in m.outputs) == 3
    finally:
        await engine.shutdown()


async def test_n_sequences_stream_by_index(engine: MockEngine) -> None:
    steps = await collect(
        engine.generate("n", PROMPT, {"n": 3, "max_tokens": 4, "temperature": 1.0, "seed": 5})
    )
    assert steps[-1].finished and not any(s.finished for s in steps[:-1])
    sequences = [token_ids(steps, i) for i in range(3)]
    assert all(len(t) == 4 for t in sequences) and len({tuple(t) for t in sequences}) == 3


async def test_logprobs_and_prompt_logprobs(engine: MockEngine) -> None:
    steps = await collect(
        engine.generate(
            "lp", PROMPT[:10], {"max_tokens": 3, "logprobs": 2, "prompt_logprobs": 1, "temperature": 0}
        )
    )
    first = steps[0]
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == 10
    assert first.prompt_logprobs[0] is None and first.prompt_logprobs[1] is not None
    assert first.prompt_logprobs[1].token_id == PROMPT[1]
    assert all(s.prompt_logprobs is None for s in steps[1:])
    (delta,) = first.sequences
    (logprob,) = delta.logprobs
    assert logprob.token_id == delta.token_ids[0] and logprob.rank == 1 and len(logprob.top) == 2


async def test_stop_token_ids_end_a_stream(engine: MockEngine) -> None:
    natural = token_ids(await collect(engine.generate("a", PROMPT, {"max_tokens": 8, "temperature": 0})))
    steps = await collect(
        engine.generate("b", PROMPT, {"max_tokens": 8, "temperature": 0, "stop_token_ids": [natural[2]]})
    )
    assert token_ids(steps) == natural[:3]
    assert steps[-1].sequences[0].finish_reason == "stop"
    assert steps[-1].sequences[0].stop_token_id == natural[2]


async def test_abort_ends_the_stream_with_abort(tmp_path: Path) -> None:
    slow = write_profile(tmp_path, base_s=0.02)
    engine = await MockEngine.start(MockEngineOptions(profile=slow, startup_s=0))
    try:
        stream = engine.generate("r", PROMPT, {"max_tokens": 1000, "ignore_eos": True})
        steps = [await stream.__anext__()]
        await engine.abort("r")
        steps += [step async for step in stream]
        assert steps[-1].finished and steps[-1].sequences[0].finish_reason == "abort"
        assert len(token_ids(steps)) < 100
        stats = await engine.fresh_stats()
        assert (stats.num_running, stats.kv_cache_usage) == (0, 0.0)
    finally:
        await engine.shutdown()


async def test_a_consumer_that_stops_reading_aborts_the_request(tmp_path: Path) -> None:
    engine = await MockEngine.start(
        MockEngineOptions(profile=write_profile(tmp_path, base_s=0.01), startup_s=0)
    )
    try:
        stream = engine.generate("r", PROMPT, {"max_tokens": 1000, "ignore_eos": True})
        await stream.__anext__()
        assert isinstance(stream, AsyncGenerator)
        await stream.aclose()  # what a cancelled gRPC call does to the worker's loop
        for _ in range(50):
            if (await engine.fresh_stats()).num_running == 0:
                break
            await anyio.sleep(0.02)
        assert (await engine.fresh_stats()).num_running == 0
    finally:
        await engine.shutdown()


async def test_what_the_mock_cannot_simulate_is_refused(engine: MockEngine) -> None:
    with pytest.raises(InvalidRequest, match="structured output"):
        await collect(engine.generate("s", PROMPT, {"max_tokens": 2, "structured_outputs": {"json": "{}"}}))
    with pytest.raises(InvalidRequest, match="images"):
        await collect(engine.generate("i", PROMPT, {"max_tokens": 2}, images=[object()]))
    with pytest.raises(InvalidRequest, match="images"):
        await collect(engine.generate("e", PROMPT, {"max_tokens": 2}, image_embeddings=[object()]))
    with pytest.raises(InvalidRequest, match="speculative"):
        await MockEngine.start(MockEngineOptions(speculative_config={"method": "ngram"}))


async def test_bad_prompts_are_refused(engine: MockEngine) -> None:
    with pytest.raises(InvalidRequest, match="longer than"):
        await collect(engine.generate("long", [1] * 8193, {"max_tokens": 1}))
    with pytest.raises(InvalidRequest, match="vocabulary"):
        await collect(engine.generate("oov", [49152], {"max_tokens": 1}))
    with pytest.raises(InvalidRequest, match="empty"):
        await collect(engine.generate("empty", [], {"max_tokens": 1}))
    with pytest.raises(InvalidRequest, match="min_tokens"):
        await collect(engine.generate("mt", [1], {"max_tokens": 1, "min_tokens": 2}))


async def test_info_comes_from_the_profile() -> None:
    engine = await MockEngine.start(MockEngineOptions(profile="cpu-smollm2", startup_s=0, engine_id="p0"))
    try:
        info = engine.info
        assert (info.vocab_size, info.max_model_len, info.engine_id) == (49152, 8192, "p0")
        kv = info.kv
        assert (kv.block_size, kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.kv_cache_dtype) == (
            128,
            30,
            3,
            64,
            "bfloat16",
        )
        assert info.num_kv_blocks == 2**30 // (23040 * 128)
        assert not info.takes_images and info.sampling_defaults == {}
    finally:
        await engine.shutdown()
    accelerator = await MockEngine.start(
        MockEngineOptions(profile="h100-llama3-8b", startup_s=0, block_size=32)
    )
    try:
        assert accelerator.info.kv.block_size == 32 and accelerator.info.vocab_size == 128256
    finally:
        await accelerator.shutdown()


async def test_start_up_takes_the_configured_time_scaled() -> None:
    started = time.monotonic()
    engine = await MockEngine.start(MockEngineOptions(startup_s=0.4, time_scale=2.0))
    try:
        assert time.monotonic() - started >= 0.8
    finally:
        await engine.shutdown()


async def test_steps_take_their_simulated_time(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, base_s=0.02)
    for scale, floor in ((1.0, 0.2), (3.0, 0.6)):
        engine = await MockEngine.start(MockEngineOptions(profile=profile, startup_s=0, time_scale=scale))
        try:
            started = time.monotonic()
            await collect(engine.generate("r", PROMPT, {"max_tokens": 10}))
            elapsed = time.monotonic() - started
            assert floor <= elapsed < floor * 2 + 1.0, (scale, elapsed)  # 10 steps of 20 ms x scale
        finally:
            await engine.shutdown()


async def test_a_dead_core_makes_the_engine_dead_and_fails_requests(tmp_path: Path) -> None:
    engine = await MockEngine.start(
        MockEngineOptions(profile=write_profile(tmp_path, base_s=0.01), startup_s=0)
    )
    try:
        stream = engine.generate("r", PROMPT, {"max_tokens": 1000})
        await stream.__anext__()
        os.kill(engine.core_pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailable):
            async for _ in stream:
                pass
        assert engine.dead
        with pytest.raises(EngineUnavailable):
            await collect(engine.generate("after", PROMPT, {"max_tokens": 1}))
    finally:
        await engine.shutdown()


def test_the_core_process_imports_no_torch_vllm_or_grpc() -> None:
    """The core's whole import closure, after a request has run through a simulator."""
    script = (
        "import sys\n"
        "import libs.mockengine.core_main\n"
        "from tests.libs.mockengine.helpers import add, run, simulator\n"
        "sim = simulator()\n"
        "add(sim, 'r', range(1, 40), max_tokens=5)\n"
        "assert run(sim)\n"
        "print(sorted(m for m in ('torch', 'vllm', 'grpc', 'structlog') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    # The helpers import libs.worker.engine for its dataclasses (light); the core itself
    # must not pull gRPC, torch or vLLM.
    assert result.stdout.strip() == "[]", result.stderr


async def test_the_client_side_imports_no_torch_or_vllm(engine: MockEngine) -> None:
    await collect(engine.generate("r", PROMPT, {"max_tokens": 2}))
    assert "torch" not in sys.modules
    assert "vllm" not in sys.modules


def test_the_core_exits_when_its_clients_process_is_killed() -> None:
    """No orphaned cores: a SIGKILLed worker's core sees its stdin close and leaves."""
    script = (
        "import asyncio, sys\n"
        "from libs.mockengine.engine import MockEngine\n"
        "from libs.mockengine.options import MockEngineOptions\n"
        "async def main():\n"
        "    engine = await MockEngine.start(MockEngineOptions(startup_s=0))\n"
        "    print(engine.core_pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    client = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    core_pid = 0
    try:
        assert client.stdout is not None
        core_pid = int(client.stdout.readline())
        os.kill(client.pid, signal.SIGKILL)
        client.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(core_pid):
            time.sleep(0.05)
        assert not _alive(core_pid)
    finally:
        client.kill()
        if core_pid and _alive(core_pid):
            os.kill(core_pid, signal.SIGKILL)  # leave no orphan behind when the check fails


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False
