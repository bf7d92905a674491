"""Speculative decoding on a local 1p1d stack: decode tok/s on repetitive text without
speculation, with n-gram and with a draft model, one stack at a time, one request at a time
(the single-stream case speculation is for). Prints tok/s, the ratio to the plain stack and
the decode worker's acceptance rate and mean accepted length (from the gateway's /metrics).
Requests stream, so tok/s is given twice: end to end (prompt to last token, what a client
waits) and decode only (after each first token: the part speculation changes; the 1p1d
prefill and KV handoff before the first token are the same with and without it).

./bazel run //tools/bench:speculative -- --max-tokens 256 --draft-model smollm2
./bazel run //tools/bench:speculative -- --ngram-tokens 8,12 --draft-model '' --rounds 3
./bazel run //tools/bench:speculative -- --ngram-tokens 5,8,12 --draft-model '' \
    --stack-flags '--prefill-device-group 0-3 --decode-device-group 4-15'
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import Service, start_service
from services.entry_points import ENTRY_POINTS
from tools.bench.systems.rounds import spread

# Text whose continuation repeats what the prompt already holds: the n-gram drafter's case.
PROMPTS = [
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday " * 4,
    "The cat sat on the mat. The dog sat on the log. " * 6,
    "for i in range(10):\n    print(i)\n" * 6,
    "red green blue, red green blue, red green blue, red green blue, red green blue, ",
    '{"id": 1, "name": "alpha", "ok": true}\n{"id": 2, "name": "beta", "ok": true}\n' * 3,
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z " * 3,
]
SPEC_PREFIX = "cleave_gateway_worker_spec_decode_"


@dataclass(frozen=True)
class Result:
    name: str
    tokens: int
    seconds: float
    first_token_seconds: float  # summed over the requests: prompt to first token
    requests: int
    spec: dict[str, float]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first of each request, over the time after each first token."""
        return (self.tokens - self.requests) / (self.seconds - self.first_token_seconds)


def spec_counters(base_url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name.startswith(SPEC_PREFIX) and sample.labels.get("role") == "decode":
                name = sample.name.removeprefix(SPEC_PREFIX).removesuffix("_total")
                values[name] = values.get(name, 0) + sample.value
    return values


def run_system(name: str, extra: list[str], args: argparse.Namespace, log_dir: Path) -> Result:
    flags = [
        "--mode",
        "1p1d",
        "--port",
        "0",
        "--model",
        args.model,
        "--cache-dir",
        str(log_dir / "cache"),
        *shlex.split(args.stack_flags),
        *extra,
    ]
    service: Service = start_service(
        f"gateway-{name}",
        "gateway",
        ENTRY_POINTS.module(ServiceKind.GATEWAY),
        parse(GatewayConfig, flags),
        log_dir,
    )
    try:
        base_url = service.wait_http_ready(args.timeout_s)
        served = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]

        def complete(prompt: str, max_tokens: int) -> tuple[int, float]:
            """(completion tokens, seconds to the first token)."""
            body = {
                "model": served,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started = time.perf_counter()
            first: float | None = None
            tokens = 0
            with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=600) as reply:
                reply.raise_for_status()
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                        first = time.perf_counter() - started
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"]["completion_tokens"])
            return tokens, first if first is not None else time.perf_counter() - started

        complete("Hello", 8)  # warm-up: first-request costs are not decode speed
        time.sleep(2)  # the gateway polls worker stats each second
        before = spec_counters(base_url)
        started = time.perf_counter()
        replies = [complete(prompt, args.max_tokens) for prompt in PROMPTS]
        seconds = time.perf_counter() - started
        tokens = sum(n for n, _ in replies)
        first_token_seconds = sum(t for _, t in replies)
        time.sleep(2)
        after = spec_counters(base_url)
    finally:
        service.stop(timeout_s=60)
    drafts = after.get("drafts", 0) - before.get("drafts", 0)
    drafted = after.get("draft_tokens", 0) - before.get("draft_tokens", 0)
    accepted = after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0)
    spec = {
        "drafts": drafts,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": 1 + accepted / drafts if drafts else 0.0,
    }
    return Result(name, tokens, seconds, first_token_seconds, len(PROMPTS), spec)


def _median_spread(values: Sequence[float]) -> str:
    summary = spread(values)  # compare's median, min and max over rounds
    if summary is None:
        return "-"
    return f"{summary.median:.2f}x [{summary.low:.2f}-{summary.high:.2f}]"


