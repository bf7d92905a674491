"""Per-worker bounds across gateways (issue 31, check 1), simulated: a local stack of mock workers
(`--engine mock`) behind one gateway and behind `--gateways` gateway processes, at the same rate.

Each run sends `--requests` requests (random token-id prompts, a fixed number of output tokens),
arriving as a Poisson process at `--rate` per wall second and taking turns among the gateways,
as behind a load balancer. Runs with one gateway and with G alternate over `--rounds`. A
sampler asks every worker for its own count of running requests (GetStats.num_inflight) every
`--sample-ms` and keeps the largest it saw; the bound is the worker's (WorkerInfo
.max_inflight_requests), which the worker enforces itself (libs/worker/capacity.py), so the
sampler checks the count that matters and can only miss a peak, never invent one.

With `--kill`, a last run with G gateways SIGKILLs the last one when half the requests have been
sent: the streams open on it end when its connections close (counted as its errors), requests
that would have gone to it afterwards go to the next gateway (as a load balancer that saw it
die), and the other gateways' requests must all succeed. Afterwards every worker must report
no request still running (the killed gateway's were aborted when its connections closed).

    ./bazel run //tools/bench:fleet_bound -- --workers 16 --gateways 3 --requests 5000 --rate 20 \
        --time-scale 4 --out-dir /tmp/fleet-bound --kill
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

import grpc.aio
import httpx
import numpy as np

from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.gateway.config import GatewayConfig
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity
from libs.stack.config import StackRole
from tools.bench.calibrate_mock import cpu_facts
from tools.bench.client import Outcome, stream_request
from tools.bench.gateways import (
    Gateway,
    mock_stack_config,
    start_gateway,
    start_replicas,
    wait_serving,
    workers_of,
)

MODEL = "smollm2"
FIRST_ID, LAST_ID = 1_000, 40_000
REPLICA_FLAGS = {"max_queued_requests": 100_000, "queue_timeout_s": 0.0, "request_timeout_s": 0.0}


@dataclass
class Sent:
    gateway: int
    after_kill: bool  # sent once the killed gateway was gone
    outcome: Outcome


@dataclass
class Run:
    gateways: int
    round: int
    killed: bool
    sent: list[Sent] = field(default_factory=list)
    wall_s: float = 0.0
    bound: int = 0
    peak_inflight: dict[str, int] = field(default_factory=dict)
    left_running: dict[str, int] = field(default_factory=dict)  # at the end, after a pause
    samples: int = 0
    retries_at_capacity: float = 0.0

    def errors(self, *, on_killed: bool | None = None) -> int:
        killed = self.gateways - 1 if self.killed else -1
        return sum(
            1
            for s in self.sent
            if s.outcome.error is not None and (on_killed is None or (s.gateway == killed) == on_killed)
        )

    def output_tokens_per_s(self) -> float:
        return sum(s.outcome.output_tokens for s in self.sent if s.outcome.error is None) / self.wall_s

    def latency_ms(self, what: str) -> tuple[float, float]:
        values = [
            getattr(s.outcome, what) * 1000.0
            for s in self.sent
            if s.outcome.error is None and getattr(s.outcome, what) is not None
        ]
        p50, p90 = np.percentile(values, [50, 90]) if values else (float("nan"), float("nan"))
        return float(p50), float(p90)


def gateway_config(args: argparse.Namespace, port_file: Path, token_file: Path) -> GatewayConfig:
    return mock_stack_config(
        args.workers,
        args.profile,
        args.time_scale,
        port_file,
        token_file,
        args.cache_dir,
        decode=StackRole(max_num_seqs=args.max_num_seqs),  # colocated workers take decode's
        routing=args.routing,
        **REPLICA_FLAGS,
    )


class InflightSampler:
    """Every worker's own count of running requests, polled; the largest seen per worker."""

    def __init__(self, workers: Sequence[str], token: str, interval_s: float) -> None:
        security = RpcSecurity(token=token)
        self._channels = {w: open_channel(w, security=security) for w in workers}
        self._stubs = {w: worker_pb2_grpc.WorkerStub(c) for w, c in self._channels.items()}
        self._interval_s = interval_s
        self.peak = dict.fromkeys(workers, 0)
        self.samples = 0

    async def bound(self) -> int:
        infos = await asyncio.gather(
            *(s.GetInfo(worker_pb2.GetInfoRequest(), timeout=10) for s in self._stubs.values())
        )
        return min(i.max_inflight_requests for i in infos)

    async def counts(self) -> dict[str, int]:
        stats = await asyncio.gather(
            *(s.GetStats(worker_pb2.GetStatsRequest(), timeout=10) for s in self._stubs.values())
        )
        return {w: s.num_inflight for w, s in zip(self._stubs, stats, strict=True)}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                counts = await self.counts()
            except grpc.aio.AioRpcError:
                continue
            self.samples += 1
            for worker, count in counts.items():
                self.peak[worker] = max(self.peak[worker], count)
            await asyncio.sleep(self._interval_s)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))


