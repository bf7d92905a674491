"""vLLM's NixlConnector with a configurable NIXL progress-thread delay.

The gap this fills: NIXL's Python agent (nixl 1.5) always creates its progress thread with
`pthrDelay = 0`, so the thread busy-polls UCX and burns one full core per worker even when
no KV moves (measured: 100% of a core idle; 2-3% with a 100-1000 us delay, and a 64 MiB
loopback read still completes in ~0.1 s). On a small CPU machine prefill and decode then
starve each other and handoffs outlive their lease. vLLM exposes no knob for it, so this
module is loaded through vLLM's own `kv_connector_module_path` (the class keeps the name
`NixlConnector`, so every place vLLM checks for that name still matches) and sets the
delay just before the worker-side NIXL agent is created. Turning the progress thread off
instead is not an option: a passive prefill agent must progress to serve the decode side's
reads over UCX's TCP transport (measured: the read stalls until the peer exits).

The delay comes from `kv_connector_extra_config["nixl_progress_delay_us"]`; 0 keeps NIXL's
own behaviour.

The second gap: on CPU, vLLM's NIXL worker pins the thread that creates it to "the last core
of each NUMA node" (reserved for KV loads), whatever cores the process was given. That
thread is the engine's main thread, which is also OpenMP's master thread: with one OpenMP
thread per engine the model then runs on that core. In a 1p1d stack on two cores the prefill
engine ran on the decode worker's core (measured 2026-12-06: a 128-token prompt's prefill
stage 639 ms in 1p1d against 200 ms for the same engine alone on one core). Every thread of
a worker belongs to its device group, so the connector puts back the cores its threads had.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector as _VllmNixlConnector
from vllm.distributed.nixl_utils import NixlWrapper

PROGRESS_DELAY_KEY = "nixl_progress_delay_us"

_patch_lock = threading.Lock()


class _AgentConfigDelay:
    """Stands in for NIXL's pybind module and sets pthrDelay on each agent it creates."""

    def __init__(self, bindings: Any, delay_us: int) -> None:
        self._bindings = bindings
        self.delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # NIXL's own name
        config.pthrDelay = self.delay_us
        return self._bindings.nixlAgent(name, config)


def set_progress_delay(delay_us: int) -> None:
    """Make every NIXL agent created from now on in this process poll every `delay_us`."""
    api: Any = sys.modules[NixlWrapper.__module__]  # nixl_cu13._api (or nixl's)
    with _patch_lock:
        current = api.nixlBind
        if isinstance(current, _AgentConfigDelay):
            current.delay_us = delay_us
        else:
            api.nixlBind = _AgentConfigDelay(current, delay_us)


def _thread_ids() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/task")]


def thread_cores() -> dict[int, set[int]]:
    """Each thread of this process and the cores it may run on."""
    found = {}
    for thread_id in _thread_ids():
        try:
            found[thread_id] = os.sched_getaffinity(thread_id)
        except ProcessLookupError:
            continue  # ended meanwhile
    return found


def put_back(before: dict[int, set[int]]) -> list[int]:
    """Undo what was pinned since `before` was taken: a thread that existed then gets its cores
    back (OpenMP's threads are each bound to one core of the team's); a thread started since
    that may run outside the cores the process's threads had is confined to them. The ids of
    the threads moved."""
    cores = set().union(*before.values())
    moved = []
    for thread_id, now in thread_cores().items():
        wanted = before.get(thread_id, now if now <= cores else cores)
        if now == wanted:
            continue
        try:
            os.sched_setaffinity(thread_id, wanted)
            moved.append(thread_id)
        except (ProcessLookupError, PermissionError):
            continue  # ended meanwhile, or not ours to move
    return moved


@contextmanager
def threads_kept_on_their_cores() -> Iterator[None]:
    """Whatever the body pins, this process's threads end on the cores they had before it."""
    before = thread_cores()
    try:
        yield
    finally:
        moved = put_back(before)
        if moved:
            # Under vLLM's logger: in vLLM's engine processes only its handler is set up.
            logging.getLogger(f"vllm.{__name__}").info(
                "NIXL's worker had pinned %d thread(s) of this engine off their cores; put back"
                " (this engine's threads run on %s)",
                len(moved),
                sorted(set().union(*before.values())),
            )


class NixlConnector(_VllmNixlConnector):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        transfer = vllm_config.kv_transfer_config
        delay_us = int(transfer.get_from_extra_config(PROGRESS_DELAY_KEY, 0))
        if role == KVConnectorRole.WORKER and delay_us > 0:
            set_progress_delay(delay_us)
        with threads_kept_on_their_cores():
            super().__init__(vllm_config, role, kv_cache_config)
