"""Which program runs each kind of Cleave service when a local stack starts it.

libs/ never names a service's entry point (it never imports services/, by module name
included): the services layer owns the registry (services/entry_points.py) and whoever starts
services hands it in (the gateway's local stack: local.launch). An entry point is a Python
module run as `python -m MODULE` with the starting process's import path (process.py), so
the same code serves under `bazel run` and from a checkout.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from libs.stack.process import LaunchError


class ServiceKind(enum.Enum):
    GATEWAY = "gateway"
    TOKENIZER = "tokenizer"
    ENCODER = "encoder"
    WORKER = "worker"
    KVSTORE = "kvstore"


@dataclass(frozen=True)
class EntryPoints:
    """Each kind of service's entry point module."""

    modules: Mapping[ServiceKind, str]

    def module(self, kind: ServiceKind) -> str:
        try:
            return self.modules[kind]
        except KeyError:
            raise LaunchError(f"no entry point registered for the {kind.value} service") from None
