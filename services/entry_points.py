"""The services' entry points, for whoever starts them as child processes (the gateway's local
stack, tools, tests): the one place that names `services.*.main`. It imports no service code,
so a tool may take it without depending on any service's internals: it is the one module of
services/ that tools may import (ruff's banned-api, pyproject.toml)."""

from __future__ import annotations

from libs.stack.entry_points import EntryPoints, ServiceKind

ENTRY_POINTS = EntryPoints(
    {
        ServiceKind.GATEWAY: "services.gateway.main",
        ServiceKind.TOKENIZER: "services.tokenizer.main",
        ServiceKind.ENCODER: "services.encoder.main",
        ServiceKind.WORKER: "services.worker.main",
        ServiceKind.KVSTORE: "services.kvstore.main",
    }
)
