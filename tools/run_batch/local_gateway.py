"""A local Cleave stack for one batch: the gateway as a child process, exactly as
`./bazel run //services/gateway -- <args>` starts it (it starts the tokenizer and workers
itself), stopped with everything it started when the batch is over."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

from libs.config.flags import parse
from libs.stack.launcher import start_service
from services.gateway.config import GatewayConfig


def gateway_config(gateway_args: Sequence[str]) -> GatewayConfig:
    """The gateway's config from its own flags; it binds any free port unless told one."""
    return parse(GatewayConfig, ["--port", "0", *gateway_args])


@contextlib.contextmanager
def local_gateway(gateway_args: Sequence[str], startup_timeout_s: float) -> Iterator[str]:
    """Starts the gateway, yields its base URL when healthy, stops the whole stack after."""
    config = gateway_config(gateway_args)
    service = start_service("run-batch-gateway", "gateway", "services.gateway.main", config, config.log_dir)
    print(f"run_batch: starting a local stack (log: {service.running.log_path})", file=sys.stderr, flush=True)
    try:
        yield service.wait_http_ready(startup_timeout_s, label="run_batch: local stack")
    finally:
        service.stop(timeout_s=60)
