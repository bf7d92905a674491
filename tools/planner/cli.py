"""The planner tools' shared flags: the workload, the objectives, the profile."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from libs.config.errors import ConfigError
from libs.planner.slo import ITL_STATS, Slo
from libs.planner.workload import Lengths, RateTrace, Workload, parse_lengths

# The objectives these tools use by default: MLPerf Inference v5.0's interactive latency
# limits (TTFT 450 ms, TPOT 40 ms, introduced with Llama-2-70B), with DistServe's 90%
# attainment. Fixed before any result here was computed; every report states them.
DEFAULT_TTFT_MS = 450.0
DEFAULT_ITL_MS = 40.0
DEFAULT_PROFILE = "h100-llama3-8b"


def lengths(flag: str) -> Any:
    def parse(text: str) -> Lengths:
        try:
            return parse_lengths(flag, text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_workload(parser: argparse.ArgumentParser, *, rate: bool = True) -> None:
    if rate:
        parser.add_argument("--rate", type=float, default=10.0, help="requests/s (profile time)")
    parser.add_argument(
        "--isl",
        type=lengths("--isl"),
        default=parse_lengths("--isl", "2000:0.5"),
        help="prompt tokens: MEAN[:SPREAD][@WEIGHT],... (libs/planner/workload.py)",
    )
    parser.add_argument(
        "--osl",
        type=lengths("--osl"),
        default=parse_lengths("--osl", "200:0.5"),
        help="output tokens, same syntax",
    )


def add_objectives(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="mock profile (libs/mockengine/profiles)")
    parser.add_argument(
        "--cores", type=int, default=None, help="cores per engine (a CPU profile's coefficients)"
    )
    parser.add_argument("--ttft-ms", type=float, default=DEFAULT_TTFT_MS)
    parser.add_argument("--itl-ms", type=float, default=DEFAULT_ITL_MS)
    parser.add_argument(
        "--itl-stat",
        choices=ITL_STATS,
        default="mean",
        help="a request's ITL: its mean gap (TPOT) or its own p99 gap",
    )
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="override the profile's (vLLM's chunked-prefill budget)",
    )


def slo_of(args: argparse.Namespace) -> Slo:
    return Slo(args.ttft_ms / 1000.0, args.itl_ms / 1000.0, args.itl_stat, args.attainment)


def workload_of(args: argparse.Namespace, rate: float | None = None) -> Workload:
    return Workload(RateTrace.constant(args.rate if rate is None else rate), args.isl, args.osl)


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return (
        {} if args.max_num_batched_tokens is None else {"max_num_batched_tokens": args.max_num_batched_tokens}
    )


def conditions(args: argparse.Namespace) -> str:
    """One line saying what every number of the report is: simulated, with which profile."""
    budget = f", max_num_batched_tokens {args.max_num_batched_tokens}" if args.max_num_batched_tokens else ""
    return (
        f"SIMULATED (discrete-event simulation on the mock engine's scheduler), profile {args.profile}"
        f"{budget}; ISL {args.isl.text()}, OSL {args.osl.text()}; objectives: {slo_of(args).describe()}; seed {args.seed}"
    )


def write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, default=str))
