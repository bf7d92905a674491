"""Flags, start-up errors, and the real process: chunks survive a killed kvstore via Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cleave.kvstore.v1 import kvstore_pb2 as pb
from cleave.kvstore.v1 import kvstore_pb2_grpc
from libs.config.errors import ConfigError
from libs.config.values import parse_bytes
from libs.kvstore.server_config import parse_args
from libs.rpc.channel import open_channel
from libs.rpc.ports import free_port
from services.kvstore import main as entry
from tests.libs.kvstore.helpers import LAYOUT, make_chunk, prompt
from tests.libs.kvstore.redis_server import RedisServer

CHUNK_TOKENS = 16


def test_defaults() -> None:
    config = parse_args([])
    assert (config.host, config.port, config.metrics_port) == ("127.0.0.1", 0, None)
    store = config.store
    assert (store.cpu_bytes, store.disk_dir, store.redis_url, store.chunk_tokens) == (
        1 << 30,
        None,
        None,
        256,
    )


def test_tier_flags() -> None:
    config = parse_args(
        ["--cpu-bytes", "512MiB", "--disk-dir", "/tmp/kv", "--disk-bytes", "2G", "--redis-url", "redis://h:1"]
    )
    store = config.store
    assert (store.cpu_bytes, store.disk_dir, store.disk_bytes) == (512 << 20, Path("/tmp/kv"), 2 << 30)
    assert store.redis_url == "redis://h:1"


@pytest.mark.parametrize(
    ("text", "expected"), [("4096", 4096), ("4KiB", 4096), ("1.5GiB", 3 << 29), ("2m", 2 << 20), ("10B", 10)]
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes("--cpu-bytes", text) == expected


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--cpu-bytes", "lots"], "--cpu-bytes"),
        (["--cpu-bytes", "0"], "--cpu-bytes"),
        (["--disk-dir", "/a,/b"], "--disk-dir"),
        (["--redis-url", "http://x"], "--redis-url"),
        (["--chunk-tokens", "0"], "--chunk-tokens"),
        (["--port", "70000"], "--port"),
    ],
)
def test_bad_flags(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args(argv)


def test_config_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--redis-url", "http://nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cleave kvstore: --redis-url") and err.count("\n") == 1


class KvStoreProcess:
    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.kvstore.main", "--port", str(self.port), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.log_path = log_path

    async def wait_serving(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        async with grpc.aio.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self.process.poll() is None, self.log_path.read_text()[-3000:]
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.2)
        raise TimeoutError(f"kvstore at {self.address} not serving after {timeout_s}s")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def _requests(chunks: list[pb.KvChunk]) -> AsyncIterator[pb.PutRequest]:
    for chunk in chunks:
        yield pb.PutRequest(layout=LAYOUT, chunk=chunk)


async def _put_and_lookup(address: str, tokens: list[int]) -> list[pb.KvChunk]:
    async with open_channel(address) as channel:
        stub = kvstore_pb2_grpc.KvStoreStub(channel)
        keys = (await stub.Lookup(pb.LookupRequest(token_ids=tokens, layout=LAYOUT))).keys
        chunks = [make_chunk(key) for key in keys]
        assert (await stub.Put(_requests(chunks))).stored == len(chunks)
        return chunks


async def _get_all(address: str, tokens: list[int]) -> tuple[pb.LookupResponse, list[pb.GetResponse]]:
    async with open_channel(address) as channel:
        stub = kvstore_pb2_grpc.KvStoreStub(channel)
        lookup = await stub.Lookup(pb.LookupRequest(token_ids=tokens, layout=LAYOUT))
        replies = [r async for r in stub.Get(pb.GetRequest(keys=lookup.keys))]
        return lookup, replies


def test_chunks_survive_a_killed_kvstore_through_redis(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    tokens = prompt(1, 3 * CHUNK_TOKENS + 9)
    argv = ["--redis-url", redis.url, "--cpu-bytes", "4MiB", "--chunk-tokens", str(CHUNK_TOKENS)]
    log_path = tmp_path / "kvstore.log"
    first = second = None
    try:
        first = KvStoreProcess(argv, log_path)
        asyncio.run(first.wait_serving())
        chunks = asyncio.run(_put_and_lookup(first.address, tokens))
        first.kill()  # SIGKILL: no shutdown hook runs; a Put's answer means Redis has it

        metrics_port = free_port()
        second = KvStoreProcess([*argv, "--metrics-port", str(metrics_port)], log_path)
        asyncio.run(second.wait_serving())
        lookup, replies = asyncio.run(_get_all(second.address, tokens))
        assert lookup.matched_tokens == len(tokens)
        assert [c.tier for c in lookup.chunks] == [pb.TIER_REMOTE] * 4
        assert [r.chunk for r in replies] == chunks
        assert [r.tier for r in replies] == [pb.TIER_REMOTE] * 4
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert 'cleave_kvstore_hits_total{tier="remote"} 4.0' in text

        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=30) == 0
        assert "grpc server stopped" in log_path.read_text()
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()
        redis.stop()