async def drive(
    bases: Sequence[str],
    gateways: Sequence[Gateway],
    run: Run,
    args: argparse.Namespace,
    sampler: InflightSampler,
) -> None:
    rng = random.Random(args.seed)
    arrivals, now = [], 0.0
    for _ in range(args.requests):
        now += rng.expovariate(args.rate)
        arrivals.append(now)
    prompts = [[rng.randrange(FIRST_ID, LAST_ID) for _ in range(args.prompt_tokens)] for _ in range(64)]
    body = {
        "model": MODEL,
        "max_tokens": args.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    alive = [True] * len(bases)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        for base in bases:  # warm-up, not measured
            await stream_request(client, f"{base}/v1/completions", {**body, "prompt": prompts[0]})
        run.bound = await sampler.bound()
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        started = time.perf_counter()

        async def one(index: int, arrival: float) -> Sent:
            delay = started + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if run.killed and index == args.requests // 2:
                gateways[-1][0].kill()
                alive[-1] = False
                print(f"killed gateway {len(bases) - 1} after {arrival:.1f} s", file=sys.stderr, flush=True)
            gateway = index % len(bases)
            while not alive[gateway]:  # the balancer skips a gateway it saw die
                gateway = (gateway + 1) % len(bases)
            after_kill = run.killed and not alive[-1]
            request = {**body, "prompt": prompts[index % len(prompts)]}
            outcome = await stream_request(client, f"{bases[gateway]}/v1/completions", request)
            return Sent(gateway, after_kill, outcome)

        run.sent = list(await asyncio.gather(*(one(i, a) for i, a in enumerate(arrivals))))
        run.wall_s = time.perf_counter() - started
        stop.set()
        await sampling
    await asyncio.sleep(2.0)  # aborts of the killed gateway's requests reach the engines
    run.left_running = await sampler.counts()
    run.peak_inflight, run.samples = dict(sampler.peak), sampler.samples
    for base, up in zip(bases, alive, strict=True):
        if up:
            run.retries_at_capacity += _retries_at_capacity(base)


def _retries_at_capacity(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('cleave_gateway_retries_total{stage="at_capacity"}')
    )


def one_run(args: argparse.Namespace, gateways_count: int, round_: int, killed: bool) -> Run:
    folder = Path(tempfile.mkdtemp(prefix="cleave-fleet-bound-"))
    token = secrets.token_urlsafe(32)
    token_file = folder / "grpc-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    logs = args.out_dir / "logs" / f"g{gateways_count}-{round_}{'-kill' if killed else ''}"
    primary = start_gateway("gateway", gateway_config(args, folder / "gateway.port", token_file), logs)
    gateways = [primary]
    run = Run(gateways_count, round_, killed)
    try:
        bases = [wait_serving(*primary, 600)]
        replicas, replica_bases = start_replicas(
            primary, bases[0], gateways_count - 1, folder, logs, **REPLICA_FLAGS
        )
        gateways += replicas
        bases += replica_bases
        print(
            f"round {round_}: {args.requests} requests over {len(bases)} gateway(s)"
            f"{', one killed at half' if killed else ''}",
            file=sys.stderr,
            flush=True,
        )

        async def measured() -> None:
            sampler = InflightSampler(workers_of(bases[0]), token, args.sample_ms / 1000.0)
            try:
                await drive(bases, gateways, run, args, sampler)
            finally:
                await sampler.close()

        asyncio.run(measured())
    finally:
        for process, _config in reversed(gateways):
            process.stop(60.0)
    return run


def report(runs: Sequence[Run], args: argparse.Namespace) -> str:
    cpu = cpu_facts()
    lines = [
        f"Simulated: {args.workers} colocated mock workers (max_num_seqs {args.max_num_seqs}), profile "
        f"{args.profile}, time scale {args.time_scale:g}; {args.requests} requests at {args.rate:g}/s (wall), "
        f"{args.prompt_tokens}-token prompts, {args.output_tokens} output tokens, routing {args.routing}, "
        f"seed {args.seed}; in-flight sampled every {args.sample_ms:g} ms at each worker; host {cpu['model']} "
        f"({', '.join(cpu['flags'])}), {cpu['cores']} cores.",
        "",
        "| gateways | round | killed | errors (others / killed one's) | sent after the kill: errors "
        "| worker bound | peak in flight (max over workers) | left running | at-capacity retries "
        "| output tok/s | TTFT p50 / p90 ms | e2e p50 / p90 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ttft, e2e = run.latency_ms("ttft_s"), run.latency_ms("e2e_s")
        after = [s for s in run.sent if s.after_kill]
        lines.append(
            f"| {run.gateways} | {run.round} | {'yes' if run.killed else 'no'} "
            f"| {run.errors(on_killed=False)} / {run.errors(on_killed=True)} "
            f"| {sum(1 for s in after if s.outcome.error)} of {len(after)} | {run.bound} "
            f"| {max(run.peak_inflight.values(), default=0)} | {sum(run.left_running.values())} "
            f"| {run.retries_at_capacity:.0f} | {run.output_tokens_per_s():.0f} "
            f"| {ttft[0]:.0f} / {ttft[1]:.0f} | {e2e[0]:.0f} / {e2e[1]:.0f} |"
        )
    plain = [r for r in runs if not r.killed]
    one = [r.output_tokens_per_s() for r in plain if r.gateways == 1]
    many = [r.output_tokens_per_s() for r in plain if r.gateways > 1]
    if one and many:
        lines += [
            "",
            f"Median output tok/s: 1 gateway {statistics.median(one):.0f}, {args.gateways} gateways "
            f"{statistics.median(many):.0f} (ratio {statistics.median(many) / statistics.median(one):.3f}; "
            f"spread 1: {min(one):.0f}-{max(one):.0f}, {args.gateways}: {min(many):.0f}-{max(many):.0f}).",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per wall second")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument(
        "--max-num-seqs", type=int, default=4, help="each worker's batch; its bound is twice it"
    )
    parser.add_argument("--profile", default="cpu-smollm2")
    parser.add_argument("--time-scale", type=float, default=4.0, help="wall seconds per simulated second")
    parser.add_argument("--routing", default="least_load")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kill", action="store_true", help="a last run kills one gateway halfway")
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "cleave")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.gateways < 2:
        parser.error("--gateways: at least 2 (the comparison is against one)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    plan = [
        (g, r, False)
        for r in range(args.rounds)
        for g in ((1, args.gateways) if r % 2 == 0 else (args.gateways, 1))
    ]
    if args.kill:
        plan.append((args.gateways, args.rounds, True))
    for gateways_count, round_, killed in plan:
        run = one_run(args, gateways_count, round_, killed)
        runs.append(run)
        name = f"g{gateways_count}-{round_}{'-kill' if killed else ''}.json"
        (args.out_dir / name).write_text(json.dumps([asdict(s) for s in run.sent], default=str))
        print(report([run], args).splitlines()[-1], file=sys.stderr, flush=True)
    text = report(runs, args)
    (args.out_dir / "report.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
