"""Entry point of the Cleave planner service: one per fleet, scaling the prefill and decode
Deployments (libs/planner/service.py says why it is a service of its own).

./bazel run //services/planner -- --gateways http://gateway-pods:8000/metrics --ttft-ms 500 --itl-ms 50
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import structlog

from libs.observability.logging import configure_logging
from libs.observability.metrics import start_metrics_server
from libs.planner.config import parse_args
from libs.planner.service import build, run_until_signal

log = structlog.get_logger("cleave.planner")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        configure_logging(level=config.effective_log_level, json=config.log_json, service="planner")
        planner, scraper = build(config)
    except ValueError as error:  # ConfigError, a bad profile
        print(f"cleave planner: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    port = start_metrics_server(config.port, host=config.host)
    log.info("metrics server started", port=port)
    asyncio.run(run_until_signal(planner, scraper))
    return 0


if __name__ == "__main__":
    sys.exit(main())
