"""Command-line flags -> BenchConfig (plus what to do with the results)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tools.bench.config import APIS, WORKLOADS, BenchConfig, Slos, WorkloadConfig

DEFAULT_NUM_REQUESTS = 100
_SLO_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}


@dataclass(frozen=True)
class CliOptions:
    config: BenchConfig  # its rate is rates[0]
    rates: tuple[float | None, ...]  # several = a sweep, one run per rate
    output: Path | None
    plots: Path | None
    progress: bool


def parse_rates(text: str) -> tuple[float, ...]:
    """'2' or '1,2,4' or 'inf' -> request rates."""
    try:
        rates = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers or 'inf', got {text!r}") from None
    if any(math.isnan(rate) or rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"rates must be > 0, got {text!r}")
    return rates


def parse_slos(items: Sequence[str]) -> Slos:
    """['ttft:500', 'tpot:50'] -> Slos(ttft_ms=500, tpot_ms=50)."""
    values: dict[str, float] = {}
    for item in items:
        key, _, number = item.partition(":")
        if key not in _SLO_KEYS:
            raise ValueError(f"goodput SLO {item!r}: expected KEY:MS with KEY one of {', '.join(_SLO_KEYS)}")
        try:
            values[_SLO_KEYS[key]] = float(number)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {number!r} is not a number of milliseconds") from None
    return Slos(**values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Load generator for OpenAI-compatible servers (Cleave's gateway, vLLM, ...).",
    )
    target = parser.add_argument_group("target")
    target.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    target.add_argument("--model", required=True, help="model name to send (as in /v1/models)")
    target.add_argument("--api", choices=APIS, default="completions")
    target.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default: $OPENAI_API_KEY)"
    )
    target.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="seconds to wait for a connection or for the next chunk",
    )

    load = parser.add_argument_group("workload (lengths in tokens, ~1 word each)")
    load.add_argument("--workload", choices=WORKLOADS, default="random")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--input-len", type=int, default=256, help="prompt / user message length")
    load.add_argument("--output-len", type=int, default=128, help="requested output length (max_tokens)")
    load.add_argument(
        "--len-spread", type=float, default=0.0, help="lengths vary uniformly by ± this fraction"
    )
    load.add_argument("--num-prefixes", type=int, default=4, help="prefix: shared prefixes")
    load.add_argument("--prefix-len", type=int, default=512, help="prefix: length of each shared prefix")
    load.add_argument(
        "--suffixes-per-prefix", type=int, default=8, help="prefix: requests per prefix and round"
    )
    load.add_argument("--suffix-len", type=int, default=64, help="prefix: length of each suffix")
    load.add_argument("--turns", type=int, default=4, help="multiturn: turns per session")
    load.add_argument(
        "--long-fraction", type=float, default=0.1, help="long-interference: share of long prompts"
    )
    load.add_argument(
        "--long-input-len", type=int, default=2000, help="long-interference: long prompt length"
    )
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--min-tokens", action="store_true", help="also send min_tokens = max_tokens (vLLM)")
    load.add_argument("--ignore-eos", action="store_true", help="also send ignore_eos (vLLM, Cleave)")

    arrival = parser.add_argument_group("arrival (default: closed loop, concurrency 1)")
    arrival.add_argument(
        "--rate",
        type=parse_rates,
        default=None,
        help="requests/s (multiturn: sessions/s), Poisson; a list (1,2,4) runs a sweep; inf = all at once",
    )
    arrival.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps (1 = Poisson)")
    arrival.add_argument(
        "--concurrency", type=int, default=None, help="requests in flight (with --rate: a cap on them)"
    )
    arrival.add_argument(
        "--num-requests", type=int, default=None, help=f"requests per run (default {DEFAULT_NUM_REQUESTS})"
    )
    arrival.add_argument("--duration-s", type=float, default=None, help="stop starting requests after this")
    arrival.add_argument("--warmup-requests", type=int, default=0, help="sent first, not measured")

    out = parser.add_argument_group("results")
    out.add_argument(
        "--goodput", nargs="+", default=[], metavar="KEY:MS", help="SLOs for goodput: ttft:MS tpot:MS e2e:MS"
    )
    out.add_argument("--output", type=Path, default=None, help="write config, records and summaries as JSON")
    out.add_argument("--plots", type=Path, default=None, help="write PNG plots into this folder")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def parse_args(argv: Sequence[str]) -> CliOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    rates: tuple[float | None, ...] = args.rate if args.rate is not None else (None,)
    num_requests = args.num_requests
    if num_requests is None and args.duration_s is None:
        num_requests = DEFAULT_NUM_REQUESTS
    concurrency = args.concurrency
    if concurrency is None and args.rate is None:
        concurrency = 1
    try:
        workload = WorkloadConfig(
            name=args.workload,
            input_len=args.input_len,
            output_len=args.output_len,
            len_spread=args.len_spread,
            num_prefixes=args.num_prefixes,
            prefix_len=args.prefix_len,
            suffixes_per_prefix=args.suffixes_per_prefix,
            suffix_len=args.suffix_len,
            turns=args.turns,
            long_fraction=args.long_fraction,
            long_input_len=args.long_input_len,
        )
        config = BenchConfig(
            url=args.url,
            model=args.model,
            api=args.api,
            workload=workload,
            seed=args.seed,
            rate=rates[0],
            burstiness=args.burstiness,
            concurrency=concurrency,
            num_requests=num_requests,
            duration_s=args.duration_s,
            warmup_requests=args.warmup_requests,
            temperature=args.temperature,
            min_tokens=args.min_tokens,
            ignore_eos=args.ignore_eos,
            timeout_s=args.timeout_s,
            goodput=parse_slos(args.goodput),
            api_key=args.api_key,
        )
        for rate in rates[1:]:
            replace(config, rate=rate)  # validates every run of a sweep up front
    except ValueError as exc:
        parser.error(str(exc))
    return CliOptions(config, rates, args.output, args.plots, progress=not args.no_progress)
