"""Soak test of a Cleave stack: concurrent clients (chat and completions, streamed and not,
random max_tokens, clients that abort mid-stream or disconnect before the answer) for a
while, the memory of every process of the stack sampled all along; then a valid request and
the workers' health are checked.

  # a local stack started for the soak; flags after `--` go to the gateway
  ./bazel run //tools/soak -- --duration-min 10 --concurrency 8 -- --mode pd
  # a running gateway (its process tree is sampled if it listens on this machine)
  ./bazel run //tools/soak -- --url http://127.0.0.1:8000 --duration-min 60

Exits 1 if any request hung (no byte from the server for --stall-s) or a check afterwards
failed; errors (by HTTP status) are reported, not fatal: limits may refuse on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from tools.cli_args import split_gateway_args, user_path
from tools.soak.memory import TreeSampler, listening_pid
from tools.soak.report import as_json, as_text
from tools.soak.runner import SoakOptions, soak
from tools.soak.workload import Mix


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running gateway (default: start a local stack)")
    parser.add_argument("--duration-min", type=float, default=10.0, help="how long clients send requests")
    parser.add_argument("--concurrency", type=int, default=8, help="clients, each one request at a time")
    parser.add_argument(
        "--stall-s", type=float, default=120.0, help="no byte from the server for this long: the request hung"
    )
    parser.add_argument("--sample-s", type=float, default=5.0, help="how often RSS is sampled")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=60.0,
        help="RSS samples before this are left out of the second slope",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=48, help="each request's max_tokens is 1..this")
    parser.add_argument("--nonstream", type=float, default=0.2, help="fraction of requests not streamed")
    parser.add_argument("--abort", type=float, default=0.25, help="fraction aborted mid-stream")
    parser.add_argument(
        "--disconnect", type=float, default=0.1, help="fraction disconnected before the answer"
    )
    parser.add_argument("--api-key", help="for a gateway started with --api-key (default: $CLEAVE_API_KEY)")
    parser.add_argument("--pid", type=int, action="append", default=[], help="also sample this process tree")
    parser.add_argument("--output", type=Path, help="write the summary as JSON here")
    parser.add_argument("--startup-timeout-s", type=float, default=1800.0)
    return parser


def run(args: argparse.Namespace, url: str, roots: list[int]) -> int:
    mix = Mix(
        nonstream=args.nonstream,
        abort_mid_stream=args.abort,
        disconnect_early=args.disconnect,
        max_tokens=args.max_tokens,
    )
    options = SoakOptions(
        base_url=url.rstrip("/").removesuffix("/v1"),
        duration_s=args.duration_min * 60,
        concurrency=args.concurrency,
        stall_s=args.stall_s,
        sample_s=args.sample_s,
        seed=args.seed,
        mix=mix,
        api_key=args.api_key or os.environ.get("CLEAVE_API_KEY"),
    )
    sampler = TreeSampler(roots) if roots else None
    if sampler is None:
        print(
            "soak: no process to sample (the gateway is not on this machine?); RSS not reported",
            file=sys.stderr,
        )
    result = asyncio.run(soak(options, sampler))
    summary = as_json(result, sampler, args.warmup_s)
    print(as_text(summary))
    if args.output:
        user_path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    if result.hung or result.failed_checks:
        print(
            f"soak: FAILED: {result.hung} hung; {'; '.join(result.failed_checks) or 'checks ok'}",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    own, gateway_args = split_gateway_args(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.url and gateway_args:
        parser.error("gateway flags start a local stack; they cannot go with --url")
    if args.concurrency < 1 or args.duration_min <= 0:
        parser.error("--concurrency and --duration-min must be positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind: stop a local stack
    try:
        if args.url:
            port = urlparse(args.url).port
            pid = listening_pid(port) if port else None
            return run(args, args.url, [*([pid] if pid else []), *args.pid])
        from tools.local_gateway import local_gateway  # only a local stack needs Cleave's code

        with local_gateway("soak", gateway_args, args.startup_timeout_s) as (url, gateway):
            return run(args, url, [gateway.running.pid, *args.pid])
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
