"""Offline batch inference through Cleave: an OpenAI batch file (the JSONL vLLM's run-batch
reads; /v1/chat/completions and /v1/completions lines) in, the output JSONL out.

  # against a running gateway
  ./bazel run //tools/run_batch -- -i batch.jsonl -o results.jsonl --url http://127.0.0.1:8000
  # on a local stack started for the batch; flags after a second `--` go to the gateway
  ./bazel run //tools/run_batch -- -i batch.jsonl -o results.jsonl -- --mode pd

Output lines are appended as requests finish (completion order, not input order; match them
by custom_id). Run the same command again after a crash or Ctrl-C: custom_ids already in the
output are skipped, a torn last line is cut off and its request redone. A line that cannot
be run (bad JSON, unsupported url, streaming, repeated custom_id, an HTTP error) gets an error
line; the batch goes on. If the server becomes unreachable the run stops and exits 1, with
the remaining lines left for the next run.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.cli_args import split_gateway_args, user_path
from tools.run_batch.runner import RunOptions, Summary, run_batch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_batch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-i", "--input-file", type=Path, required=True, help="the batch file (JSONL)")
    parser.add_argument("-o", "--output-file", type=Path, required=True, help="results, appended to (resume)")
    parser.add_argument(
        "--url",
        default=None,
        help="a running gateway, e.g. http://127.0.0.1:8000 (default: start a local stack)",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request; then an error line")
    parser.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag for the local gateway (repeatable; or put them after `--`)",
    )
    parser.add_argument(
        "--startup-timeout-s", type=float, default=1800.0, help="how long the local stack may take to load"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def report(summary: Summary, output: Path) -> str:
    parts = [f"{summary.succeeded} ok", f"{summary.errors} error lines"]
    if summary.skipped:
        parts.append(f"{summary.skipped} already in the output")
    if summary.truncated_bytes:
        parts.append(f"a torn last line ({summary.truncated_bytes} bytes) cut off and redone")
    text = f"run_batch: {summary.total} lines: {', '.join(parts)}; output: {output}"
    if summary.not_done:
        text += (
            f"\nrun_batch: stopped, {summary.not_done} lines not done ({summary.stopped_because}); "
            "run the same command again to finish them"
        )
    return text


async def _run(args: argparse.Namespace, url: str) -> Summary:
    options = RunOptions(
        base_url=url.rstrip("/").removesuffix("/v1"),
        concurrency=args.concurrency,
        timeout_s=args.timeout_s,
        progress=not args.no_progress,
    )
    return await run_batch(args.input_file, args.output_file, options)


def main(argv: Sequence[str] | None = None) -> int:
    own, after_dashes = split_gateway_args(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    args.input_file, args.output_file = user_path(args.input_file), user_path(args.output_file)
    gateway_args = [*args.gateway_arg, *after_dashes]
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.url and gateway_args:
        parser.error("gateway flags start a local stack; they cannot go with --url")
    if not args.input_file.is_file():
        parser.error(f"no input file {args.input_file}")
    # SIGTERM unwinds like Ctrl-C, so a local stack is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if args.url:
            summary = asyncio.run(_run(args, args.url))
        else:
            # Imported here: only a local stack needs the gateway's code.
            from libs.config.errors import ConfigError
            from libs.stack.process import LaunchError
            from tools.local_gateway import local_gateway

            try:
                with local_gateway("run-batch", gateway_args, args.startup_timeout_s) as (url, _gateway):
                    summary = asyncio.run(_run(args, url))
            except (ConfigError, LaunchError) as error:
                print(f"run_batch: local stack: {error}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        print("run_batch: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(report(summary, args.output_file), file=sys.stderr)
    return 1 if summary.not_done else 0


if __name__ == "__main__":
    sys.exit(main())
