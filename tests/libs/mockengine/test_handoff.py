"""KV handoff between two core processes: a prefill mock keeps the prompt's blocks under a
lease and describes them as NIXL does; a decode mock pulls them over the side channel,
waits the simulated transfer time, and counts the prompt as external. Bad, expired, pulled
and released handoffs fail cleanly with KvTransferFailed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from libs.mockengine.engine import MockEngine
from libs.mockengine.options import MockEngineOptions
from libs.worker.errors import KvTransferFailed
from tests.libs.mockengine.helpers import collect, token_ids, write_profile

pytestmark = pytest.mark.anyio

# What a prefill request carries (libs/worker/handoff.PREFILL_PARAMS).
PREFILL_PARAMS = {"do_remote_decode": True}
PROMPT = list(range(2000, 2300))  # 300 tokens: 3 blocks of 128
GREEDY = {"max_tokens": 1, "temperature": 0.0}


async def start(**options: Any) -> MockEngine:
    return await MockEngine.start(MockEngineOptions(**{"profile": "zero", "startup_s": 0, **options}))


@pytest.fixture
async def pair() -> AsyncIterator[tuple[MockEngine, MockEngine]]:
    prefill = await start(engine_id="prefill-0", kv_port=0, kv_lease_s=30)
    decode = await start(engine_id="decode-0")
    yield prefill, decode
    await prefill.shutdown()
    await decode.shutdown()


async def prefill_once(prefill: MockEngine, request_id: str = "req") -> dict[str, Any]:
    steps = await collect(prefill.generate(request_id, PROMPT, GREEDY, PREFILL_PARAMS))
    params = steps[-1].kv_transfer_params
    assert params is not None
    return params


def decode_params(params: dict[str, Any]) -> dict[str, Any]:
    """What the worker sends a decode engine (libs/worker/handoff.params_from_handoff)."""
    return {**params, "do_remote_prefill": True, "do_remote_decode": False}


async def test_the_prefill_hands_over_its_blocks_in_nixls_shape(pair: tuple[MockEngine, MockEngine]) -> None:
    prefill, _ = pair
    params = await prefill_once(prefill)
    assert params["remote_engine_id"] == "prefill-0"
    assert params["remote_request_id"] == "req"
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", prefill.side_channel_port)
    assert params["remote_num_tokens"] == 300
    (block_ids,) = params["remote_block_ids"]
    assert len(block_ids) == 3 and 0 not in block_ids
    stats = await prefill.fresh_stats()
    assert stats.kv_cache_usage > 0  # the leased blocks stay allocated


async def test_decode_pulls_the_prompt_and_continues_as_a_colocated_run(
    pair: tuple[MockEngine, MockEngine],
) -> None:
    prefill, decode = pair
    params = await prefill_once(prefill)
    steps = await collect(
        decode.generate("req", PROMPT, {"max_tokens": 5, "temperature": 0.0}, decode_params(params))
    )
    assert steps[0].num_cached_tokens == 300
    colocated = await collect(prefill.generate("colocated", PROMPT, {"max_tokens": 5, "temperature": 0.0}))
    assert token_ids(steps) == token_ids(colocated)
    stats = await decode.fresh_stats()
    assert (stats.prompt_tokens_external, stats.prompt_tokens_computed) == (300, 0)
    assert stats.kv_pulls["transfers"] == 1 and stats.kv_pulls["bytes"] == 3 * 23040 * 128
    assert (await prefill.fresh_stats()).kv_cache_usage == 0.0  # pulled: the lease ended


async def test_a_handoff_can_be_pulled_once(pair: tuple[MockEngine, MockEngine]) -> None:
    prefill, decode = pair
    params = decode_params(await prefill_once(prefill))
    await collect(decode.generate("first", PROMPT, GREEDY, params))
    with pytest.raises(KvTransferFailed, match="pulled"):
        await collect(decode.generate("second", PROMPT, GREEDY, params))
    stats = await decode.fresh_stats()
    assert stats.kv_pulls["failures"] == 1 and stats.kv_cache_usage == 0.0


async def test_an_unknown_request_or_engine_is_refused(pair: tuple[MockEngine, MockEngine]) -> None:
    prefill, decode = pair
    params = decode_params(await prefill_once(prefill))
    with pytest.raises(KvTransferFailed, match="unknown"):
        await collect(decode.generate("a", PROMPT, GREEDY, {**params, "remote_request_id": "nope"}))
    with pytest.raises(KvTransferFailed, match="engine id"):
        await collect(decode.generate("b", PROMPT, GREEDY, {**params, "remote_engine_id": "other"}))
    with pytest.raises(KvTransferFailed, match="cannot reach"):
        await collect(decode.generate("c", PROMPT, GREEDY, {**params, "remote_port": 1}))


async def test_an_expired_lease_is_refused_and_its_blocks_freed() -> None:
    prefill = await start(engine_id="p", kv_port=0, kv_lease_s=0.3)
    decode = await start(engine_id="d")
    try:
        params = decode_params(await prefill_once(prefill))
        await anyio.sleep(0.6)
        assert (await prefill.fresh_stats()).kv_cache_usage == 0.0  # expired while idle
        with pytest.raises(KvTransferFailed, match="expired"):
            await collect(decode.generate("req", PROMPT, GREEDY, params))
    finally:
        await prefill.shutdown()
        await decode.shutdown()


async def test_release_frees_the_prefill_blocks(pair: tuple[MockEngine, MockEngine]) -> None:
    prefill, decode = pair
    params = decode_params(await prefill_once(prefill))
    await decode.release_handoff("req", params)
    for _ in range(100):
        if (await prefill.fresh_stats()).kv_cache_usage == 0.0:
            break
        await anyio.sleep(0.02)
    assert (await prefill.fresh_stats()).kv_cache_usage == 0.0
    with pytest.raises(KvTransferFailed, match="released"):
        await collect(decode.generate("req", PROMPT, GREEDY, params))


async def test_the_pull_takes_the_simulated_transfer_time(tmp_path: Path) -> None:
    slow_link = write_profile(tmp_path, kv_latency_s=0.25)
    prefill = await start(engine_id="p", kv_port=0)
    decode = await start(engine_id="d", profile=slow_link, time_scale=2.0)
    try:
        params = decode_params(await prefill_once(prefill))
        started = time.monotonic()
        await collect(decode.generate("req", PROMPT, GREEDY, params))
        assert time.monotonic() - started >= 0.5  # 0.25 s latency x time scale 2
        assert (await decode.fresh_stats()).kv_pulls["seconds"] >= 0.5
    finally:
        await prefill.shutdown()
        await decode.shutdown()


async def test_a_prefill_that_stops_early_still_hands_over(pair: tuple[MockEngine, MockEngine]) -> None:
    """As vLLM 0.32's NIXL connector: FINISHED_STOPPED hands over too (the worker decides)."""
    prefill, _ = pair
    probe = await collect(prefill.generate("probe", PROMPT, GREEDY))
    stop = token_ids(probe)[0]
    steps = await collect(
        prefill.generate("req", PROMPT, {**GREEDY, "stop_token_ids": [stop]}, PREFILL_PARAMS)
    )
    assert steps[-1].sequences[0].finish_reason == "stop"
    assert steps[-1].kv_transfer_params is not None


async def test_handoffs_need_a_single_sequence(pair: tuple[MockEngine, MockEngine]) -> None:
    from libs.worker.errors import InvalidRequest

    prefill, _ = pair
    with pytest.raises(InvalidRequest, match="n = 1"):
        await collect(prefill.generate("req", PROMPT, {**GREEDY, "n": 2}, PREFILL_PARAMS))
