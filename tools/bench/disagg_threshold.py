"""What a prompt costs computed on the decode worker vs handed off from a prefill worker, by
prompt length: the measurement behind conditional disaggregation's default threshold
(--local-prefill-max-tokens, libs/gateway/serving/disaggregation.py; docs/benchmarks.md).

./bazel run //tools/bench:disagg_threshold -- --lengths 64,256,1024 --reps 2 --out /tmp/dt.md

Two 1p1d stacks in turn (the same cores and settings as tools/bench:compare's cleave-1p1d):
`remote` (--disagg-policy always) and `local` (conditional, every prompt under the threshold:
the decode worker computes it). On each, per prompt length and repetition, fresh prompts:
- idle: one request with max_tokens 4, its TTFT;
- under decode: a stream of 32-token prompt decoding 300 tokens runs; 1 s in, the same kind of
  request is sent; its TTFT, and the longest gap the running stream saw while it was served
  (how much the prompt stalled decode), against that stream's median gap.
Placing a prompt locally pays when its stall on running streams costs less than the handoff
adds to its own TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from libs.stack.process import Launched, start, wait_ready
from tools.bench.client import Outcome, stream_request
from tools.bench.systems.catalog import ServingSettings, SystemPlan, plan_system

PLACEMENTS = {
    "remote": (),
    "local": ("--disagg-policy", "conditional", "--local-prefill-max-tokens", "1000000"),
}
BACKGROUND_TOKENS = 300
# Tokens a probe request generates: a few, since TTFT is taken at the first non-empty text
# (a lone token may decode to nothing, e.g. part of a multi-byte character).
PROBE = 4


@dataclass(frozen=True)
class Sample:
    placement: str
    length: int
    idle_ttft_ms: float
    loaded_ttft_ms: float
    stall_ms: float  # the running stream's longest gap while the request was served
    background_itl_p50_ms: float


def _prompt(rng: random.Random, length: int) -> list[int]:
    # Token ids of ordinary words' range; fresh per request so no prefix cache hits.
    return [rng.randrange(1000, 20000) for _ in range(length)]


def _body(model: str, prompt: list[int], max_tokens: int) -> dict[str, object]:
    return {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def _times(outcome: Outcome, start: float) -> list[float]:
    """Absolute perf_counter times of the stream's content chunks."""
    if outcome.ttft_s is None:
        return []
    times = [start + outcome.ttft_s]
    for gap in outcome.itl_s:
        times.append(times[-1] + gap)
    return times


async def measure(url: str, model: str, placement: str, lengths: Sequence[int], reps: int) -> list[Sample]:
    rng = random.Random(list(PLACEMENTS).index(placement) + 1)
    samples = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await stream_request(client, "/v1/completions", _body(model, _prompt(rng, 64), 4))  # warm up
        for length in lengths:
            for _ in range(reps):
                idle = await stream_request(
                    client, "/v1/completions", _body(model, _prompt(rng, length), PROBE)
                )
                bg_start = time.perf_counter()
                background = asyncio.create_task(
                    stream_request(
                        client, "/v1/completions", _body(model, _prompt(rng, 32), BACKGROUND_TOKENS)
                    )
                )
                await asyncio.sleep(1.0)
                fg_start = time.perf_counter()
                loaded = await stream_request(
                    client, "/v1/completions", _body(model, _prompt(rng, length), PROBE)
                )
                fg_end = time.perf_counter()
                bg = await background
                if idle.ttft_s is None or loaded.ttft_s is None or bg.error or not bg.itl_s:
                    errors = [o.error for o in (idle, loaded, bg) if o.error]
                    if errors:
                        raise RuntimeError(f"{placement} {length}: {errors}")
                    print(f"{placement} {length}: no text in a stream; sample skipped", file=sys.stderr)
                    continue
                times = _times(bg, bg_start)
                during = [b - a for a, b in itertools.pairwise(times) if b >= fg_start and a <= fg_end]
                samples.append(
                    Sample(
                        placement,
                        length,
                        idle.ttft_s * 1000,
                        loaded.ttft_s * 1000,
                        max(during, default=0.0) * 1000,
                        statistics.median(bg.itl_s) * 1000,
                    )
                )
                print(samples[-1], file=sys.stderr, flush=True)
    return samples


async def run(settings: ServingSettings, lengths: Sequence[int], reps: int, log_dir: Path) -> list[Sample]:
    from libs.rpc.ports import free_port

    samples: list[Sample] = []
    for placement, extra in PLACEMENTS.items():
        plan: SystemPlan = plan_system("cleave-1p1d", settings, free_port)
        (gateway,) = plan.processes
        gateway = replace(gateway, argv=(*gateway.argv, *extra))
        launched = Launched()
        try:
            launched.processes.append(start(gateway, log_dir / placement))
            await wait_ready(launched.processes, settings.startup_timeout_s)
            samples += await measure(plan.base_url, settings.served_name, placement, lengths, reps)
        finally:
            launched.stop(60.0)
    return samples


def markdown(samples: Sequence[Sample]) -> str:
    lines = [
        "| prompt tokens | placement | idle TTFT ms | TTFT ms under decode | running stream's longest gap ms |"
        " its median gap ms |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(s.length, s.placement) for s in samples}, key=lambda k: (k[0], k[1] != "remote"))
    for length, placement in keys:
        mine = [s for s in samples if (s.length, s.placement) == (length, placement)]

        def med(values: list[float]) -> str:
            return f"{statistics.median(values):.0f}" + (
                f" [{min(values):.0f}–{max(values):.0f}]" if len(values) > 1 else ""
            )

        lines.append(
            f"| {length} | {placement} | {med([s.idle_ttft_ms for s in mine])} |"
            f" {med([s.loaded_ttft_ms for s in mine])} | {med([s.stall_ms for s in mine])} |"
            f" {med([s.background_itl_p50_ms for s in mine])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="disagg_threshold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from libs.models.resolve import resolve_model

    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True)
    settings = ServingSettings(model_path=model.path, dtype=args.dtype, startup_timeout_s=600.0)
    lengths = [int(n) for n in args.lengths.split(",")]
    samples = asyncio.run(run(settings, lengths, args.reps, args.out.parent / "disagg-threshold-logs"))
    table = markdown(samples)
    args.out.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
