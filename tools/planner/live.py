"""A live run on mock workers, and the same workload in the discrete-event simulation beside it.

Starts a gateway with a local stack of mock workers (`--engine mock`, the profile, a time
scale S: every simulated duration S times longer on the wall clock), sends the workload's
requests at the simulated arrival times times S (the simulation's own arrival and length
draws, so both see the same requests), and reads each streamed token's arrival. Latencies are
divided by S back to the profile's seconds. With `--planner`, the gateway's planner sizes
the stack while the trace runs (`--before-s/--peak-s/--after-s/--factor`), and the run
reports every request lost (an error or a missing token).

The machine is shared: the run samples the host's CPU (/proc/stat) and the stack's own
(its process tree), and reports the headroom left. A host near saturation makes the numbers
the host's, not the profile's.

./bazel run //tools/planner:live -- --mode 1p1d --rate 8 --duration-s 60 --time-scale 10 --out-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np

from libs.config.flags import render
from libs.config.groups import EngineKind
from libs.config.roles import Role
from libs.gateway.config import GatewayConfig
from libs.mockengine.profiles import load_profile
from libs.planner.capacity import Engine
from libs.planner.config import PlannerFlags
from libs.planner.observe import Scrape
from libs.planner.policy import Policy
from libs.planner.sim.run import SimOptions, poisson_arrivals, simulate
from libs.planner.slo import Outcome, Slo, attainment, outcome_of
from libs.planner.state import Counts
from libs.planner.workload import RateTrace, Workload
from libs.stack import process as processes
from libs.stack.entry_points import ServiceKind
from libs.stack.topology import parse_mode
from services.entry_points import ENTRY_POINTS
from tools.bench import words
from tools.bench.client import stream_request
from tools.planner import cli
from tools.planner.host import HostSampler


@dataclass
class LiveRun:
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    workers: list[tuple[float, str]] = field(default_factory=list)  # (simulated s, fleet)
    cpu: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


def requests_of(workload: Workload, duration_s: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival, prompt tokens, output tokens) drawn exactly as the simulation draws them."""
    rng = random.Random(seed)
    arrivals = list(poisson_arrivals(workload.rate, duration_s, rng))
    return [(t, workload.isl.sample(rng), workload.osl.sample(rng)) for t in arrivals]


def gateway_config(args: argparse.Namespace, port_file: Path) -> GatewayConfig:
    mode = parse_mode(args.mode)
    config = GatewayConfig(
        mode=mode,
        host="127.0.0.1",
        port=0,
        port_file=port_file,
        engine=EngineKind.MOCK,
        mock_profile=args.profile,
        mock_time_scale=args.time_scale,
        mock_startup_s=args.startup_s,
        max_queued_requests=100_000,
        queue_timeout_s=0.0,
        request_timeout_s=0.0,
        cache_dir=args.cache_dir,
    )
    if args.planner:
        planning = PlannerFlags(
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            itl_stat=args.itl_stat,
            attainment=args.attainment,
            profile=args.profile,
            startup_s=args.startup_s,
            max_per_role=args.max_per_role,
            interval_s=args.interval_s,
        )
        config = replace(config, planner=True, planning=planning)
    return config


async def fleet_now(client: httpx.AsyncClient, base: str) -> str:
    scrape = Scrape.parse("gateway", (await client.get(f"{base}/metrics")).text)
    ready = {role: 0 for role in ("prefill", "decode", "both")}
    for (_worker, role), value in scrape.by_worker("cleave_gateway_worker_routable").items():
        if value > 0 and role in ready:
            ready[role] += 1
    return Counts(ready["prefill"], ready["decode"], ready["both"]).name


async def drive(
    args: argparse.Namespace, base: str, requests: list[tuple[float, int, int]], root_pid: int
) -> LiveRun:
    run = LiveRun()
    scale = args.time_scale
    rng = np.random.default_rng(args.seed)
    prompts = [words.text(rng, isl) for _, isl, _ in requests]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as client:
        # Warm-up: two short requests, not measured.
        for _ in range(2):
            await stream_request(
                client,
                "/v1/completions",
                {
                    "model": "smollm2",
                    "prompt": "warm up",
                    "max_tokens": 4,
                    "stream": True,
                    "ignore_eos": True,
                },
            )
        started = time.perf_counter()
        sampler = HostSampler(root_pid)

        async def one(index: int, arrival: float, osl: int) -> None:
            delay = started + arrival * scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            body = {
                "model": "smollm2",
                "prompt": prompts[index],
                "max_tokens": osl,
                "temperature": 0.0,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            outcome = await stream_request(client, "/v1/completions", body)
            ok = outcome.error is None and outcome.output_tokens == osl
            if not ok:
                run.errors.append(outcome.error or f"{outcome.output_tokens} of {osl} tokens")
            times = []
            if outcome.ttft_s is not None:
                t = outcome.ttft_s
                times.append(t)
                for gap in outcome.itl_s:
                    t += gap
                    times.append(t)
            arrival_sim = (sent - started) / scale
            run.outcomes.append(outcome_of(arrival_sim, [arrival_sim + x / scale for x in times], ok=ok))

        async def watch() -> None:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    run.workers.append(
                        ((time.perf_counter() - started) / scale, await fleet_now(client, base))
                    )
                await asyncio.sleep(max(1.0, scale))

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(one(i, t, osl) for i, (t, _isl, osl) in enumerate(requests)))
        watcher.cancel()
        run.wall_s = time.perf_counter() - started
        run.cpu = sampler.finish()
    return run


