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
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.config.errors import ConfigError
from libs.config.flags import render
from libs.config.groups import GrpcSecurityFlags
from libs.rpc.channel import open_channel
from libs.rpc.ports import free_port
from libs.rpc.security import TOKEN_ENV, RpcSecurity, load_security
from libs.tokenization.server_config import parse_args
from services.tokenizer import main as entry
from tests.libs.rpc.certs import make_ca, make_leaf


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


def test_process_with_mtls_and_a_token_serves_only_callers_with_both(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    """The --grpc-* flags reach the real process's server: what a Cleave service that holds
    the certificate, the CA and the token can call, a plaintext or tokenless caller cannot."""
    model = tmp_path / "smol-tokenizer-only"
    shutil.copytree(smollm2_dir, model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    ca, ca_key = make_ca()
    leaf = make_leaf(ca, ca_key, "tokenizer", ips=("127.0.0.1",))
    files = {"cert": leaf.cert, "key": leaf.key, "ca": ca.cert, "token": b"t0ken-for-the-test"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    flags = GrpcSecurityFlags(
        grpc_tls_cert_file=tmp_path / "cert",
        grpc_tls_key_file=tmp_path / "key",
        grpc_tls_ca_file=tmp_path / "ca",
        grpc_token_file=tmp_path / "token",
    )
    port = free_port()
    argv = ["--model", str(model), "--port", str(port), *render(flags)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop(TOKEN_ENV, None)
    log_path = tmp_path / "tokenizer.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.tokenizer.main", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        security = load_security(flags, {})
        codes = asyncio.run(_secured_calls(f"127.0.0.1:{port}", process, security))
        assert codes == {
            "cert, CA and token": grpc.StatusCode.OK,
            "no token": grpc.StatusCode.UNAUTHENTICATED,
            "no client certificate": grpc.StatusCode.UNAVAILABLE,
            "plaintext": grpc.StatusCode.UNAVAILABLE,
        }, log_path.read_text()[-2000:]
    finally:
        process.kill()
        process.wait()
    assert "t0ken-for-the-test" not in log_path.read_text()


async def _secured_calls(
    address: str, process: subprocess.Popen[bytes], security: RpcSecurity
) -> dict[str, grpc.StatusCode]:
    callers = {
        "cert, CA and token": security,
        "no token": replace(security, token=None),
        "no client certificate": replace(security, cert_chain=None, private_key=None),
        "plaintext": RpcSecurity(token=security.token),
    }
    deadline = time.monotonic() + 60
    while True:  # serving once the rightful caller gets through
        assert process.poll() is None, "the tokenizer process exited early"
        codes = {name: await _get_info_code(address, caller) for name, caller in callers.items()}
        if codes["cert, CA and token"] == grpc.StatusCode.OK or time.monotonic() > deadline:
            return codes
        await asyncio.sleep(0.2)


async def _get_info_code(address: str, security: RpcSecurity) -> grpc.StatusCode:
    async with open_channel(address, security=security) as channel:
        try:
            await tokenizer_pb2_grpc.TokenizerStub(channel).GetInfo(pb.GetInfoRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


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
