import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.engine_args import engine_kwargs
from libs.worker.vllm_nixl_connector import (
    NixlConnector,
    keep_threads_on,
    set_progress_delay,
    threads_kept_on_their_cores,
)


class _FakeBindings:
    def __init__(self) -> None:
        self.created: list[tuple[str, int]] = []
        self.DRAM_SEG = 7

    def nixlAgent(self, name: str, config: Any) -> str:  # NIXL's own name
        self.created.append((name, config.pthrDelay))
        return f"agent:{name}"


def test_vllm_resolves_the_configured_module_to_cleaves_connector() -> None:
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector as VllmNixlConnector

    config = WorkerConfig(role=Role.PREFILL, model="/m", served_model_name="m")
    transfer = KVTransferConfig(**engine_kwargs(config)["kv_transfer_config"])
    connector_class = KVConnectorFactory.get_connector_class(transfer)
    assert connector_class is NixlConnector
    assert issubclass(connector_class, VllmNixlConnector)
    # vLLM's CPU platform and config code look connectors up by this name.
    assert transfer.has_connector("NixlConnector")
    assert transfer.get_from_extra_config("nixl_progress_delay_us", 0) == 1000


def test_agents_created_after_the_patch_get_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.distributed.nixl_utils import NixlWrapper

    api = sys.modules[NixlWrapper.__module__]
    fake = _FakeBindings()
    monkeypatch.setattr(api, "nixlBind", fake)

    set_progress_delay(250)
    agent = api.nixlBind.nixlAgent("a", SimpleNamespace(pthrDelay=0))
    set_progress_delay(40)  # a second call re-targets the same wrapper, never nests
    api.nixlBind.nixlAgent("b", SimpleNamespace(pthrDelay=0))

    assert agent == "agent:a"
    assert fake.created == [("a", 250), ("b", 40)]
    assert api.nixlBind.DRAM_SEG == 7  # everything else passes through


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin a thread elsewhere")
def test_threads_pinned_outside_the_engines_cores_are_moved_back() -> None:
    """What vLLM's NIXL worker does on CPU (it pins the calling thread to the last core of each
    NUMA node), undone: the calling thread and a thread it started pinned elsewhere."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    original = os.sched_getaffinity(0)
    pinned = threading.Event()
    release = threading.Event()
    seen: dict[str, set[int]] = {}

    def helper() -> None:
        pinned.set()
        release.wait(10)
        seen["helper"] = os.sched_getaffinity(0)

    os.sched_setaffinity(0, {first})
    try:
        with threads_kept_on_their_cores():
            os.sched_setaffinity(0, {second})  # as NixlConnectorWorker does
            thread = threading.Thread(target=helper)  # inherits {second}, as NIXL's threads do
            thread.start()
            pinned.wait(10)
        release.set()
        thread.join(10)
        assert os.sched_getaffinity(0) == {first}
        assert seen["helper"] == {first}
    finally:
        os.sched_setaffinity(0, original)


def test_threads_already_on_their_cores_are_left_alone() -> None:
    assert keep_threads_on(os.sched_getaffinity(0)) == []
