"""A worker on the mock engine (`--engine mock`): its flags map onto the simulator, the worker's
own request logic runs over it (prefill -> KV handoff over the side channel -> decode, with
the worker's typed handoff in between), and nothing on the path imports torch or vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2
from libs.config.flags import parse
from libs.config.roles import Role
from libs.kvevents.hashing import BlockHasher
from libs.worker.config import WorkerConfig
from libs.worker.errors import InvalidRequest
from libs.worker.mock import mock_options, start_mock_engine
from libs.worker.service import WorkerService

pytestmark = pytest.mark.anyio

FLAGS = ["--engine", "mock", "--mock-profile", "zero", "--mock-startup-s", "0", "--model", "/models/smol"]


def config(role: Role, *extra: str) -> WorkerConfig:
    return parse(WorkerConfig, [*FLAGS, "--role", role.value, *extra])


def test_the_workers_flags_reach_the_simulator() -> None:
    prefill = config(
        Role.PREFILL, "--kv-port", "7123", "--max-num-seqs", "4", "--mock-faults", "crash-at-step=9"
    )
    options = mock_options(prefill, "127.0.0.1:7001")
    assert (options.profile, options.startup_s, options.served_model_name) == ("zero", 0.0, "smol")
    assert (options.kv_port, options.max_num_seqs, options.faults) == (7123, 4, "crash-at-step=9")
    assert "prefill" in options.engine_id and "127.0.0.1:7001" in options.engine_id
    # Only a prefill worker serves KV to pull.
    assert mock_options(config(Role.DECODE, "--kv-port", "7123"), "a").kv_port is None


async def test_prefill_hands_its_kv_to_decode_through_the_workers_own_handoff() -> None:
    prefill_config = config(Role.PREFILL, "--kv-port", "0")
    prefill_engine = await start_mock_engine(prefill_config, "127.0.0.1:1")
    decode_engine = await start_mock_engine(config(Role.DECODE), "127.0.0.1:2")
    try:
        prefill = WorkerService(prefill_config, prefill_engine, address="127.0.0.1:1")
        decode = WorkerService(config(Role.DECODE), decode_engine, address="127.0.0.1:2")
        sampling = common_pb2.SamplingParams(max_tokens=6, temperature=0)
        metadata = common_pb2.RequestMetadata(request_id="r1")
        prompt = list(range(1, 300))
        prefilled = await prefill.prefill(
            worker_pb2.PrefillRequest(metadata=metadata, prompt_token_ids=prompt, sampling=sampling)
        )
        assert (
            prefilled.handoff.transport == "nixl"
            and prefilled.handoff.port == prefill_engine.side_channel_port
        )
        request = worker_pb2.GenerateRequest(
            metadata=metadata, prompt_token_ids=prompt, sampling=sampling, handoff=prefilled.handoff
        )
        tokens = [
            t
            for r in [r async for r in decode.generate(request)]
            if r.HasField("chunk")
            for t in r.chunk.token_ids
        ]
        # The same request computed on one colocated mock: the same tokens (they depend only
        # on the context), the first one the prefill worker's.
        both_engine = await start_mock_engine(config(Role.BOTH), "127.0.0.1:3")
        try:
            both = WorkerService(config(Role.BOTH), both_engine, address="127.0.0.1:3")
            colocated = worker_pb2.GenerateRequest(
                metadata=metadata, prompt_token_ids=prompt, sampling=sampling
            )
            alone = [
                t
                for r in [r async for r in both.generate(colocated)]
                if r.HasField("chunk")
                for t in r.chunk.token_ids
            ]
        finally:
            await both_engine.shutdown()
        assert len(tokens) == 6 and tokens == alone and tokens[0] == prefilled.first_token_id
        stats = decode.stats()
        assert stats.prompt_tokens_external > 0 and stats.kv_pulls.transfers == 1
    finally:
        await prefill_engine.shutdown()
        await decode_engine.shutdown()


async def test_what_the_mock_cannot_simulate_is_the_clients_400() -> None:
    engine = await start_mock_engine(config(Role.BOTH), "127.0.0.1:4")
    try:
        service = WorkerService(config(Role.BOTH), engine, address="127.0.0.1:4")
        sampling = common_pb2.SamplingParams(
            max_tokens=4, structured_output=common_pb2.StructuredOutput(json_schema='{"type": "object"}')
        )
        request = worker_pb2.GenerateRequest(
            metadata=common_pb2.RequestMetadata(request_id="r"), prompt_token_ids=[1, 2, 3], sampling=sampling
        )
        with pytest.raises(InvalidRequest, match="structured output"):
            async for _ in service.generate(request):
                pass
    finally:
        await engine.shutdown()


def test_a_mock_worker_never_imports_torch_or_vllm() -> None:
    code = (
        "import sys, services.worker.main, libs.worker.mock, libs.worker.service; "
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_served_models_tokenizer_bounds_the_mocks_tokens(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 49152, "eos_token_id": [2, 3]}))
    options = mock_options(
        config(Role.BOTH, "--model", str(tmp_path), "--mock-profile", "h100-llama3-8b"), "a"
    )
    assert (options.vocab_size, options.eos_token_id) == (49152, 2)
    assert (
        mock_options(config(Role.BOTH), "a").vocab_size,
        mock_options(config(Role.BOTH), "a").eos_token_id,
    ) == (
        None,
        None,
    )  # no config.json: the profile's model


async def test_a_mock_worker_tells_gateways_which_blocks_it_caches_as_vllm_names_them() -> None:
    both_config = config(Role.BOTH)
    engine = await start_mock_engine(both_config, "127.0.0.1:1")
    try:
        worker = WorkerService(both_config, engine, address="127.0.0.1:1")
        hashing = worker.info().kv_cache_events
        hasher = BlockHasher(hashing.block_size, hashing.hash_algo, hashing.none_hash_seed)
        prompt = list(range(1, 300))
        request = worker_pb2.GenerateRequest(
            metadata=common_pb2.RequestMetadata(request_id="r1", cache_salt="tenant-a"),
            prompt_token_ids=prompt,
            sampling=common_pb2.SamplingParams(max_tokens=2, temperature=0),
        )
        _ = [r async for r in worker.generate(request)]
        again = [r async for r in worker.generate(request)]
        assert (
            again[-1].complete.usage.cached_prompt_tokens
            == len(prompt) // hashing.block_size * hashing.block_size
        )
        watch = worker.watch_kv_cache()
        snapshot = await anext(watch)
        await watch.aclose()
        [update] = snapshot.updates
        keys = hasher.keys(prompt, cache_salt="tenant-a")
        assert update.cleared and len(keys) == len(prompt) // hashing.block_size
        assert set(keys) <= set(update.stored)
        assert not set(hasher.keys(prompt)) & set(update.stored)  # another salt: other blocks
    finally:
        await engine.shutdown()
