"""Fleet-wide prefix reuse through the kvstore, on real vLLM workers with SmolLM2.

A prefill worker (vLLM's MultiConnector: NIXL + the kvstore connector) computes a prompt with
a ~2,000-token shared prefix and saves its chunks; a different worker then loads that prefix
from the kvstore instead of computing it (its own counters say how many tokens), and its
greedy output equals a cold run's. A load that fails part-way — a chunk that fails its
checksum, or the kvstore dying mid-stream (tests/e2e/kvstore_faults.py sits between the
loading worker and the kvstore) — loads the chunks before the fault, recomputes the rest and
counts a load failure, with the cold run's output. With the kvstore stopped, workers compute
prompts themselves: a warning, a counter, and the right answer, never an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.flags import parse
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.harness import Service, log_dir, start, stop_all, wait_healthy
from tests.e2e.kvstore_faults import FaultyKvStoreProxy
from tests.e2e.prompts import question, shared_prefix
from tests.e2e.reference_vllm import ReferenceRun
from tests.e2e.stack import start_worker, stored_chunks
from tests.libs.kvstore.redis_server import RedisServer

pytestmark = pytest.mark.anyio
CHUNK_TOKENS = 256
PREFIX_TOKENS = 1900  # + a question + 16 new tokens stays under the 2,048-token context
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=model_dir))


@pytest.fixture(scope="module")
def prompts(tokenizer: Tokenizer) -> dict[str, list[int]]:
    prefix = shared_prefix(tokenizer, seed=1, tokens=PREFIX_TOKENS)
    return {
        "first": prefix + question(tokenizer, "Which word appears first in the notes?"),
        "second": prefix + question(tokenizer, "Which word appears last in the notes?"),
        "unreachable": shared_prefix(tokenizer, seed=2, tokens=PREFIX_TOKENS)
        + question(tokenizer, "Name one word from the notes."),
        "corrupt": shared_prefix(tokenizer, seed=5, tokens=PREFIX_TOKENS)
        + question(tokenizer, "Which word appears twice?"),
        "kvstore-dies": shared_prefix(tokenizer, seed=6, tokens=PREFIX_TOKENS)
        + question(tokenizer, "Which word is the longest?"),
    }


@pytest.fixture(scope="module")
def reference_run(model_dir: Path, prompts: dict[str, list[int]]) -> Iterator[ReferenceRun]:
    """vLLM's own LLM.generate, cold, in a child process loading while the stack starts."""
    run = ReferenceRun(
        log_dir(), "kvstore", model_dir, [prompts[name] for name in sorted(prompts)], MAX_TOKENS, "float32"
    )
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def reference(reference_run: ReferenceRun, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    return dict(zip(sorted(prompts), reference_run.outputs(), strict=True))


@pytest.fixture(scope="module")
def stack_and_proxy(
    reference_run: ReferenceRun, model_dir: Path
) -> Iterator[tuple[dict[str, Service], FaultyKvStoreProxy]]:
    redis = RedisServer(log_dir() / "redis").start()
    kvstore = start("kvstore", "services.kvstore.main", parse(KvStoreProcessConfig, [
        "--cpu-bytes", "512MiB", "--redis-url", redis.url, "--chunk-tokens", str(CHUNK_TOKENS)]))  # fmt: skip
    services = {"kvstore": kvstore}
    kvstore.wait_bound()
    proxy = FaultyKvStoreProxy(kvstore.address)
    # A generous deadline: a loaded 2-core CI machine has taken more than the default 2 s to
    # stream the ~90 MB float32 prefix, which loads part of it and recomputes the rest
    # (correct, but not what these tests measure). Faults here fail fast, not by timing out.
    common = ("--dtype", "float32", "--kvstore-chunk-tokens", str(CHUNK_TOKENS), "--kvstore-timeout-s", "30")
    try:
        asyncio.run(wait_healthy(kvstore, timeout_s=120))
        # Nothing pulls this prefill worker's handoffs, so at its stop the drain would wait for
        # their leases (16 s measured); these tests are not about drains.
        services["prefill"] = start_worker(
            "prefill", model_dir, *common, "--kvstore-address", kvstore.address, "--device-group", "0",
            "--shutdown-grace-s", "5", name="prefill",
        )  # fmt: skip
        # The loading worker reaches the kvstore through the fault-injecting proxy.
        services["both"] = start_worker(
            "both", model_dir, *common, "--kvstore-address", proxy.address, "--device-group", "1", name="both"
        )
        for name in ("prefill", "both"):
            asyncio.run(wait_healthy(services[name], timeout_s=600))
        yield services, proxy
    finally:
        stop_all(services.values())
        proxy.stop()
        redis.stop()


@pytest.fixture(scope="module")
def stack(stack_and_proxy: tuple[dict[str, Service], FaultyKvStoreProxy]) -> dict[str, Service]:
    return stack_and_proxy[0]


@pytest.fixture(scope="module")
def proxy(stack_and_proxy: tuple[dict[str, Service], FaultyKvStoreProxy]) -> FaultyKvStoreProxy:
    return stack_and_proxy[1]


async def generate(
    service: Service, request_id: str, ids: list[int], max_tokens: int = MAX_TOKENS, cache_salt: str = ""
) -> tuple[list[int], float]:
    """Greedy tokens and the time to the first one."""
    started = time.perf_counter()
    first: float | None = None
    tokens: list[int] = []
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        request = worker_pb2.GenerateRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id, cache_salt=cache_salt),
            prompt_token_ids=ids,
            sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
        async for response in stub.Generate(request):
            assert not response.HasField("error"), response.error.message
            if response.HasField("chunk") and response.chunk.token_ids:
                first = first or time.perf_counter() - started
                tokens.extend(response.chunk.token_ids)
    assert first is not None
    return tokens, first


