"""The planning mode: the fleet to run for a workload and objectives, before anything runs.

./bazel run //tools/planner:plan -- --profile h100-llama3-8b --rate 24 --isl 2000:0.5 --osl 200:0.5 \
    --ttft-ms 450 --itl-ms 40 [--itl-stat p99] [--no-verify] [--json out.json]

Prints the capacity model's per-worker rates, the model's XpYd and Npd, the simulation's
corrections (every trial), the choice (disaggregate or pd) and the conditional threshold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from libs.planner.recommend import Recommendation, recommend
from libs.planner.sim.run import SimOptions, simulate
from libs.planner.slo import attainment, goodput
from libs.planner.state import Counts
from libs.stack.topology import parse_mode
from tools.planner import cli


def render(rec: Recommendation, conditions: str, wall_s: float) -> str:
    caps = rec.capacity
    lines = [
        f"# Planning mode: {rec.workload}",
        "",
        conditions,
        "",
        "| per worker (req/s, capacity model) | prefill | decode | colocated |",
        "|---|---|---|---|",
        f"| within the objectives | {caps.prefill:.2f} | {caps.decode:.2f} | {caps.colocated:.2f} |",
        "",
        f"- model: {rec.model_disaggregated.name} or {rec.model_colocated.name}",
        f"- after the simulation's checks: {rec.disaggregated.name} or {rec.colocated.name}",
        f"- **choice: {rec.choice.name}** ({'disaggregate' if rec.disaggregate else 'do not disaggregate'})",
        f"- conditional disaggregation threshold (--local-prefill-max-tokens): {rec.local_prefill_max_tokens}",
        "",
    ]
    if rec.trials:
        lines += ["| fleet | attainment | TTFT met | ITL met |", "|---|---|---|---|"]
        lines += [
            f"| {t.fleet.name} | {t.attainment:.3f} | {t.ttft_attainment:.3f} | {t.itl_attainment:.3f} |"
            for t in rec.trials
        ]
    lines += ["", f"({wall_s:.0f} s of wall time)"]
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> str:
    """A fixed budget: each candidate fleet in the simulation, at the workload's arrivals (open
    loop at --rate for --duration-s, or closed loop at --concurrency for --num-requests); the
    one with the higher goodput is the choice, a tie (within --tie) is the colocated one."""
    slo = cli.slo_of(args)
    options = SimOptions(
        args.profile,
        duration_s=args.duration_s if args.concurrency is None else 1e9,
        seed=args.seed,
        engine=cli.engine_overrides(args),
        concurrency=args.concurrency,
        num_requests=args.num_requests,
    )
    rows = []
    for text in args.compare.split(","):
        mode = parse_mode(text)
        fleet = Counts(mode.prefill, mode.decode, mode.colocated)
        result = simulate(fleet, cli.workload_of(args), options)
        rows.append(
            (fleet, attainment(result.outcomes, slo), goodput(result.outcomes, slo), len(result.outcomes))
        )
    best = max(g for _, _, g, _ in rows)
    tied = [fleet for fleet, _, g, _ in rows if g >= best * (1 - args.tie)]
    choice = next((f for f in tied if not f.disaggregated), tied[0])
    load = (
        f"closed loop, {args.concurrency} in flight, {args.num_requests} requests"
        if args.concurrency
        else f"Poisson {args.rate:g} req/s for {args.duration_s:g} s"
    )
    lines = [
        f"# Planning mode, a fixed budget: {', '.join(f.name for f, *_ in rows)}",
        "",
        cli.conditions(args) + f"; {load}",
        "",
        "| fleet | requests | met both | goodput (req/s) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {f.name} | {n} | {a:.3f} | {g:.3f} |" for f, a, g, n in rows]
    lines += [
        "",
        f"- **choice: {choice.name}** (the higher goodput; within {args.tie:.0%} of each other: the colocated one)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_workload(parser)
    cli.add_objectives(parser)
    parser.add_argument("--no-verify", action="store_true", help="the capacity model only (no simulation)")
    parser.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds per trial")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compare", default=None, help="a fixed budget: candidate fleets, e.g. 2pd,1p1d")
    parser.add_argument("--concurrency", type=int, default=None, help="--compare: closed loop")
    parser.add_argument("--num-requests", type=int, default=40, help="--compare: closed loop's requests")
    parser.add_argument("--tie", type=float, default=0.02, help="--compare: goodputs this close are a tie")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.compare:
        print(compare(args) + f"\n\n({time.monotonic() - started:.0f} s of wall time)")
        return 0
    rec = recommend(
        cli.workload_of(args),
        args.profile,
        cli.slo_of(args),
        cores=args.cores,
        verify=not args.no_verify,
        duration_s=args.duration_s,
        seed=args.seed,
        engine_overrides=cli.engine_overrides(args),
    )
    print(render(rec, cli.conditions(args), time.monotonic() - started))
    cli.write_json(args.json, asdict(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
