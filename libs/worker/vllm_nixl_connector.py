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
"""

from __future__ import annotations

import sys
import threading
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


class NixlConnector(_VllmNixlConnector):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        transfer = vllm_config.kv_transfer_config
        delay_us = int(transfer.get_from_extra_config(PROGRESS_DELAY_KEY, 0))
        if role == KVConnectorRole.WORKER and delay_us > 0:
            set_progress_delay(delay_us)
        super().__init__(vllm_config, role, kv_cache_config)
