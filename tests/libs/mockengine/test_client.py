"""The step-level client: one message per engine step with every sequence's news, the step's
KV events and stats; utility calls (stats, prefix-cache reset)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libs.mockengine.client import EngineCoreClient
from libs.mockengine.config import CoreConfig
from libs.mockengine.kv_events import AllBlocksCleared, BlockStored
from libs.mockengine.protocol import AddRequest, EngineCoreOutputs, SamplingSpec
from tests.libs.mockengine.helpers import write_profile

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[EngineCoreClient]:
    # 20 ms steps: a request sent right after another joins it within a step or two.
    profile = write_profile(tmp_path, base_s=0.02)
    config = CoreConfig(profile=profile, startup_s=0, block_size=16, max_model_len=256)
    started = await EngineCoreClient.start(config)
    yield started
    await started.shutdown()


async def until_idle(client: EngineCoreClient, finished: int) -> list[EngineCoreOutputs]:
    messages = []
    while True:
        message = await client.get_output()
        messages.append(message)
        if message.stats.requests_finished >= finished and not message.stats.num_running:
            return messages


async def test_one_message_per_step_carries_every_sequence(client: EngineCoreClient) -> None:
    spec = SamplingSpec(max_tokens=6, temperature=0.0)
    await client.add_request(AddRequest(request_id="a", prompt_token_ids=list(range(1, 40)), sampling=spec))
    await client.add_request(AddRequest(request_id="b", prompt_token_ids=list(range(50, 60)), sampling=spec))
    messages = await until_idle(client, finished=2)
    steps = [m for m in messages if m.step > 0]
    assert [m.step for m in steps] == list(range(1, len(steps) + 1))
    with_both = [m for m in steps if {o.request_id for o in m.outputs} == {"a", "b"}]
    assert len(with_both) >= 3  # both run in the same steps: each step's message holds both
    assert all(len(o.new_token_ids) == 1 for m in steps for o in m.outputs)
    stored = [e for m in messages for e in m.kv_events if isinstance(e, BlockStored)]
    assert sum(len(e.block_hashes) for e in stored) == 2  # 39 tokens + 6 outputs: 2 full 16-token blocks
    assert messages[-1].stats.requests_finished == 2


async def test_stats_and_prefix_cache_reset(client: EngineCoreClient) -> None:
    spec = SamplingSpec(max_tokens=1, temperature=0.0)
    prompt = list(range(1, 40))
    await client.add_request(AddRequest(request_id="a", prompt_token_ids=prompt, sampling=spec))
    await until_idle(client, finished=1)
    assert (await client.get_stats()).prompt_tokens_computed == 39
    assert await client.reset_prefix_cache() is True
    await client.add_request(AddRequest(request_id="b", prompt_token_ids=prompt, sampling=spec))
    messages = await until_idle(client, finished=2)
    assert any(isinstance(e, AllBlocksCleared) for m in messages for e in m.kv_events)
    first = next(o for m in messages for o in m.outputs if o.request_id == "b")
    assert first.num_cached_tokens == 0  # the reset forgot the first run's blocks
    assert client.latest_stats.prompt_tokens_local_cache_hit == 0