async def prefill(service: Service, request_id: str, ids: list[int], cache_salt: str = "") -> float:
    """Prefill-only (its KV then waits for a decode worker until its lease ends); seconds."""
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(service.address) as channel:
        response = await worker_pb2_grpc.WorkerStub(channel).Prefill(
            worker_pb2.PrefillRequest(
                metadata=common_pb2.RequestMetadata(request_id=request_id, cache_salt=cache_salt),
                prompt_token_ids=ids,
                sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            )
        )
    assert response.handoff.num_tokens == len(ids)
    return time.perf_counter() - started


async def stats(service: Service) -> worker_pb2.WorkerStats:
    async with grpc.aio.insecure_channel(service.address) as channel:
        return await worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest())


async def settled_stats(service: Service) -> worker_pb2.WorkerStats:
    # vLLM's stat loggers run on its output loop; give the last step's counters a moment.
    await asyncio.sleep(1.5)
    return await stats(service)


async def test_a_prefix_saved_by_one_worker_is_loaded_by_another(
    stack: dict[str, Service], prompts: dict[str, list[int]], reference: dict[str, list[int]]
) -> None:
    # Cold: the prefill worker computes `first` and saves its full chunks in the background.
    cold_ttft = await prefill(stack["prefill"], "cold-first", prompts["first"])
    full_chunks = len(prompts["first"]) // CHUNK_TOKENS
    assert await stored_chunks(stack["kvstore"].address, at_least=full_chunks) >= full_chunks
    saved = await stats(stack["prefill"])

    # Warm: another worker, another prompt with the same ~1,900-token prefix.
    before = await stats(stack["both"])
    tokens, warm_ttft = await generate(stack["both"], "warm-second", prompts["second"])
    after = await settled_stats(stack["both"])
    loaded = after.kvstore.tokens_loaded - before.kvstore.tokens_loaded
    print(
        f"prefix {PREFIX_TOKENS} tokens: {loaded} loaded from the kvstore ({loaded / PREFIX_TOKENS:.0%}); "
        f"TTFT cold (prefill worker) {cold_ttft * 1000:.0f} ms, warm {warm_ttft * 1000:.0f} ms; "
        f"save copy {saved.kvstore.save_copy_seconds * 1000:.1f} ms in all"
    )
    assert loaded >= 0.9 * PREFIX_TOKENS, after.kvstore
    assert after.prompt_tokens_external - before.prompt_tokens_external == loaded
    assert after.kvstore.load_failures == before.kvstore.load_failures
    assert tokens == reference["second"]


