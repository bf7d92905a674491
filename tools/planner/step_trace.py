"""The planner on a step trace, against fixed allocations (SIMULATED: the discrete-event
simulation on the mock engine's scheduler with a profile; the planner's own policy in the loop).

The trace: `--base-rate` req/s for `--before-s`, `--factor` times it for `--peak-s`, back to the
base for `--after-s`. The planner starts from the planning mode's fleet for the base rate and
sizes the kind of fleet the planning mode picks at the peak (`--kind` forces one). Fixed
allocations around the planning mode's peak fleet run the same trace. A request counts when it
meets both objectives; the check is >= `--target` of all requests, with no more worker-minutes
than the best fixed allocation that meets it, and none lost.

./bazel run //tools/planner:step_trace -- --base-rate 6 --factor 4 --startup-s 60,30,15 --out-dir DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from libs.config.roles import Role
from libs.mockengine.profiles import load_profile
from libs.planner.capacity import Engine
from libs.planner.config import PlannerFlags
from libs.planner.policy import Policy
from libs.planner.recommend import recommend
from libs.planner.sim.run import SimOptions, SimResult, simulate
from libs.planner.slo import attainment
from libs.planner.state import Counts
from libs.planner.workload import RateTrace, Workload
from libs.stack.topology import parse_mode
from tools.planner import cli


def summary(name: str, result: SimResult, args: argparse.Namespace) -> dict[str, Any]:
    slo = replace(cli.slo_of(args), attainment=args.target)
    outcomes = result.outcomes
    by_minute: dict[int, list[bool]] = {}
    for o in outcomes:
        by_minute.setdefault(int(o.arrival_s // 60), []).append(o.meets(slo))
    return {
        "name": name,
        "requests": len(outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "unfinished": result.unfinished,
        "attainment": attainment(outcomes, slo),
        "worker_minutes": result.worker_minutes,
        "by_minute": {m: sum(v) / len(v) for m, v in sorted(by_minute.items())},
        "timeline": [
            (p.t, p.ready.name, p.starting.name, p.retiring.name, p.arrival_rate) for p in result.timeline
        ],
    }


def plot(path: Path, runs: list[tuple[str, SimResult]], trace: RateTrace, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, result in runs:
        ts = [p.t / 60 for p in result.timeline]
        ax.step(ts, [p.ready.total for p in result.timeline], where="post", label=f"{name}: ready workers")
        ax.step(
            ts,
            [p.ready.total + p.starting.total for p in result.timeline],
            where="post",
            linestyle=":",
            label=f"{name}: ready + starting",
        )
    rate_ax = ax.twinx()
    end = max(r.end_s for _, r in runs)
    points = [(s, r) for s, r in trace.steps] + [(end, trace.rate_at(end))]
    rate_ax.step(
        [s / 60 for s, _ in points],
        [r for _, r in points],
        where="post",
        color="grey",
        alpha=0.5,
        label="arrival rate",
    )
    rate_ax.set_ylabel("arrival rate (req/s)")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("workers")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_workload(parser, rate=False)
    cli.add_objectives(parser)
    parser.add_argument("--base-rate", type=float, default=6.0)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--before-s", type=float, default=600.0)
    parser.add_argument("--peak-s", type=float, default=600.0)
    parser.add_argument("--after-s", type=float, default=600.0)
    parser.add_argument("--target", type=float, default=0.95, help="fraction of all requests meeting both")
    parser.add_argument(
        "--startup-s",
        type=lambda t: [float(x) for x in t.split(",")],
        default=None,
        help="worker start-up times to run the planner with (default: the profile's)",
    )
    parser.add_argument("--kind", choices=("auto", "pd", "disaggregated"), default="auto")
    parser.add_argument(
        "--fixed", default="", help="extra fixed fleets to run (XpYd or Npd, comma-separated)"
    )
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    slo = cli.slo_of(args)
    overrides = cli.engine_overrides(args)
    trace = RateTrace.step(args.base_rate, args.factor, args.before_s, args.peak_s)
    workload = Workload(trace, args.isl, args.osl)
    duration = args.before_s + args.peak_s + args.after_s
    sim = SimOptions(args.profile, duration_s=duration, seed=args.seed, drain_limit_s=300.0, engine=overrides)
    peak = recommend(
        workload.at_rate(trace.peak),
        args.profile,
        slo,
        cores=args.cores,
        seed=args.seed,
        engine_overrides=overrides,
    )
    base = recommend(
        workload.at_rate(args.base_rate),
        args.profile,
        slo,
        cores=args.cores,
        seed=args.seed,
        engine_overrides=overrides,
    )
    disaggregated = peak.disaggregate if args.kind == "auto" else args.kind == "disaggregated"
    start_fleet = base.disaggregated if disaggregated else base.colocated
    print(
        f"peak: {peak.choice.name} (checked {peak.disaggregated.name} / {peak.colocated.name}); "
        f"planner sizes {'XpYd' if disaggregated else 'Npd'} from {start_fleet.name}",
        file=sys.stderr,
        flush=True,
    )

    # Fixed allocations: the planning mode's peak fleets and one worker less or more per role.
    peak_fleet = peak.disaggregated if disaggregated else peak.colocated
    roles = [Role.PREFILL, Role.DECODE] if disaggregated else [Role.BOTH]
    candidates = {peak_fleet, peak.disaggregated, peak.colocated}
    for role in roles:
        for delta in (-1, 1):
            if peak_fleet.get(role) + delta >= 1:
                candidates.add(peak_fleet.with_role(role, peak_fleet.get(role) + delta))
    for text in filter(None, args.fixed.split(",")):
        mode = parse_mode(text)
        candidates.add(Counts(mode.prefill, mode.decode, mode.colocated))
    rows: list[dict[str, Any]] = []
    runs: list[tuple[str, SimResult]] = []
    for fleet in sorted(candidates, key=lambda c: (c.total, c.name)):
        result = simulate(fleet, workload, sim)
        rows.append({"kind": "fixed", **summary(fleet.name, result, args)})
        print(
            rows[-1]["name"],
            round(rows[-1]["attainment"], 4),
            round(rows[-1]["worker_minutes"], 1),
            file=sys.stderr,
            flush=True,
        )
    flags = PlannerFlags(
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        itl_stat=args.itl_stat,
        attainment=args.attainment,
        max_per_role=32,
    )
    engine = Engine.from_profile(args.profile, args.cores, **overrides)
    for startup in args.startup_s or [load_profile(args.profile).startup_s]:
        policy = Policy(flags.policy(roles, startup), engine)
        result = simulate(start_fleet, workload, replace(sim, startup_s=startup), controller=policy)
        name = f"planner (start-up {startup:g} s)"
        rows.append({"kind": "planner", "startup_s": startup, **summary(name, result, args)})
        runs.append((name, result))
        print(
            name,
            round(rows[-1]["attainment"], 4),
            round(rows[-1]["worker_minutes"], 1),
            file=sys.stderr,
            flush=True,
        )
    fixed_ok = [r for r in rows if r["kind"] == "fixed" and r["attainment"] >= args.target]
    best = min(fixed_ok, key=lambda r: r["worker_minutes"], default=None)
    lines = [
        f"# The planner on a step trace: {args.base_rate:g} req/s, x{args.factor:g} for {args.peak_s:g} s, back",
        "",
        cli.conditions(args).replace(
            f"objectives: {slo.describe()}", f"objectives: {replace(slo, attainment=args.target).describe()}"
        ),
        f"; trace {args.before_s:g} s + {args.peak_s:g} s + {args.after_s:g} s",
        "",
        "| run | requests | met both | worker-minutes | failed or lost | meets the target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['requests']} | {r['attainment']:.4f} | {r['worker_minutes']:.1f} |"
            f" {r['failed']} | {'yes' if r['attainment'] >= args.target else 'no'} |"
        )
    lines += [
        "",
        f"- best fixed allocation meeting the target: **{best['name'] if best else 'none'}**"
        + (f" ({best['worker_minutes']:.1f} worker-minutes)" if best else ""),
    ]
    for r in rows:
        if r["kind"] != "planner":
            continue
        cheaper = best is not None and r["worker_minutes"] <= best["worker_minutes"]
        lines.append(
            f"- {r['name']}: target {'met' if r['attainment'] >= args.target else 'missed'}, "
            f"worker-minutes {'<=' if cheaper else '>'} the best fixed, {r['failed']} requests lost; "
            "met per minute: " + ", ".join(f"{m}:{v:.2f}" for m, v in r["by_minute"].items())
        )
    text = "\n".join(lines) + f"\n\n({time.monotonic() - started:.0f} s of wall time)\n"
    print(text)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "step_trace.md").write_text(text)
        cli.write_json(args.out_dir / "step_trace.json", rows)
        plot(
            args.out_dir / "step_trace.png",
            runs,
            trace,
            f"SIMULATED, profile {args.profile}: planner fleet over the step trace",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
