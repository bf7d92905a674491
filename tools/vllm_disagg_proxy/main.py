"""vLLM's disaggregated prefill/decode behind one OpenAI-compatible endpoint.

./bazel run //tools/vllm_disagg_proxy -- --port 8100 \
    --prefill http://127.0.0.1:8101 --decode http://127.0.0.1:8102

Each /v1/completions or /v1/chat/completions request is prefilled (one token, KV kept) on a
prefill server, then sent as is to a decode server with the prefill's kv_transfer_params; the
decode server's answer (stream or not) is relayed. Several --prefill / --decode servers are
used round-robin. The servers are plain `vllm serve` processes with NixlConnector
(kv_producer / kv_consumer); /health is 200 once all of them are healthy, /metrics has the
proxy's prefill latency.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from tools.vllm_disagg_proxy.app import ProxyConfig, create_app


def _urls(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(u.strip() for value in values for u in value.split(",") if u.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm_disagg_proxy", description="OpenAI-compatible proxy over vLLM prefill/decode servers."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--prefill", action="append", required=True, help="prefill server URL (repeat or comma-separate)"
    )
    parser.add_argument(
        "--decode", action="append", required=True, help="decode server URL (repeat or comma-separate)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per upstream request")
    parser.add_argument("--log-level", default="warning")
    return parser


def parse_args(argv: Sequence[str]) -> tuple[ProxyConfig, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = ProxyConfig(_urls(args.prefill), _urls(args.decode), args.timeout_s)
    except ValueError as exc:
        parser.error(str(exc))
    return config, args


def main(argv: Sequence[str]) -> int:
    config, args = parse_args(argv)
    print(
        f"vllm_disagg_proxy: http://{args.host}:{args.port} -> prefill {', '.join(config.prefill_urls)};"
        f" decode {', '.join(config.decode_urls)}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
