"""tools/deploy_secrets: what it writes works as a deployment's gRPC security (real grpc.aio
servers and channels on loopback, as the services load it), is kept across runs, and each step
of each rotation leaves every pair of services (one rolled out, one not) able to talk."""

from __future__ import annotations

import itertools
import shutil
import stat
from pathlib import Path

import grpc
import grpc.aio
import pytest

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.groups import GrpcSecurityFlags
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity, load_security
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from tools.deploy_secrets import kustomize
from tools.deploy_secrets.main import main
from tools.deploy_secrets.material import (
    CA_KEY,
    KV_AUTH_KEY,
    REDIS_CONF,
    REDIS_PASSWORD,
    TOKEN,
    Options,
    RotationError,
    Secrets,
    Step,
)
from tools.deploy_secrets.pki import SERVER_NAME

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def one_event_loop() -> None:
    """Keeps anyio's event loop open across this module's tests. With a loop per test, gRPC's aio
    poller can hand a late event of a server a test stopped to that test's loop after it
    closed, failing the next test with "Event loop is closed" (seen once in a CI rehearsal on
    2026-12-06, in the rotation test's second case). anyio keeps its runner, and so its loop,
    while a fixture of a wider scope set up through it is alive."""


class Info(worker_pb2_grpc.WorkerServicer):
    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model="ok")


def security(folder: Path, *, token: bool = True, certificate: bool = True) -> RpcSecurity:
    """What a service started with the deployment's flags loads (compose and k8s pass these)."""
    return load_security(
        GrpcSecurityFlags(
            grpc_tls_cert_file=folder / "tls.crt" if certificate else None,
            grpc_tls_key_file=folder / "tls.key" if certificate else None,
            grpc_tls_ca_file=folder / "ca.crt",
            grpc_tls_server_name=SERVER_NAME,
            grpc_token_file=folder / TOKEN if token else None,
        ),
        {},
    )


async def call(server_folder: Path, client: RpcSecurity) -> grpc.StatusCode:
    binding = ServiceBinding("cleave.worker.v1.Worker", Info(), worker_pb2_grpc.add_WorkerServicer_to_server)
    server = GrpcServer(ServerConfig(security=security(server_folder)), [binding])
    await server.start()
    try:
        async with open_channel(f"127.0.0.1:{server.port}", security=client) as channel:
            await worker_pb2_grpc.WorkerStub(channel).GetInfo(worker_pb2.GetInfoRequest(), timeout=10)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as error:
        return error.code()
    finally:
        await server.stop(0)


def snapshot(folder: Path, into: Path) -> Path:
    shutil.copytree(folder, into)
    return into


def test_written_once_private_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "prod"
    secrets = Secrets(folder)
    assert set(secrets.ensure()) >= {
        TOKEN,
        "ca.crt",
        "tls.crt",
        "tls.key",
        REDIS_PASSWORD,
        REDIS_CONF,
        KV_AUTH_KEY,
    }
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert all(stat.S_IMODE((folder / name).stat().st_mode) == 0o600 for name in before)
    assert CA_KEY in before
    assert Secrets(folder).ensure() == []  # a second run (compose's every `up`) changes nothing
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    password = secrets.lines(REDIS_PASSWORD)[0]
    assert secrets.read(REDIS_CONF).decode() == f"user default on >{password} ~* &* +@all\n"
    compose = tmp_path / "compose"
    Secrets(compose, Options(keep_ca_key=False)).ensure()
    assert not (compose / CA_KEY).exists()


@pytest.mark.usefixtures("one_event_loop")
async def test_mtls_and_the_token_admit_the_deployment_and_nobody_else(tmp_path: Path) -> None:
    folder = tmp_path / "prod"
    Secrets(folder).ensure()
    other = tmp_path / "other"
    Secrets(other).ensure()
    assert await call(folder, security(folder)) == grpc.StatusCode.OK
    # Holding the certificate but not the token: refused by the token check.
    assert await call(folder, security(folder, token=False)) == grpc.StatusCode.UNAUTHENTICATED
    # Without a client certificate, or with another deployment's: no connection at all.
    assert await call(folder, security(folder, certificate=False)) == grpc.StatusCode.UNAVAILABLE
    assert await call(folder, security(other)) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.usefixtures("one_event_loop")
@pytest.mark.parametrize("what", ["token", "ca"])
async def test_each_rotation_step_keeps_rolled_and_unrolled_services_talking(
    tmp_path: Path, what: str
) -> None:
    folder = tmp_path / "live"
    secrets = Secrets(folder)
    secrets.ensure()
    rotate = secrets.rotate_token if what == "token" else secrets.rotate_ca
    states = [snapshot(folder, tmp_path / "0")]
    for i, step in enumerate(Step, start=1):
        rotate(step)
        states.append(snapshot(folder, tmp_path / str(i)))
    # During each rollout some services run with the state before the step, some after it.
    for before, after in itertools.pairwise(states):
        for server, client in ((before, after), (after, before)):
            assert await call(server, security(client)) == grpc.StatusCode.OK, (
                what,
                server.name,
                client.name,
            )
    # The rotation did replace the secret: the first state and the last do not talk.
    assert await call(states[0], security(states[-1])) != grpc.StatusCode.OK


def test_steps_out_of_order_are_refused(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "s")
    secrets.ensure()
    with pytest.raises(RotationError, match="begin first"):
        secrets.rotate_token(Step.SWITCH)
    secrets.rotate_redis_password(Step.BEGIN)
    old, new = secrets.lines(REDIS_PASSWORD)
    assert secrets.read(REDIS_CONF).decode().startswith(f"user default on >{old} >{new} ")
    with pytest.raises(RotationError, match="under way"):
        secrets.rotate_redis_password(Step.BEGIN)
    with pytest.raises(RotationError, match="switch first"):
        secrets.rotate_ca(Step.FINISH)


def test_the_command_line_writes_the_kustomization_with_a_content_tag(tmp_path: Path) -> None:
    overlay = tmp_path / "deploy" / "k8s" / "overlays" / "1p1d"
    overlay.mkdir(parents=True)
    out = tmp_path / "prod"
    assert main(["--out", str(out), "--kustomize", str(overlay), "--image-tag", "c-0123456789ab"]) == 0
    text = (out / "kustomization.yaml").read_text()
    assert "  - ../deploy/k8s/overlays/1p1d\n" in text
    assert text.count("newTag: c-0123456789ab") == len(kustomize.IMAGES)
    assert "ca.key" not in text  # the CA key stays with the operator
    with pytest.raises(SystemExit):
        main(["--out", str(out), "--kustomize", str(overlay)])  # no tag: never `latest`
