"""A colocated (`both`) worker on real vLLM with SmolLM2, over gRPC: token-identical to vLLM's
own LLM.generate on 20 varied prompts, stats, and INVALID_ARGUMENT on bad input. Runs in
//... (no NIXL); the disaggregated suite is test_worker_pd (manual, see BUILD.bazel)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.harness import Service, child_env, log_dir, rss_mib, wait_healthy
from tests.e2e.stack import start_worker

pytestmark = pytest.mark.anyio
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompts: list[tuple[str, list[int]]]) -> list[list[int]]:
    folder = log_dir()
    prompts_file, out_file = folder / "prompts.json", folder / "reference.json"
    prompts_file.write_text(json.dumps([ids for _, ids in prompts]))
    with (folder / "reference.log").open("wb") as log:
        subprocess.run(
            [sys.executable, "-m", "tests.e2e.reference_vllm", str(model_dir), str(prompts_file), str(out_file), str(MAX_TOKENS)],
            stdout=log, stderr=subprocess.STDOUT, env=child_env(), check=True, timeout=900,
        )  # fmt: skip
    return list(json.loads(out_file.read_text()))


@pytest.fixture(scope="module")
def worker(model_dir: Path, reference: list[list[int]]) -> Iterator[Service]:
    service = start_worker("both", model_dir)
    try:
        asyncio.run(wait_healthy(service, timeout_s=600))
        print(f"worker both: ready after {service.ready_after_s:.1f} s, RSS {rss_mib(service):.0f} MiB")
        yield service
    finally:
        service.stop()


def greedy(max_tokens: int = MAX_TOKENS) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens)


async def test_colocated_worker_equals_vllm_generate(
    worker: Service, prompts: list[tuple[str, list[int]]], reference: list[list[int]]
) -> None:
    assert len(prompts) >= 20
    mismatches = []
    async with grpc.aio.insecure_channel(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        for i, ((label, ids), expected) in enumerate(zip(prompts, reference, strict=True)):
            request = worker_pb2.GenerateRequest(
                metadata=common_pb2.RequestMetadata(request_id=f"c-{i}"),
                prompt_token_ids=ids,
                sampling=greedy(),
            )
            tokens: list[int] = []
            complete = None
            async for response in stub.Generate(request):
                assert not response.HasField("error"), response.error.message
                if response.HasField("chunk"):
                    tokens.extend(response.chunk.token_ids)
                elif response.HasField("complete"):
                    complete = response.complete
            assert complete is not None and complete.usage.prompt_tokens == len(ids)
            assert complete.usage.completion_tokens == len(tokens)
            if tokens != expected:
                mismatches.append(f"{label!r}:\n  worker {tokens}\n  vllm   {expected}")
        stats = await stub.GetStats(worker_pb2.GetStatsRequest())
    assert mismatches == [], "\n".join(mismatches)
    assert stats.requests_finished >= len(prompts)
    assert stats.prompt_tokens_computed + stats.prompt_tokens_local_cache_hit >= sum(
        len(ids) for _, ids in prompts
    )


@pytest.mark.parametrize(
    ("ids", "model", "message"),
    [
        ([], "", "prompt is empty"),
        ([1] * 2048, "", "prompt has 2048 tokens; this model's context is 2048"),
        ([1, 49152, 70000], "", r"2 token id\(s\) outside the vocabulary \[0, 49152\)"),
        ([1, 2], "no-such-model", "model 'no-such-model' is not served here"),
    ],
)
async def test_bad_input_is_invalid_argument(
    worker: Service, ids: list[int], model: str, message: str
) -> None:
    import re

    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(
            worker_pb2.GenerateRequest(
                metadata=common_pb2.RequestMetadata(model=model), prompt_token_ids=ids, sampling=greedy(2)
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, info.value.details() or "")
    # The engine survived the bad input.
    async with grpc.aio.insecure_channel(worker.address) as channel:
        info_reply = await worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest())
    assert info_reply.vocab_size == 49152
