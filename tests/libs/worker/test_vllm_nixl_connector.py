import contextlib
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
    put_back,
    set_progress_delay,
    thread_cores,
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


TWO_CORES = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin threads apart"
)


@TWO_CORES
def test_the_pinned_thread_gets_its_core_back_and_an_openmp_team_keeps_its_cores() -> None:
    """What vLLM's NIXL worker does on CPU (it pins the calling thread to the last core of each
    NUMA node), undone: the calling thread (OpenMP's master) gets its own core back, and a
    thread bound to the team's other core keeps it (confining every thread to the caller's
    cores would put a two-core team on one core)."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    original = os.sched_getaffinity(0)
    bound, release = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def team_thread() -> None:
        os.sched_setaffinity(0, {second})
        bound.set()
        release.wait(10)
        seen["team"] = os.sched_getaffinity(0)

    os.sched_setaffinity(0, {first})
    team = threading.Thread(target=team_thread)
    team.start()
    bound.wait(10)
    try:
        with threads_kept_on_their_cores():
            os.sched_setaffinity(0, {second})  # as NixlConnectorWorker does
        release.set()
        team.join(10)
        assert os.sched_getaffinity(0) == {first}
        assert seen["team"] == {second}
    finally:
        release.set()
        os.sched_setaffinity(0, original)


@TWO_CORES
def test_a_thread_started_meanwhile_is_confined_to_the_cores_the_threads_had() -> None:
    """NIXL's own threads start inside the connector and inherit its pin."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    original = thread_cores()
    started, release = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def nixl_thread() -> None:
        os.sched_setaffinity(0, {second})
        started.set()
        release.wait(10)
        seen["nixl"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=nixl_thread)
    thread.start()
    started.wait(10)
    try:
        # Every thread there before had {first} (the engine's device group).
        moved = put_back({thread_id: {first} for thread_id in original})
        release.set()
        thread.join(10)
        assert seen["nixl"] == {first}
        assert thread.native_id in moved
    finally:
        release.set()
        for thread_id, cores in original.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(thread_id, cores)


def test_threads_nobody_pinned_are_left_alone() -> None:
    assert put_back(thread_cores()) == []
