"""Prints kvstore put/get throughput over loopback gRPC for SmolLM2-135M-shaped KV.

Default: 2,048-token prompts of SmolLM2-135M KV (30 layers x K,V x 3 kv heads x 64 dims,
bf16: 23,040 B/token, 47 MB per prompt, 8 chunks of 256 tokens). Starts its own
redis-server and two kvstore processes sharing it: A takes the puts and serves warm gets
(memory); B starts empty, so its first gets come from Redis. Then the same through a KvStore
in this process (no gRPC), which separates the store's cost from the transport's.
A benchmark: numbers, no assertions. Numbers on a shared machine are noisy; compare within
one run.

    ./bazel run //tools/bench:kvstore_throughput -- --rounds 4 [--tokens 2048] [--cpu-bytes 1GiB]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2 as pb
from cleave.kvstore.v1 import kvstore_pb2_grpc
from libs.config.values import parse_bytes
from libs.kvstore.chunks import tensor_crc32c
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.rpc.channel import open_channel
from libs.rpc.ports import free_port
from libs.stack import process as processes
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import LocalStack
from libs.stack.process import ProcessSpec
from services.entry_points import ENTRY_POINTS

SMOLLM2 = common_pb2.KvLayout(
    model_fingerprint="smollm2-135m-instruct-bench",
    block_size=128,
    kv_dtype=common_pb2.DTYPE_BFLOAT16,
    num_layers=30,
    num_kv_heads=3,
    head_dim=64,
)
MIB = 1024 * 1024


def chunks_for(keys: list[pb.ChunkKey], layout: common_pb2.KvLayout) -> list[pb.KvChunk]:
    chunks = []
    for key in keys:
        shape = [layout.num_layers, 2, key.num_tokens, layout.num_kv_heads, layout.head_dim]
        kv = common_pb2.Tensor(
            dtype=layout.kv_dtype,
            shape=shape,
            data=os.urandom(2 * shape[0] * shape[2] * shape[3] * shape[4] * 2),
        )
        chunks.append(pb.KvChunk(key=key, kv=kv, crc32c=tensor_crc32c(kv)))
    return chunks


async def timed(label: str, nbytes: int, rounds: int, fn: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    seconds = []
    for index in range(rounds):
        begin = time.perf_counter()
        await fn(index)
        seconds.append(time.perf_counter() - begin)
    total = sum(seconds)
    rate = f"{nbytes * rounds / MIB / total:8.1f} MiB/s" if nbytes else " " * 14
    print(
        f"{label:<34} {rate}   {1000 * total / rounds:7.1f} ms per prompt (best {1000 * min(seconds):.1f})",
        flush=True,
    )


async def bench(args: argparse.Namespace, a: str, b: str) -> None:
    prompts = [[(seed * 7919 + i) % 49152 for i in range(args.tokens)] for seed in range(1, args.rounds + 1)]
    async with open_channel(a) as chan_a, open_channel(b) as chan_b:
        stub_a, stub_b = kvstore_pb2_grpc.KvStoreStub(chan_a), kvstore_pb2_grpc.KvStoreStub(chan_b)
        keys = [
            list((await stub_a.Lookup(pb.LookupRequest(token_ids=p, layout=SMOLLM2))).keys) for p in prompts
        ]
        chunks = [chunks_for(k, SMOLLM2) for k in keys]
        nbytes = sum(len(c.kv.data) for c in chunks[0])
        print(f"{args.tokens} tokens = {len(keys[0])} chunks, {nbytes / MIB:.1f} MiB of KV per prompt")

        async def put(index: int) -> None:
            async def requests() -> AsyncIterator[pb.PutRequest]:
                for chunk in chunks[index]:
                    yield pb.PutRequest(layout=SMOLLM2, chunk=chunk)

            reply = await stub_a.Put(requests())
            assert reply.stored == len(chunks[index]), reply

        def getter(
            stub: kvstore_pb2_grpc.KvStoreStub, tier: int
        ) -> Callable[[int], Coroutine[Any, Any, None]]:
            async def get(index: int) -> None:
                replies = [r async for r in stub.Get(pb.GetRequest(keys=keys[index]))]
                assert len(replies) == len(keys[index]) and {r.tier for r in replies} == {tier}, "tier"

            return get

        async def lookup(index: int) -> None:
            reply = await stub_a.Lookup(pb.LookupRequest(token_ids=prompts[index], layout=SMOLLM2))
            assert reply.matched_tokens == args.tokens

        await timed("put (memory + Redis write-through)", nbytes, args.rounds, put)
        await timed("get from memory (A)", nbytes, args.rounds, getter(stub_a, pb.TIER_CPU))
        await timed("get from Redis (B, first read)", nbytes, args.rounds, getter(stub_b, pb.TIER_REMOTE))
        await timed("get from memory (B, promoted)", nbytes, args.rounds, getter(stub_b, pb.TIER_CPU))
        await timed("lookup (A, all chunks in memory)", 0, args.rounds, lookup)


def in_process(args: argparse.Namespace, redis_url: str) -> None:
    # LMCache (seconds to import) only once the services are measured.
    from prometheus_client import CollectorRegistry

    from libs.kvstore.store import KvStore

    config = KvStoreConfig(cpu_bytes=parse_bytes("--cpu-bytes", args.cpu_bytes), redis_url=redis_url)
    prompts = [
        [(seed * 7919 + i) % 49152 for i in range(args.tokens)] for seed in range(1001, 1001 + args.rounds)
    ]
    writer = KvStore(config, registry=CollectorRegistry())
    reader = KvStore(config, registry=CollectorRegistry())
    try:
        chunks = [chunks_for(writer.chunk_keys(p, SMOLLM2), SMOLLM2) for p in prompts]
        nbytes = sum(len(c.kv.data) for c in chunks[0])

        async def put(index: int) -> None:
            writer.put(SMOLLM2, chunks[index])

        def getter(store: KvStore) -> Callable[[int], Coroutine[Any, Any, None]]:
            async def get(index: int) -> None:
                assert all(store.get(c.key) is not None for c in chunks[index])

            return get

        asyncio.run(timed("in-process put (memory + Redis)", nbytes, args.rounds, put))
        asyncio.run(timed("in-process get from memory", nbytes, args.rounds, getter(writer)))
        asyncio.run(timed("in-process get from Redis", nbytes, args.rounds, getter(reader)))
    finally:
        writer.close()
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="distinct prompts")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--cpu-bytes", default="1GiB")
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvstore-bench-"))
    # redis-server must be told its port (it cannot report one): the one use of free_port.
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}"
    redis_argv = (
        args.redis_server,
        "--port",
        str(redis_port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--save",
        "",
    )
    redis = processes.start(ProcessSpec(name="redis", argv=redis_argv), workdir)
    stack = LocalStack(workdir)
    try:
        store = KvStoreConfig(cpu_bytes=parse_bytes("--cpu-bytes", args.cpu_bytes), redis_url=redis_url)
        kvstore = ENTRY_POINTS.module(ServiceKind.KVSTORE)
        for name in ("kvstore-a", "kvstore-b"):
            stack.start(name, name, kvstore, KvStoreProcessConfig(store=store, log_level="warning"))
        asyncio.run(stack.wait_ready(120, progress=False))
        [a], [b] = stack.addresses("kvstore-a"), stack.addresses("kvstore-b")
        asyncio.run(bench(args, a, b))
        in_process(args, redis_url)
    finally:
        stack.stop()
        redis.stop(timeout_s=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
