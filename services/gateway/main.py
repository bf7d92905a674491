"""Entry point of the Cleave gateway (libs/gateway/server.py puts it together).

./bazel run //services/gateway                  # local 1p1d stack with SmolLM2, then serve
./bazel run //services/gateway -- --mode pd     # colocated
./bazel run //services/gateway -- --tokenizer H:P --prefill-workers H:P --decode-workers H:P
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

import uvloop

from libs.config.errors import ConfigError
from libs.gateway.config import parse_args
from libs.gateway.server import serve
from libs.models.errors import ModelNotFoundError
from libs.observability.logging import configure_logging
from libs.rpc.security import load_security
from libs.stack.process import LaunchError
from services.entry_points import ENTRY_POINTS


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        edge = config.http_edge()  # reads the API key file and environment
        security = load_security(config, os.environ)  # --grpc-*: TLS files, the token
    except ConfigError as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 2
    configure_logging(level=config.effective_log_level, json=config.log_json, service="gateway")
    # SIGTERM stops the gateway the way Ctrl-C does (KeyboardInterrupt), so the local stack's
    # children are stopped on the way out. Python's default SIGTERM action kills the process
    # on the spot, and uvicorn re-raises the SIGTERM it caught once it has shut down, which
    # orphaned every worker and its vLLM engine.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # uvloop: its C transports cut the gateway's CPU per token by 16-20% once the token
        # path itself was lean (docs/benchmarks.md, "The gateway's token path", 2026-12-05).
        uvloop.run(serve(config, edge, security, ENTRY_POINTS))
    except (ModelNotFoundError, LaunchError, TimeoutError, RuntimeError) as error:
        print(f"cleave gateway: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
