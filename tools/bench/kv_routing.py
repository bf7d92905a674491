"""Prefix-cache hit rate and TTFT of routing policies on a multi-tenant shared-context workload
(issue 31), simulated: a local stack of mock workers (`--engine mock`).

Each of `--tenants` tenants has its own shared context of `--context-tokens` token ids (a long
system prompt or document); each request is one tenant's context (drawn uniformly) plus a
question of its own, arriving as a Poisson process at `--rate` requests per simulated second.
The same requests go, in the same order and at the same times, to one stack per policy
(`--policies`), `--rounds` times with the order of the policies rotated each round. With
`--gateways G`, G-1 more gateway processes serve the same workers (each with its own routing
state, as replicas behind a load balancer) and the requests take turns among the G.

Hit rate: prompt tokens the engines did not compute (the usage's cached_tokens, with
--enable-prompt-tokens-details) over all prompt tokens. The oracle bound is the most any
router can reach on this sequence: every request whose tenant came before hits its whole
context (its full blocks), as if the first request of each tenant had cached it on every
worker, with no eviction. A real oracle (every worker's cache known, capacity finite) can
only be lower, so a policy's ratio to this bound understates its ratio to that oracle.

    ./bazel run //tools/bench:kv_routing -- --workers 16 --tenants 48 --context-tokens 4000 \
        --requests 400 --rate 1 --time-scale 0.5 --out-dir /tmp/kv-routing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from libs.gateway.config import GatewayConfig
from libs.mockengine.profiles import load_profile
from tools.bench.calibrate_mock import cpu_facts
from tools.bench.client import Outcome, stream_request
from tools.bench.gateways import mock_stack_config, start_gateway, start_replicas, wait_serving

MODEL = "smollm2"  # the tokenizer the mock stack loads (its ids are what the mock generates)
FIRST_ID, LAST_ID = 1_000, 40_000  # plain word pieces of SmolLM2's vocabulary


@dataclass(frozen=True)
class Request:
    arrival_s: float  # simulated
    tenant: int
    prompt: list[int]


@dataclass
class PolicyRun:
    policy: str
    round: int
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None]

    def hit_rate(self) -> float:
        ok = self.ok()
        prompt = sum(o.prompt_tokens or 0 for o in ok)
        return sum(o.cached_tokens or 0 for o in ok) / prompt if prompt else 0.0

    def ttft_ms(self, scale: float) -> tuple[float, float]:
        values = [o.ttft_s / scale * 1000.0 for o in self.ok() if o.ttft_s is not None]
        p50, p90 = np.percentile(values, [50, 90]) if values else (float("nan"), float("nan"))
        return float(p50), float(p90)


def workload(args: argparse.Namespace) -> list[Request]:
    rng = random.Random(args.seed)
    contexts = [
        [rng.randrange(FIRST_ID, LAST_ID) for _ in range(args.context_tokens)] for _ in range(args.tenants)
    ]
    requests, now = [], 0.0
    for _ in range(args.requests):
        now += rng.expovariate(args.rate)
        tenant = rng.randrange(args.tenants)
        question = [rng.randrange(FIRST_ID, LAST_ID) for _ in range(args.question_tokens)]
        requests.append(Request(now, tenant, contexts[tenant] + question))
    return requests


def oracle_bound(requests: Sequence[Request], context_tokens: int, block_size: int) -> float:
    """The hit rate if every request after a tenant's first hit that tenant's whole context."""
    seen: set[int] = set()
    hits = 0
    for request in requests:
        if request.tenant in seen:
            hits += context_tokens // block_size * block_size
        seen.add(request.tenant)
    return hits / sum(len(r.prompt) for r in requests)


# The primary's flags that matter to this workload, for each replica too.
REPLICA_FLAGS = {
    "enable_prompt_tokens_details": True,
    "max_queued_requests": 100_000,
    "queue_timeout_s": 0.0,
    "request_timeout_s": 0.0,
}


def gateway_config(args: argparse.Namespace, policy: str, port_file: Path, token_file: Path) -> GatewayConfig:
    return mock_stack_config(
        args.workers,
        args.profile,
        args.time_scale,
        port_file,
        token_file,
        args.cache_dir,
        routing=policy,
        **REPLICA_FLAGS,
    )


async def drive(
    bases: Sequence[str], requests: Sequence[Request], args: argparse.Namespace
) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:

        def body(prompt: list[int]) -> dict[str, object]:
            return {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": args.output_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }

        for base in bases:  # warm-up, not measured
            await stream_request(client, f"{base}/v1/completions", body([FIRST_ID] * 8))
        started = time.perf_counter()

        async def one(index: int, request: Request) -> Outcome:
            delay = started + request.arrival_s * args.time_scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            base = bases[index % len(bases)]  # the gateways take turns, as behind a load balancer
            return await stream_request(client, f"{base}/v1/completions", body(request.prompt))

        outcomes = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        return list(outcomes), time.perf_counter() - started


def run_policy(args: argparse.Namespace, policy: str, requests: Sequence[Request], round_: int) -> PolicyRun:
    folder = Path(tempfile.mkdtemp(prefix="cleave-kv-routing-"))
    token_file = folder / "grpc-token"
    token_file.write_text(secrets.token_urlsafe(32))
    token_file.chmod(0o600)
    logs = args.out_dir / "logs" / f"{policy}-{round_}"
    primary = gateway_config(args, policy, folder / "gateway.port", token_file)
    gateways = [start_gateway("gateway", primary, logs)]
    try:
        bases = [wait_serving(*gateways[0], 600)]
        if args.gateways > 1:
            replicas, replica_bases = start_replicas(
                gateways[0], bases[0], args.gateways - 1, folder, logs, **REPLICA_FLAGS
            )
            gateways += replicas
            bases += replica_bases
        print(
            f"round {round_}, {policy}: {len(requests)} requests over {len(bases)} gateways",
            file=sys.stderr,
            flush=True,
        )
        outcomes, wall_s = asyncio.run(drive(bases, requests, args))
    finally:
        for process, _config in reversed(gateways):
            process.stop(60.0)
    return PolicyRun(policy, round_, outcomes, wall_s)


def report(runs: Sequence[PolicyRun], bound: float, args: argparse.Namespace) -> str:
    cpu = cpu_facts()
    lines = [
        f"Simulated: {args.workers} mock workers (`{args.workers}pd`), profile {args.profile}, time scale "
        f"{args.time_scale:g}; {args.tenants} tenants x {args.context_tokens}-token contexts + "
        f"{args.question_tokens}-token questions, {args.output_tokens} output tokens, {args.requests} requests "
        f"at {args.rate:g}/s (simulated) through {args.gateways} gateway(s), seed {args.seed}; host {cpu['model']} "
        f"({', '.join(cpu['flags'])}), {cpu['cores']} cores. Oracle bound {bound:.3f}.",
        "",
        "| policy | round | errors | hit rate | ÷ oracle bound | TTFT p50 ms | TTFT p90 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        p50, p90 = run.ttft_ms(args.time_scale)
        errors = len(run.outcomes) - len(run.ok())
        lines.append(
            f"| {run.policy} | {run.round} | {errors} | {run.hit_rate():.3f} | {run.hit_rate() / bound:.3f} "
            f"| {p50:.0f} | {p90:.0f} |"
        )
    lines += ["", "| policy | median hit rate ÷ bound | median TTFT p50 / p90 ms |", "|---|---|---|"]
    for policy in args.policies:
        mine = [r for r in runs if r.policy == policy]
        ratio = statistics.median(r.hit_rate() / bound for r in mine)
        p50 = statistics.median(r.ttft_ms(args.time_scale)[0] for r in mine)
        p90 = statistics.median(r.ttft_ms(args.time_scale)[1] for r in mine)
        lines.append(f"| {policy} | {ratio:.3f} | {p50:.0f} / {p90:.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=48)
    parser.add_argument("--context-tokens", type=int, default=4000)
    parser.add_argument("--question-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per simulated second")
    parser.add_argument("--profile", default="cpu-smollm2")
    parser.add_argument("--time-scale", type=float, default=0.5, help="wall seconds per simulated second")
    parser.add_argument("--policies", nargs="+", default=["kv_events", "prefix_affinity", "round_robin"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--gateways", type=int, default=1, help="gateway processes over the same workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "cleave")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    requests = workload(args)
    bound = oracle_bound(requests, args.context_tokens, load_profile(args.profile).model.block_size)
    runs = []
    for round_ in range(args.rounds):
        shift = round_ % len(args.policies)
        for policy in args.policies[shift:] + args.policies[:shift]:
            run = run_policy(args, policy, requests, round_)
            runs.append(run)
            (args.out_dir / f"{policy}-{round_}.json").write_text(
                json.dumps([asdict(o) for o in run.outcomes], default=str)
            )
    text = report(runs, bound, args)
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
