"""Flags, start-up errors, and the real process: serves, then stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.config.errors import ConfigError
from libs.rpc.ports import free_port
from libs.tokenization.server_config import parse_args
from services.tokenizer import main as entry


def test_defaults() -> None:
    config = parse_args([])
    assert (config.model, config.host, config.port, config.max_model_len) == ("smollm2", "127.0.0.1", 0, None)
    assert config.served_model_name is None and not config.log_json


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--port", "70000"], "--port"), (["--max-model-len", "0"], "--max-model-len")],
)
def test_bad_flags(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args(argv)


def test_config_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--port", "http"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cleave tokenizer: --port") and err.count("\n") == 1


def test_missing_model_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Keep this process's logging as the other tests expect it.
    monkeypatch.setattr(entry, "configure_logging", lambda **_: None)
    assert entry.main(["--model", str(tmp_path / "nope"), "--model-cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cleave tokenizer: Cannot use model") and err.count("\n") == 1


async def _wait_serving(address: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert process.poll() is None, "the tokenizer process exited early"
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"tokenizer at {address} not serving after {timeout_s}s")


async def _check_info(address: str, process: subprocess.Popen[bytes]) -> None:
    await _wait_serving(address, process, timeout_s=60)
    async with grpc.aio.insecure_channel(address) as channel:
        info = await tokenizer_pb2_grpc.TokenizerStub(channel).GetInfo(pb.GetInfoRequest())
    assert (info.model, info.max_model_len, info.vocab_size) == ("smol", 4096, 49152)


def test_process_serves_and_stops_on_sigterm(smollm2_dir: Path, tmp_path: Path) -> None:
    # A local HF folder (resolve_model wants config.json) avoids converting SmolLM2's weights.
    model = tmp_path / "smol-tokenizer-only"
    shutil.copytree(smollm2_dir, model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    port = free_port()
    argv = [
        "--model",
        str(model),
        "--port",
        str(port),
        "--served-model-name",
        "smol",
        "--max-model-len",
        "4096",
    ]
    # The test's own import path, so `python -m services...` finds the same packages.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    log_path = tmp_path / "tokenizer.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.tokenizer.main", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        asyncio.run(_check_info(f"127.0.0.1:{port}", process))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "grpc server stopped" in log_path.read_text(), log_path.read_text()[-2000:]
