"""Entry point of the Cleave kvstore service.

./bazel run //services/kvstore -- --port 7700 --redis-url redis://127.0.0.1:6379
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

import structlog

from libs.kvstore.server_config import KvStoreProcessConfig, parse_args
from libs.observability.logging import configure_logging
from libs.observability.metrics import start_metrics_server
from libs.rpc.security import RpcSecurity, load_security
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding, serve_until_signal

log = structlog.get_logger("cleave.kvstore")

# LMCache gives each module's logger the level in this variable when the module is first
# imported (INFO by default, printed on its own handlers); the default here is chosen
# before LMCache is imported, and route_lmcache_logs then sends its lines through structlog.
LMCACHE_LOG_LEVEL_ENV = "LMCACHE_LOG_LEVEL"


async def run(process: KvStoreProcessConfig, service: ServiceBinding, security: RpcSecurity) -> None:
    server_config = ServerConfig.of(process, security, replicated=True)
    await serve_until_signal(GrpcServer(server_config, [service]))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        process = parse_args(argv)
        configure_logging(level=process.effective_log_level, json=process.log_json, service="kvstore")
        security = load_security(process, os.environ)  # --grpc-*: TLS files, the token
    except ValueError as error:  # ConfigError, bad --log-level
        print(f"cleave kvstore: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    os.environ.setdefault(LMCACHE_LOG_LEVEL_ENV, "WARNING")
    # Imported only now: LMCache reads the variable above at import (and takes seconds).
    from libs.kvstore.store import KvStore
    from libs.kvstore.tiers import route_lmcache_logs
    from services.kvstore.servicer import KvStoreServicer, binding

    route_lmcache_logs(logging.WARNING)
    try:
        store = KvStore(process.store)
    except (ValueError, OSError) as error:  # e.g. a disk dir that cannot be created
        print(f"cleave kvstore: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    route_lmcache_logs(logging.WARNING)  # loggers of modules LMCache imported while starting
    try:
        if process.metrics_port is not None:
            port = start_metrics_server(process.metrics_port, host=process.host)
            log.info("metrics server started", port=port)
        asyncio.run(run(process, binding(KvStoreServicer(store)), security))
    finally:
        store.close()
        log.info("kvstore closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
