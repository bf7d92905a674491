"""Does a maximum-size prompt slow down other clients' streams? Measures the inter-token
latency (ITL) of a greedy stream alone and while other clients keep sending prompts of the
gateway's maximum size (`--max-prompt-chars`; by default 32 characters per token of context,
so such a prompt tokenizes to more than the context and is refused with a 400 only after the
tokenizer has done its work). Rounds are interleaved, the order alternating, and the report
gives each round's ratio and their median and spread (issue 16's check: within +20%).

./bazel run //tools/bench:prompt_interference -- --rounds 6
./bazel run //tools/bench:prompt_interference -- --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from libs.config.flags import parse
from libs.gateway.api.request_limits import CHARS_PER_CONTEXT_TOKEN
from libs.gateway.config import GatewayConfig
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import Service, start_service
from services.entry_points import ENTRY_POINTS

WORDS = "the quick brown fox jumps over the lazy dog and keeps running across the field "


@dataclass(frozen=True)
class StreamTiming:
    itl_mean_ms: float  # from the first token event to the last, per gap: what a reader waits
    itl_p50_ms: float
    itl_max_ms: float  # the longest stall
    tokens: int


@dataclass(frozen=True)
class Interference:
    sent: int
    statuses: dict[int, int]
    median_latency_s: float


async def timed_stream(http: httpx.AsyncClient, model: str, max_tokens: int) -> StreamTiming:
    body = {
        "model": model,
        "prompt": "Write a long story about a lighthouse keeper.",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[float] = []
    async with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
    if len(gaps) < 2:
        raise RuntimeError(f"the stream produced {len(arrivals)} events")
    # The mean, not the median: a stalled stream delivers its tokens in bursts afterwards,
    # whose near-zero gaps would make the median look better than an undisturbed stream.
    return StreamTiming(statistics.fmean(gaps), statistics.median(gaps), max(gaps), len(arrivals))


async def huge_prompts(
    http: httpx.AsyncClient, model: str, prompt: str, stop: asyncio.Event, clients: int
) -> Interference:
    statuses: dict[int, int] = {}
    latencies: list[float] = []

    async def client() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            response = await http.post(
                "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1}
            )
            latencies.append(time.perf_counter() - started)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return Interference(len(latencies), statuses, statistics.median(latencies) if latencies else 0.0)


async def loaded_stream(
    http: httpx.AsyncClient, model: str, max_tokens: int, prompt: str, clients: int
) -> tuple[StreamTiming, Interference]:
    stop = asyncio.Event()
    load = asyncio.create_task(huge_prompts(http, model, prompt, stop, clients))
    await asyncio.sleep(0.5)  # the first huge prompts are being tokenized when the stream starts
    try:
        timing = await timed_stream(http, model, max_tokens)
    finally:
        stop.set()
    return timing, await load


async def measure(base_url: str, args: argparse.Namespace) -> int:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        card = (await http.get("/v1/models")).json()["data"][0]
        model, context = card["id"], int(card["max_model_len"])
        chars = args.prompt_chars or CHARS_PER_CONTEXT_TOKEN * context
        prompt = (WORDS * (chars // len(WORDS) + 1))[:chars]
        print(
            f"{model}: context {context} tokens; huge prompts of {chars} characters, {args.clients} clients"
        )
        await timed_stream(http, model, 8)  # warm-up
        ratios: list[float] = []
        for round_index in range(args.rounds):
            order = ("alone", "loaded") if round_index % 2 == 0 else ("loaded", "alone")
            results: dict[str, StreamTiming] = {}
            for kind in order:
                if kind == "alone":
                    results[kind] = await timed_stream(http, model, args.max_tokens)
                else:
                    results[kind], load = await loaded_stream(
                        http, model, args.max_tokens, prompt, args.clients
                    )
            alone, loaded = results["alone"], results["loaded"]
            ratio = loaded.itl_mean_ms / alone.itl_mean_ms
            ratios.append(ratio)
            print(
                f"round {round_index + 1}: ITL mean alone {alone.itl_mean_ms:.1f} ms (p50 {alone.itl_p50_ms:.1f}, "
                f"max {alone.itl_max_ms:.0f}), with huge prompts {loaded.itl_mean_ms:.1f} ms "
                f"(p50 {loaded.itl_p50_ms:.1f}, max {loaded.itl_max_ms:.0f}); ratio {ratio:.2f}; "
                f"huge prompts sent {load.sent}, statuses {load.statuses}, median answer {load.median_latency_s:.2f} s",
                flush=True,
            )
        print(
            f"ITL mean ratio (with / without huge prompts) over {len(ratios)} rounds: median "
            f"{statistics.median(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}"
        )
    return 0


def start_stack(args: argparse.Namespace) -> Service:
    log_dir = Path(tempfile.mkdtemp(prefix="cleave-prompt-interference-"))
    flags = ["--mode", args.mode, "--port", "0", "--model", args.model, "--cache-dir", str(log_dir / "cache")]
    config = parse(GatewayConfig, flags)
    return start_service("gateway", "gateway", ENTRY_POINTS.module(ServiceKind.GATEWAY), config, log_dir)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running gateway (default: start a local stack)")
    parser.add_argument("--mode", default="pd")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--clients", type=int, default=2, help="concurrent clients sending huge prompts")
    parser.add_argument("--prompt-chars", type=int, default=0, help="0: the gateway's default maximum")
    args = parser.parse_args()
    if args.url:
        return asyncio.run(measure(args.url, args))
    service = start_stack(args)
    try:
        return asyncio.run(measure(service.wait_http_ready(900), args))
    finally:
        service.stop(timeout_s=60)


if __name__ == "__main__":
    sys.exit(main())
