"""LoRA adapters at the gateway: vLLM's --lora-modules spellings, a request's `model`
resolved, /v1/models' cards and the run-time load and unload checks."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio
import pytest

from cleave.worker.v1 import worker_pb2
from libs.config.errors import ConfigError
from libs.gateway.api.adapters import (
    Adapters,
    LoadLoraAdapterRequest,
    LoraModule,
    UnloadLoraAdapterRequest,
    parse_lora_module,
    runtime_updates_allowed,
)
from libs.gateway.common import errors

pytestmark = pytest.mark.anyio


def test_a_request_for_another_model_is_a_404_naming_the_served_one() -> None:
    adapters = Adapters([LoraModule("sql", "/adapters/sql")])
    assert adapters.resolve(None, "smol") is None
    assert adapters.resolve("smol", "smol") is None
    with pytest.raises(errors.ApiError, match="this server serves 'smol'") as raised:
        adapters.resolve("gpt-4", "smol")
    assert (raised.value.status, raised.value.code) == (404, "model_not_found")


def test_an_adapter_name_resolves_to_its_name_and_path() -> None:
    adapter = Adapters([LoraModule("sql", "/adapters/sql")]).resolve("sql", "smol")
    assert adapter is not None
    assert (adapter.name, adapter.path) == ("sql", "/adapters/sql")


@pytest.mark.parametrize(
    "text", ["sql=", "=/adapters/sql", '{"name": "sql"}', '{"name": "sql", "rank": 8}', "a,b"]
)
def test_a_malformed_module_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--lora-modules"):
        parse_lora_module("--lora-modules", text)


def test_models_list_adapters_with_their_path_and_parent() -> None:
    adapters = Adapters([LoraModule("sql", "/adapters/sql"), LoraModule("chat", "/a/chat", "base")])
    cards = adapters.cards("smol")
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        ("sql", "/adapters/sql", "smol"),
        ("chat", "/a/chat", "base"),
    ]


class Stub:
    """A worker's LoadLoraAdapter: refuses with `code` (None: loads it)."""

    def __init__(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        self.code, self.details = code, details
        self.loaded: list[tuple[str, str]] = []

    async def LoadLoraAdapter(self, request: worker_pb2.LoadLoraAdapterRequest, **_call: object) -> object:
        if self.code is not None:
            raise grpc.aio.AioRpcError(
                self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=self.details
            )
        self.loaded.append((request.adapter.name, request.adapter.path))
        return worker_pb2.LoadLoraAdapterResponse()


@dataclass
class Worker:
    stub: Stub
    healthy: bool = True


async def test_load_tries_the_adapter_on_every_serving_worker_then_serves_it() -> None:
    adapters = Adapters(runtime_updates=True)
    workers = [Worker(Stub()), Worker(Stub()), Worker(Stub(), healthy=False)]
    message = await adapters.load(
        LoadLoraAdapterRequest(lora_name="sql", lora_path="/a/sql"), "smol", workers
    )
    assert message == "Success: LoRA adapter 'sql' added successfully."
    assert [w.stub.loaded for w in workers] == [[("sql", "/a/sql")], [("sql", "/a/sql")], []]
    assert adapters.resolve("sql", "smol") is not None


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.INVALID_ARGUMENT, 500),
        (grpc.StatusCode.UNAVAILABLE, 503),
    ],
)
async def test_an_adapter_a_worker_refuses_is_not_served(code: grpc.StatusCode, status: int) -> None:
    adapters = Adapters(runtime_updates=True)
    workers = [Worker(Stub()), Worker(Stub(code, "Loading lora sql failed: No adapter found for /a/sql"))]
    with pytest.raises(errors.ApiError) as refused:
        await adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/a/sql"), "smol", workers)
    assert refused.value.status == status and "No adapter found" in refused.value.message
    with pytest.raises(errors.ApiError, match="does not exist"):
        adapters.resolve("sql", "smol")
    with pytest.raises(errors.ApiError) as none:
        await adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/a/sql"), "smol", [])
    assert none.value.status == 503


async def test_load_and_unload_follow_vllms_checks() -> None:
    adapters = Adapters(runtime_updates=True)
    workers = [Worker(Stub())]
    await adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/a/sql"), "smol", workers)
    with pytest.raises(errors.ApiError, match="already been loaded") as again:
        await adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/b/sql"), "smol", workers)
    assert again.value.status == 400
    await adapters.load(
        LoadLoraAdapterRequest(lora_name="sql", lora_path="/b/sql", load_inplace=True), "smol", workers
    )
    resolved = adapters.resolve("sql", "smol")
    assert resolved is not None and resolved.path == "/b/sql"
    with pytest.raises(errors.ApiError, match="conflicts with a served base model"):
        await adapters.load(LoadLoraAdapterRequest(lora_name="smol", lora_path="/a"), "smol", workers)
    with pytest.raises(errors.ApiError, match="must be provided"):
        await adapters.load(LoadLoraAdapterRequest(lora_name="", lora_path="/a"), "smol", workers)
    adapters.unload(UnloadLoraAdapterRequest(lora_name="sql"))
    with pytest.raises(errors.ApiError) as missing:
        adapters.resolve("sql", "smol")
    assert missing.value.status == 404
    with pytest.raises(errors.ApiError, match="cannot be found") as unknown:
        adapters.unload(UnloadLoraAdapterRequest(lora_name="sql"))
    assert unknown.value.status == 404


@pytest.mark.parametrize(("value", "allowed"), [("1", True), ("True", True), ("0", False), ("", False)])
def test_runtime_updates_follow_vllms_switch(value: str, allowed: bool) -> None:
    assert runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value}) is allowed
    assert runtime_updates_allowed({}) is False
