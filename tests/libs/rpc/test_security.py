"""TLS, mTLS and the bearer token between real grpc.aio servers and channels on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.errors import ConfigError
from libs.config.groups import GrpcSecurityFlags
from libs.rpc.channel import open_blocking_channel, open_channel
from libs.rpc.security import TOKEN_ENV, RpcSecurity, load_security
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from tests.libs.rpc.certs import Pem, make_ca, make_leaf

pytestmark = pytest.mark.anyio

WORKER = "cleave.worker.v1.Worker"
TOKEN = "s3cret-token"


class Worker(worker_pb2_grpc.WorkerServicer):
    async def GetInfo(self, request: worker_pb2.GetInfoRequest, context: object) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model="ok")

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: object
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        yield worker_pb2.GenerateResponse()


@pytest.fixture(scope="module")
def pki() -> dict[str, Pem]:
    ca, ca_key = make_ca()
    other_ca, other_key = make_ca("another CA")
    return {
        "ca": ca,
        "service": make_leaf(ca, ca_key, "service", dns=("localhost",), ips=("127.0.0.1",)),
        "named": make_leaf(ca, ca_key, "named", dns=("cleave.internal",)),
        "other_ca": other_ca,
        "stranger": make_leaf(other_ca, other_key, "stranger", ips=("127.0.0.1",)),
    }


async def started(security: RpcSecurity, **config: object) -> GrpcServer:
    binding = ServiceBinding(WORKER, Worker(), worker_pb2_grpc.add_WorkerServicer_to_server)
    server = GrpcServer(ServerConfig(security=security, **config), [binding])  # type: ignore[arg-type]
    await server.start()
    return server


async def get_info(address: str, security: RpcSecurity | None = None) -> grpc.StatusCode:
    """OK, or the code the call failed with."""
    async with open_channel(address, security=security) as channel:
        try:
            await worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def tls(pem: Pem, ca: Pem | None = None, **fields: Any) -> RpcSecurity:
    return RpcSecurity(
        cert_chain=pem.cert, private_key=pem.key, ca_certificates=ca.cert if ca else None, **fields
    )


def client(ca: Pem, pem: Pem | None = None, **fields: Any) -> RpcSecurity:
    return RpcSecurity(
        ca_certificates=ca.cert,
        cert_chain=pem.cert if pem else None,
        private_key=pem.key if pem else None,
        **fields,
    )


async def test_tls_server_refuses_plaintext_and_accepts_clients_trusting_its_ca(pki: dict[str, Pem]) -> None:
    server = await started(tls(pki["service"]))
    try:
        assert await get_info(server.address) == grpc.StatusCode.UNAVAILABLE
        assert await get_info(server.address, client(pki["ca"])) == grpc.StatusCode.OK
        # A client trusting another CA does not accept the server's certificate.
        assert await get_info(server.address, client(pki["other_ca"])) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop()


async def test_server_name_override_checks_a_certificate_issued_for_a_name(pki: dict[str, Pem]) -> None:
    server = await started(tls(pki["named"]))
    try:
        # The certificate names cleave.internal, not 127.0.0.1.
        assert await get_info(server.address, client(pki["ca"])) == grpc.StatusCode.UNAVAILABLE
        named = client(pki["ca"], server_name="cleave.internal")
        assert await get_info(server.address, named) == grpc.StatusCode.OK
    finally:
        await server.stop()


async def test_mtls_requires_a_client_certificate_signed_by_the_ca(pki: dict[str, Pem]) -> None:
    server = await started(tls(pki["service"], pki["ca"]))
    assert server.address
    try:
        assert await get_info(server.address, client(pki["ca"])) == grpc.StatusCode.UNAVAILABLE
        stranger = client(pki["ca"], pki["stranger"])
        assert await get_info(server.address, stranger) == grpc.StatusCode.UNAVAILABLE
        # What a Cleave service uses to call another: its own certificate, key and the CA.
        assert await get_info(server.address, tls(pki["service"], pki["ca"])) == grpc.StatusCode.OK
    finally:
        await server.stop()


async def test_token_required_for_every_method_but_health(pki: dict[str, Pem]) -> None:
    server = await started(RpcSecurity(token=TOKEN), reflection=True)
    try:
        assert await get_info(server.address) == grpc.StatusCode.UNAUTHENTICATED
        assert await get_info(server.address, RpcSecurity(token="wrong")) == grpc.StatusCode.UNAUTHENTICATED
        assert await get_info(server.address, RpcSecurity(token=TOKEN)) == grpc.StatusCode.OK
        async with open_channel(server.address) as channel:
            # A streaming method, an unknown one and reflection are refused the same way.
            stream = worker_pb2_grpc.WorkerStub(channel).Generate(worker_pb2.GenerateRequest())
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [r async for r in stream]
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            unknown = channel.unary_unary("/cleave.nope.v1.Nope/Call")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert await list_services(channel) == grpc.StatusCode.UNAUTHENTICATED
            # Health answers without the token (probes cannot send metadata).
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        async with open_channel(server.address, security=RpcSecurity(token=TOKEN)) as channel:
            replies = [
                r async for r in worker_pb2_grpc.WorkerStub(channel).Generate(worker_pb2.GenerateRequest())
            ]
            assert len(replies) == 1
    finally:
        await server.stop()


async def test_token_and_mtls_together(pki: dict[str, Pem]) -> None:
    server = await started(tls(pki["service"], pki["ca"], token=TOKEN))
    try:
        both = tls(pki["service"], pki["ca"], token=TOKEN)
        assert await get_info(server.address, both) == grpc.StatusCode.OK
        no_token = tls(pki["service"], pki["ca"])
        assert await get_info(server.address, no_token) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop()


async def test_blocking_channels_speak_tls_and_send_the_token(pki: dict[str, Pem]) -> None:
    """The kvstore connector's channel (blocking API, inside vLLM's engine process)."""
    server = await started(tls(pki["service"], pki["ca"], token=TOKEN))
    try:
        for security, expected in [
            (tls(pki["service"], pki["ca"], token=TOKEN), grpc.StatusCode.OK),
            (tls(pki["service"], pki["ca"]), grpc.StatusCode.UNAUTHENTICATED),
            (RpcSecurity(token=TOKEN), grpc.StatusCode.UNAVAILABLE),
        ]:
            assert await asyncio.to_thread(blocking_get_info, server.address, security) == expected
    finally:
        await server.stop()


def blocking_get_info(address: str, security: RpcSecurity) -> grpc.StatusCode:
    with open_blocking_channel(address, security=security) as channel:
        try:
            worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest(), timeout=5)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def list_services(channel: grpc.aio.Channel) -> grpc.StatusCode | set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    try:
        responses = [r async for r in stub.ServerReflectionInfo(iter([request]))]
    except grpc.aio.AioRpcError as error:
        return error.code()
    return {s.name for s in responses[0].list_services_response.service}


async def test_reflection_is_off_by_default() -> None:
    server = await started(RpcSecurity())
    try:
        async with open_channel(server.address) as channel:
            assert await list_services(channel) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop()


# ---- loading the flags -------------------------------------------------------------------


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_load_reads_the_files_the_flags_name(tmp_path: Path, pki: dict[str, Pem]) -> None:
    flags = GrpcSecurityFlags(
        grpc_tls_cert_file=write(tmp_path, "c.pem", pki["service"].cert),
        grpc_tls_key_file=write(tmp_path, "k.pem", pki["service"].key),
        grpc_tls_ca_file=write(tmp_path, "ca.pem", pki["ca"].cert),
        grpc_tls_server_name="cleave.internal",
        grpc_token_file=write(tmp_path, "token", f"{TOKEN}\n"),
    )
    security = load_security(flags, {TOKEN_ENV: "ignored: the file wins"})
    assert security == tls(pki["service"], pki["ca"], server_name="cleave.internal", token=TOKEN)
    assert security.server_transport == "mtls" and security.tls
    # Key material and the token stay out of reprs, so out of logs.
    assert TOKEN not in repr(security) and "PRIVATE" not in repr(security)


def test_token_from_the_environment_and_none_by_default() -> None:
    assert load_security(GrpcSecurityFlags(), {TOKEN_ENV: f" {TOKEN} "}).token == TOKEN
    assert load_security(GrpcSecurityFlags(), {}) == RpcSecurity()
    assert RpcSecurity().server_transport == "plaintext" and not RpcSecurity().tls


def test_bad_settings_name_their_flag(tmp_path: Path, pki: dict[str, Pem]) -> None:
    cert = write(tmp_path, "c.pem", pki["service"].cert)
    with pytest.raises(ConfigError, match="--grpc-tls-key-file"):
        load_security(GrpcSecurityFlags(grpc_tls_cert_file=cert), {})
    with pytest.raises(ConfigError, match=r"--grpc-tls-ca-file.*a readable file"):
        load_security(GrpcSecurityFlags(grpc_tls_ca_file=tmp_path / "missing.pem"), {})
    with pytest.raises(ConfigError, match=r"--grpc-tls-ca-file.*a PEM file"):
        load_security(GrpcSecurityFlags(grpc_tls_ca_file=write(tmp_path, "x", "not pem")), {})
    with pytest.raises(ConfigError, match="--grpc-token-file"):
        load_security(GrpcSecurityFlags(grpc_token_file=write(tmp_path, "empty", "\n")), {})
    with pytest.raises(ConfigError, match=TOKEN_ENV) as error:
        load_security(GrpcSecurityFlags(), {TOKEN_ENV: "has space"})
    assert "has space" not in str(error.value)  # a token is never echoed


async def test_a_token_file_of_several_lines_sends_the_first_and_accepts_any(tmp_path: Path) -> None:
    # A rotation's middle step: every service sends the new token and still takes the old one.
    flags = GrpcSecurityFlags(grpc_token_file=write(tmp_path, "token", "new-token\nold-token\n"))
    security = load_security(flags, {})
    assert security.token == "new-token" and security.accepted_tokens == ("new-token", "old-token")
    server = await started(security)
    try:
        for token, code in (
            ("new-token", grpc.StatusCode.OK),
            ("old-token", grpc.StatusCode.OK),
            ("other-token", grpc.StatusCode.UNAUTHENTICATED),
        ):
            assert await get_info(server.address, RpcSecurity(token=token)) == code
    finally:
        await server.stop()
    with pytest.raises(ConfigError, match="--grpc-token-file"):
        load_security(GrpcSecurityFlags(grpc_token_file=write(tmp_path, "bad", "ok\nhas space\n")), {})