async def save_prefix(
    stack: dict[str, Service], request_id: str, ids: list[int], cache_salt: str = ""
) -> None:
    """The prefill worker computes `ids` and the kvstore ends up holding its full chunks."""
    held = await stored_chunks(stack["kvstore"].address, at_least=0)
    await prefill(stack["prefill"], request_id, ids, cache_salt)
    wanted = held + len(ids) // CHUNK_TOKENS
    assert await stored_chunks(stack["kvstore"].address, at_least=wanted) >= wanted


async def test_a_salted_prefix_is_loaded_only_under_its_salt(
    stack: dict[str, Service], prompts: dict[str, list[int]], reference: dict[str, list[int]]
) -> None:
    await save_prefix(stack, "salted-first", prompts["first"], cache_salt="tenant-a")
    for salt, loads in (("tenant-b", False), ("tenant-a", True)):
        before = await stats(stack["both"])
        tokens, _ = await generate(stack["both"], f"salted-second-{salt}", prompts["second"], cache_salt=salt)
        after = await settled_stats(stack["both"])
        loaded = after.kvstore.tokens_loaded - before.kvstore.tokens_loaded
        assert (loaded >= 0.9 * PREFIX_TOKENS) if loads else (loaded == 0), (salt, after.kvstore)
        assert tokens == reference["second"]


async def test_a_corrupt_chunk_is_recomputed_not_used(
    stack: dict[str, Service],
    proxy: FaultyKvStoreProxy,
    prompts: dict[str, list[int]],
    reference: dict[str, list[int]],
) -> None:
    ids = prompts["corrupt"]
    await save_prefix(stack, "save-corrupt", ids)
    injected = proxy.faults_injected
    proxy.corrupt_next_get(at_chunk=2)
    before = await stats(stack["both"])
    tokens, _ = await generate(stack["both"], "load-corrupt", ids)
    after = await settled_stats(stack["both"])
    assert proxy.faults_injected == injected + 1
    # Chunks 0 and 1 loaded; chunk 2 failed its checksum, so it and all after it were computed.
    assert after.kvstore.tokens_loaded - before.kvstore.tokens_loaded == 2 * CHUNK_TOKENS, after.kvstore
    assert after.kvstore.load_failures == before.kvstore.load_failures + 1
    assert tokens == reference["corrupt"]
    assert "fails its key or checksum" in stack["both"].running.log_path.read_text(errors="replace")


async def test_the_kvstore_dying_mid_load_means_computing_the_rest(
    stack: dict[str, Service],
    proxy: FaultyKvStoreProxy,
    prompts: dict[str, list[int]],
    reference: dict[str, list[int]],
) -> None:
    ids = prompts["kvstore-dies"]
    await save_prefix(stack, "save-dies", ids)
    injected = proxy.faults_injected
    proxy.kill_kvstore_in_next_get(after_chunks=3, kill=stack["kvstore"].kill)
    before = await stats(stack["both"])
    tokens, _ = await generate(stack["both"], "load-dies", ids)
    after = await settled_stats(stack["both"])
    assert proxy.faults_injected == injected + 1
    assert stack["kvstore"].running.exit_code() is not None, "the kvstore should be dead"
    assert after.kvstore.tokens_loaded - before.kvstore.tokens_loaded == 3 * CHUNK_TOKENS, after.kvstore
    assert after.kvstore.load_failures == before.kvstore.load_failures + 1
    assert tokens == reference["kvstore-dies"]
    assert "kvstore load failed" in stack["both"].running.log_path.read_text(errors="replace")


async def test_an_unreachable_kvstore_means_computing_not_failing(
    stack: dict[str, Service],
    proxy: FaultyKvStoreProxy,
    prompts: dict[str, list[int]],
    reference: dict[str, list[int]],
) -> None:
    stack["kvstore"].stop()  # already killed by the test before; stopping again is harmless
    proxy.stop()  # nothing listens at the loading worker's kvstore address any more
    before = await stats(stack["both"])
    tokens, _ = await generate(stack["both"], "kvstore-down", prompts["unreachable"])
    after = await settled_stats(stack["both"])
    assert tokens == reference["unreachable"]
    assert after.kvstore.lookup_failures > before.kvstore.lookup_failures
    assert after.prompt_tokens_external == before.prompt_tokens_external
    assert "kvstore lookup failed" in stack["both"].running.log_path.read_text(errors="replace")
