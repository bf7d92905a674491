"""A local Cleave stack for one batch: the gateway as a child process, exactly as
`./bazel run //services/gateway -- <args>` starts it (it starts the tokenizer and workers
itself), stopped with everything it started when the batch is over."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence

import httpx

from libs.config.flags import parse
from libs.stack.launcher import Service, start_service
from services.gateway.config import GatewayConfig

PROGRESS_EVERY_S = 15.0


def gateway_config(gateway_args: Sequence[str]) -> GatewayConfig:
    """The gateway's config from its own flags; it binds any free port unless told one."""
    return parse(GatewayConfig, ["--port", "0", *gateway_args])


def wait_healthy(service: Service, timeout_s: float) -> str:
    """The gateway's base URL once /health answers (after the models have loaded)."""
    started = time.monotonic()
    last_report = started
    while True:
        code = service.running.exit_code()
        if code is not None:
            raise service.running.failure(f"exited with code {code} while starting")
        if service.port is not None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{service.address}/health", timeout=2).status_code == 200:
                    return f"http://{service.address}"
        now = time.monotonic()
        if now - started > timeout_s:
            raise service.running.failure(f"not healthy after {timeout_s:.0f}s")
        if now - last_report >= PROGRESS_EVERY_S:
            print(
                f"run_batch: local stack loading… {now - started:.0f}s (log: {service.running.log_path})",
                file=sys.stderr,
                flush=True,
            )
            last_report = now
        time.sleep(0.5)


@contextlib.contextmanager
def local_gateway(gateway_args: Sequence[str], startup_timeout_s: float) -> Iterator[str]:
    """Starts the gateway, yields its base URL when healthy, stops the whole stack after."""
    config = gateway_config(gateway_args)
    service = start_service("run-batch-gateway", "gateway", "services.gateway.main", config, config.log_dir)
    print(f"run_batch: starting a local stack (log: {service.running.log_path})", file=sys.stderr, flush=True)
    try:
        yield wait_healthy(service, startup_timeout_s)
    finally:
        service.stop(timeout_s=60)
