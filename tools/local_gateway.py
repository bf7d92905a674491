"""A local Cleave stack for a tool (run_batch, soak): the gateway as a child process, exactly
as `./bazel run //services/gateway -- <args>` starts it (it starts the tokenizer and workers
itself), stopped with everything it started when the tool is done."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import Service, start_service
from services.entry_points import ENTRY_POINTS


def gateway_config(gateway_args: Sequence[str]) -> GatewayConfig:
    """The gateway's config from its own flags; it binds any free port unless told one."""
    return parse(GatewayConfig, ["--port", "0", *gateway_args])


@contextlib.contextmanager
def local_gateway(
    tool: str, gateway_args: Sequence[str], startup_timeout_s: float
) -> Iterator[tuple[str, Service]]:
    """Starts the gateway (its log: `<log dir>/<tool>-gateway.log`); yields its base URL and
    process once it is ready; stops the whole stack afterwards."""
    config = gateway_config(gateway_args)
    service = start_service(
        f"{tool}-gateway", "gateway", ENTRY_POINTS.module(ServiceKind.GATEWAY), config, config.log_dir
    )
    print(f"{tool}: starting a local stack (log: {service.running.log_path})", file=sys.stderr, flush=True)
    try:
        yield service.wait_http_ready(startup_timeout_s, label=f"{tool}: local stack"), service
    finally:
        service.stop(timeout_s=60)
