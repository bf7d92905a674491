"""LoRA adapters at the gateway: vLLM's --lora-modules spellings, a request's `model`
resolved, /v1/models' cards and the run-time load and unload checks."""

from __future__ import annotations

import pytest

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


def test_load_and_unload_follow_vllms_checks() -> None:
    adapters = Adapters(runtime_updates=True)
    message = adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/a/sql"), "smol")
    assert message == "Success: LoRA adapter 'sql' added successfully."
    assert adapters.resolve("sql", "smol") is not None
    with pytest.raises(errors.ApiError, match="already been loaded") as again:
        adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/b/sql"), "smol")
    assert again.value.status == 400
    adapters.load(LoadLoraAdapterRequest(lora_name="sql", lora_path="/b/sql", load_inplace=True), "smol")
    resolved = adapters.resolve("sql", "smol")
    assert resolved is not None and resolved.path == "/b/sql"
    with pytest.raises(errors.ApiError, match="conflicts with a served base model"):
        adapters.load(LoadLoraAdapterRequest(lora_name="smol", lora_path="/a"), "smol")
    with pytest.raises(errors.ApiError, match="must be provided"):
        adapters.load(LoadLoraAdapterRequest(lora_name="", lora_path="/a"), "smol")
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