def rounds_summary(rounds: Sequence[Sequence[Result]]) -> list[str]:
    """Each system's speed-up over the same round's plain stack (the first result of every
    round), as median [min-max] over the rounds: the ratio is taken within a round, where the
    machine's state is shared, then summarised."""
    lines = [f"{'system':<14} {'rounds':>6} {'tok/s vs plain':>24} {'decode tok/s vs plain':>24}"]
    for position, first in enumerate(rounds[0]):
        ratios = [r[position].tok_s / r[0].tok_s for r in rounds]
        decode = [r[position].decode_tok_s / r[0].decode_tok_s for r in rounds]
        lines.append(
            f"{first.name:<14} {len(rounds):>6} {_median_spread(ratios):>24} {_median_spread(decode):>24}"
        )
    return lines


def _token_counts(text: str) -> tuple[int, ...]:
    """'5' or '5,8,12' -> num_speculative_tokens values, each >= 1."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers like 5,8,12, got {text!r}") from None
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"each count must be >= 1, got {text!r}")
    return counts


def print_round(results: Sequence[Result], args: argparse.Namespace, number: int) -> None:
    plain = results[0]
    print(
        f"\nround {number}: {len(PROMPTS)} repetitive prompts x {args.max_tokens} tokens, one at a time, "
        f"1p1d, {args.model}" + (f", stack flags {args.stack_flags!r}" if args.stack_flags else "")
    )
    print(
        f"{'system':<14} {'tok/s':>8} {'vs plain':>9} {'decode tok/s':>13} {'vs plain':>9} "
        f"{'TTFT mean s':>12} {'acceptance':>11} {'mean accepted length':>21}"
    )
    for r in results:
        rate = f"{r.spec['acceptance_rate']:.2f}" if r.spec["drafts"] else "-"
        length = f"{r.spec['mean_accepted_length']:.2f}" if r.spec["drafts"] else "-"
        print(
            f"{r.name:<14} {r.tok_s:>8.1f} {r.tok_s / plain.tok_s:>8.2f}x {r.decode_tok_s:>13.1f} "
            f"{r.decode_tok_s / plain.decode_tok_s:>8.2f}x {r.first_token_seconds / r.requests:>12.3f} "
            f"{rate:>11} {length:>21}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--ngram-tokens",
        type=_token_counts,
        default=(5,),
        help="num_speculative_tokens for n-gram; a comma-separated list runs one stack per value",
    )
    parser.add_argument("--draft-model", default="smollm2", help="draft model; '' skips the draft-model run")
    parser.add_argument("--draft-tokens", type=int, default=3, help="num_speculative_tokens for the draft")
    parser.add_argument(
        "--stack-flags",
        default="",
        help="gateway flags for every stack, e.g. '--prefill-device-group 0-3 --decode-device-group 4-15' "
        "(default: none; 1p1d splits the cores in halves)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every system this many times, in turn; ratios as median [min-max]",
    )
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    log_dir = Path(tempfile.mkdtemp(prefix="cleave-bench-speculative-"))
    systems: list[tuple[str, list[str]]] = [("plain", [])]
    for tokens in args.ngram_tokens:
        systems.append((f"ngram-{tokens}", ["--decode-speculative-config",
                        f'{{"method": "ngram", "num_speculative_tokens": {tokens}}}']))  # fmt: skip
    if args.draft_model:
        systems.append(("draft-model", ["--decode-speculative-config",
                        f'{{"speculative_model": "{args.draft_model}", "num_speculative_tokens": {args.draft_tokens}}}']))  # fmt: skip
    rounds: list[list[Result]] = []
    for number in range(1, args.rounds + 1):
        results = []
        for name, extra in systems:
            result = run_system(name, extra, args, log_dir)
            results.append(result)
            print(
                f"round {number}, {name}: {result.tokens} tokens in {result.seconds:.1f} s = "
                f"{result.tok_s:.1f} tok/s (first tokens {result.first_token_seconds:.2f} s in all; "
                f"decode {result.decode_tok_s:.1f} tok/s)",
                flush=True,
            )
        rounds.append(results)
        print_round(results, args, number)
    if args.rounds > 1:
        print(f"\nover {args.rounds} rounds (each ratio within its round):")
        print("\n".join(rounds_summary(rounds)))
    print(f"logs in {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