def distribution(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p90, p99 = np.percentile(np.asarray(values) * 1000.0, [50, 90, 99])
    return f"{p50:.1f} / {p90:.1f} / {p99:.1f}"


def table(rows: list[tuple[str, list[Outcome]]], slo: Slo) -> list[str]:
    lines = [
        "| run | requests | failed | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | own ITL p99, p50/p90/p99 ms | met both |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, outcomes in rows:
        ok = [o for o in outcomes if o.ok]
        lines.append(
            f"| {name} | {len(outcomes)} | {len(outcomes) - len(ok)} | {distribution([o.ttft_s for o in ok if o.ttft_s is not None])} |"
            f" {distribution([o.itl_mean_s for o in ok])} | {distribution([o.itl_p99_s for o in ok])} |"
            f" {attainment(outcomes, slo):.3f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_workload(parser)
    cli.add_objectives(parser)
    parser.add_argument("--mode", default="1p1d", help="the stack's starting topology (XpYd, Npd)")
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--duration-s", type=float, default=60.0, help="simulated seconds of arrivals")
    parser.add_argument(
        "--startup-s", type=float, default=None, help="mock start-up (simulated s; default: the profile's)"
    )
    parser.add_argument("--planner", action="store_true", help="the gateway's planner sizes the stack")
    parser.add_argument("--factor", type=float, default=1.0, help="step trace: rate x factor in the peak")
    parser.add_argument("--before-s", type=float, default=0.0)
    parser.add_argument("--peak-s", type=float, default=0.0)
    parser.add_argument(
        "--interval-s", type=float, default=10.0, help="planner: simulated s between decisions"
    )
    parser.add_argument("--max-per-role", type=int, default=8)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "cleave")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    trace = (
        RateTrace.step(args.rate, args.factor, args.before_s, args.peak_s)
        if args.peak_s
        else RateTrace.constant(args.rate)
    )
    workload = Workload(trace, args.isl, args.osl)
    requests = requests_of(workload, args.duration_s, args.seed)
    slo = cli.slo_of(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    port_file = Path(tempfile.mkdtemp(prefix="cleave-live-")) / "gateway.port"
    config = gateway_config(args, port_file)
    spec = processes.ProcessSpec(
        "gateway", processes.python_module(ENTRY_POINTS.module(ServiceKind.GATEWAY), render(config))
    )
    gateway = processes.start(spec, args.out_dir / "logs")
    try:
        deadline = time.monotonic() + 600
        while not port_file.exists() or not port_file.read_text().strip():
            if gateway.exit_code() is not None or time.monotonic() > deadline:
                raise gateway.failure("did not report its port")
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        asyncio.run(
            processes.wait_ready([replace(gateway, spec=replace(spec, health_url=f"{base}/ready"))], 600)
        )
        print(
            f"live: {len(requests)} requests over {args.duration_s:g} simulated s at time scale {args.time_scale:g}",
            file=sys.stderr,
            flush=True,
        )
        live = asyncio.run(drive(args, base, requests, gateway.pid))
    finally:
        gateway.stop(60.0)
    sim_options = SimOptions(
        args.profile,
        duration_s=args.duration_s,
        seed=args.seed,
        startup_s=args.startup_s,
        engine=cli.engine_overrides(args),
    )
    mode = parse_mode(args.mode)
    fleet = Counts(mode.prefill, mode.decode, mode.colocated)
    controller = None
    if args.planner:
        flags = gateway_config(args, port_file).planning
        startup = args.startup_s if args.startup_s is not None else load_profile(args.profile).startup_s
        roles = [Role.BOTH] if fleet.colocated else [Role.PREFILL, Role.DECODE]
        controller = Policy(flags.policy(roles, startup), Engine.from_profile(args.profile))
    simulated = simulate(fleet, workload, sim_options, controller=controller)
    lines = [
        f"# Live mock run vs the simulation: {workload.describe()}",
        "",
        f"Live: mock workers, profile {args.profile}, time scale {args.time_scale:g} (latencies divided by it),"
        f" stack {args.mode}{' with the planner' if args.planner else ''}; the simulation: the same requests"
        f" (same draws), SIMULATED. Objectives: {slo.describe()}.",
        "",
        *table([("live (mock workers)", live.outcomes), ("simulation", simulated.outcomes)], slo),
        "",
        f"- lost requests (error or tokens missing) in the live run: {len(live.errors)}"
        + (f"; first: {live.errors[:3]}" if live.errors else ""),
        f"- host CPU during the live run: {live.cpu.get('host_busy', 0):.0%} busy of {live.cpu.get('cores', 0):.0f} cores"
        f" (the stack's processes {live.cpu.get('stack_cores', 0):.2f} cores, this load generator"
        f" {live.cpu.get('load_generator_cores', 0):.2f}, everything else"
        f" {live.cpu.get('others_cores', 0):.2f}); load average {live.cpu.get('load_avg', 0):.1f}; wall {live.wall_s:.0f} s",
    ]
    if args.planner:
        changes = [
            (round(t), f) for i, (t, f) in enumerate(live.workers) if i == 0 or f != live.workers[i - 1][1]
        ]
        sim_changes = [(round(p.t), p.ready.name) for p in simulated.timeline]
        lines += [
            f"- live fleet (simulated s, ready workers): {changes}",
            f"- simulated fleet: {dedupe(sim_changes)}",
            f"- worker-minutes, simulation: {simulated.worker_minutes:.1f}",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out_dir / "live.md").write_text(text)
    cli.write_json(
        args.out_dir / "live.json",
        {
            "live": [o.__dict__ for o in live.outcomes],
            "simulated": [o.__dict__ for o in simulated.outcomes],
            "errors": live.errors,
            "cpu": live.cpu,
            "workers": live.workers,
        },
    )
    return 0


def dedupe(points: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [p for i, p in enumerate(points) if i == 0 or p[1] != points[i - 1][1]]


if __name__ == "__main__":
    sys.exit(main())
