"""The launcher checks a child's health with the child's own --grpc-* TLS files: a stack of
mTLS (and token) servers becomes ready, though a plaintext check could not reach them."""

import sys
import textwrap
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.rpc.channel import open_channel
from libs.stack.launcher import LocalStack
from libs.tokenization.server_config import TokenizerServerConfig
from tests.libs.rpc.certs import make_ca, make_leaf

pytestmark = pytest.mark.anyio

# A stand-in service: Cleave's GrpcServer with the security its rendered flags name.
SECURE_SERVICE = """
import asyncio, os, sys
from libs.config.flags import parse
from libs.rpc.security import load_security
from libs.rpc.server import GrpcServer, ServerConfig
from libs.tokenization.server_config import TokenizerServerConfig

async def main():
    config = parse(TokenizerServerConfig, sys.argv[1:])
    security = load_security(config, os.environ)
    server = GrpcServer(ServerConfig(host=config.host, port=config.port, port_file=config.port_file, security=security), [])
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


async def test_a_stack_of_mtls_servers_with_a_token_becomes_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secure_service.py").write_text(textwrap.dedent(SECURE_SERVICE))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])  # children inherit sys.path
    ca, ca_key = make_ca()
    leaf = make_leaf(ca, ca_key, "service", ips=("127.0.0.1",))
    for name, data in {"cert": leaf.cert, "key": leaf.key, "ca": ca.cert, "token": b"stack-token"}.items():
        (tmp_path / name).write_bytes(data)
    config = TokenizerServerConfig(
        grpc_tls_cert_file=tmp_path / "cert",
        grpc_tls_key_file=tmp_path / "key",
        grpc_tls_ca_file=tmp_path / "ca",
        grpc_token_file=tmp_path / "token",
    )
    stack = LocalStack(tmp_path / "logs")
    try:
        service = stack.start("secure", "tokenizer", "secure_service", config)
        assert service.security.server_transport == "mtls" and service.security.token == "stack-token"
        await stack.wait_ready(timeout_s=60, progress=False)
        async with open_channel(service.address) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stack.stop(timeout_s=5)
