"""Starts and stops a local stack N times in a row through the gateway, as a user would, and
reports how many starts became healthy, how long each took, and whether any process of the
stack outlived its stop.

./bazel run //tools/bench:stack_cycles -- --cycles 20 --mode 1p1d
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import start_service
from libs.stack.process import LaunchError
from services.entry_points import ENTRY_POINTS


def one_cycle(index: int, args: argparse.Namespace, log_dir: Path) -> tuple[float, int]:
    """Seconds to healthy, and how many processes of the stack outlived the stop."""
    flags = ["--mode", args.mode, "--port", "0", "--model", args.model, "--cache-dir", str(log_dir / "cache")]
    config = parse(GatewayConfig, flags)
    started = time.monotonic()
    service = start_service(
        f"gateway-{index}", "gateway", ENTRY_POINTS.module(ServiceKind.GATEWAY), config, log_dir
    )
    try:
        base_url = service.wait_http_ready(args.timeout_s)
        ready_s = time.monotonic() - started
        served = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        reply = httpx.post(
            f"{base_url}/v1/completions",
            json={"model": served, "prompt": "Hello", "max_tokens": 4},
            timeout=120,
        )
        reply.raise_for_status()
    finally:
        tree = service.running.descendants()
        service.stop(timeout_s=60)
    _gone, alive = psutil.wait_procs(tree, timeout=10)
    return ready_s, len(alive)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--mode", default="1p1d")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="cleave-stack-cycles-"))
    healthy, times, leftovers = 0, [], 0
    for index in range(args.cycles):
        try:
            ready_s, left = one_cycle(index, args, log_dir)
        except (LaunchError, httpx.HTTPError) as error:
            print(f"cycle {index + 1}: FAILED: {error}", flush=True)
            continue
        healthy += 1
        times.append(ready_s)
        leftovers += left
        print(
            f"cycle {index + 1}: healthy after {ready_s:.1f} s, answered, {left} processes left", flush=True
        )
    if times:
        print(
            f"{healthy} healthy starts of {args.cycles} ({args.mode}); start time median {statistics.median(times):.1f} s, "
            f"min {min(times):.1f}, max {max(times):.1f}; processes left after stops: {leftovers}; logs in {log_dir}"
        )
    return 0 if healthy == args.cycles and leftovers == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
