"""Warm vs cold TTFT of a ~1,900-token prompt prefix through the kvstore (issue: kvstore).

Starts a kvstore and two colocated workers (pinned to cores 0 and 1 on CPU), both with the
kvstore connector. Each round takes a fresh random prefix: worker A computes the prompt cold
(and saves its chunks), then worker B gets the same prompt and loads the stored prefix. The
workers swap roles every round, so both sides see both workers. Prints per-round numbers,
medians and the warm/cold ratio, and whether greedy outputs matched (with --mxint8 the
stored KV is lossy, so this is where its effect on outputs shows).

    ./bazel run //tools/bench:kvstore_reuse -- --rounds 6 [--mxint8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from cleave.common.v1 import common_pb2
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.groups import DEFAULT_CACHE_DIR
from libs.config.roles import Role
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.models.resolve import resolve_model
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import LocalStack
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from libs.worker.config import WorkerConfig
from services.entry_points import ENTRY_POINTS
from tools.bench import words


def prompt(tokenizer: Tokenizer, seed: int, prefix_tokens: int) -> list[int]:
    # ~1 token per word (tools/bench/words.py); cut to exactly prefix_tokens below.
    text = f"Notes #{seed}: " + words.text(np.random.default_rng(seed), 2 * prefix_tokens)
    question = "\n\nQuestion: which word comes up most often?\nAnswer:"
    return tokenizer.encode(text)[:prefix_tokens] + tokenizer.encode(question, add_special_tokens=False)


async def generate(address: str, request_id: str, ids: list[int], max_tokens: int) -> tuple[float, list[int]]:
    started = time.perf_counter()
    ttft = 0.0
    tokens: list[int] = []
    async with grpc.aio.insecure_channel(address) as channel:
        request = worker_pb2.GenerateRequest(
            metadata=common_pb2.RequestMetadata(request_id=request_id),
            prompt_token_ids=ids,
            sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens),
        )
        async for response in worker_pb2_grpc.WorkerStub(channel).Generate(request):
            if response.HasField("error"):
                raise RuntimeError(response.error.message)
            if response.HasField("chunk") and response.chunk.token_ids:
                ttft = ttft or time.perf_counter() - started
                tokens.extend(response.chunk.token_ids)
    return ttft, tokens


async def tokens_loaded(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stats = await worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest())
    return int(stats.kvstore.tokens_loaded)


async def run(args: argparse.Namespace, stack: LocalStack, tokenizer: Tokenizer) -> None:
    store = KvStoreConfig(cpu_bytes=1 << 30, chunk_tokens=args.chunk_tokens)
    kvstore = stack.start(
        "kvstore", "kvstore", ENTRY_POINTS.module(ServiceKind.KVSTORE), KvStoreProcessConfig(store=store)
    )
    kvstore_address = kvstore.wait_bound()
    for index in range(2):
        worker = WorkerConfig(
            role=Role.BOTH, model=args.model, device_group=(index,), kvstore_address=kvstore_address,
            kvstore_chunk_tokens=args.chunk_tokens, dtype=args.dtype,
            kv_cache_dtype="mxint8" if args.mxint8 else "auto",
        )  # fmt: skip
        stack.start(f"worker{index}", "both", ENTRY_POINTS.module(ServiceKind.WORKER), worker)
    await stack.wait_ready(timeout_s=900)
    workers = stack.addresses("both")
    # One throwaway round: the first requests of a fresh engine are slower.
    warmup = prompt(tokenizer, 10_000, 256)
    for index, address in enumerate(workers):
        await generate(address, f"warmup-{index}", warmup, 2)

    cold_ttfts, warm_ttfts, matches, loaded_shares = [], [], 0, []
    print(f"{'round':>5} {'cold ms':>8} {'warm ms':>8} {'loaded':>7} {'same output':>11}")
    for round_index in range(args.rounds):
        ids = prompt(tokenizer, round_index, args.prefix_tokens)
        cold, warm = workers[round_index % 2], workers[(round_index + 1) % 2]
        cold_ttft, cold_tokens = await generate(cold, f"cold-{round_index}", ids, args.max_tokens)
        await asyncio.sleep(1.0)  # saving runs in the background; let it land
        before = await tokens_loaded(warm)
        warm_ttft, warm_tokens = await generate(warm, f"warm-{round_index}", ids, args.max_tokens)
        await asyncio.sleep(1.5)  # vLLM's stat loggers run after the step
        loaded = await tokens_loaded(warm) - before
        same = warm_tokens == cold_tokens
        cold_ttfts.append(cold_ttft)
        warm_ttfts.append(warm_ttft)
        loaded_shares.append(loaded / len(ids))
        matches += same
        print(
            f"{round_index:>5} {cold_ttft * 1000:>8.0f} {warm_ttft * 1000:>8.0f} {loaded / len(ids):>7.0%} {same!s:>11}"
        )
    cold_median, warm_median = statistics.median(cold_ttfts), statistics.median(warm_ttfts)
    kv_format = "mxint8" if args.mxint8 else args.dtype
    print(
        f"\nprompt {len(ids)} tokens, KV in the kvstore as {kv_format}: median TTFT cold {cold_median * 1000:.0f} ms, "
        f"warm {warm_median * 1000:.0f} ms, warm/cold {warm_median / cold_median:.2f}; "
        f"loaded {statistics.median(loaded_shares):.0%} of the prompt; greedy outputs equal in {matches}/{args.rounds}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto", help="worker dtype (auto = bfloat16 on CPU)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prefix-tokens", type=int, default=1900)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--mxint8", action="store_true", help="store KV as MXINT8 (--kv-cache-dtype mxint8)")
    args = parser.parse_args()
    model = resolve_model(args.model, DEFAULT_CACHE_DIR / "models")
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=model.path))
    stack = LocalStack(Path(tempfile.mkdtemp(prefix="cleave-kvstore-reuse-")))
    try:
        asyncio.run(run(args, stack, tokenizer))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
