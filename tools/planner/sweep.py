"""Simulated sweeps (every figure SIMULATED, on the mock engine's scheduler with a profile):

  fixed    every fixed allocation in a grid at one rate: which meet the objectives, the best
           (fewest workers), and the planning mode's recommendation beside it;
  capacity each role's requests/s per worker: the capacity model beside the simulation;
  goodput  DistServe's goodput (the highest rate per worker at which >= attainment of the
           requests meet both objectives) of the planning mode's disaggregated fleet and of an
           all-pd fleet of the same worker count, for each ITL objective given.

./bazel run //tools/planner:sweep -- fixed --rate 24 --max-prefill 5 --max-decode 3 --max-colocated 6
./bazel run //tools/planner:sweep -- goodput --rate 24 --itl-ms-list 15,25,40 [--itl-stat p99]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from libs.planner.capacity import Engine, Shape, capacity
from libs.planner.recommend import recommend, trial
from libs.planner.sim.run import SimOptions, simulate
from libs.planner.slo import Slo, attainment
from libs.planner.state import Counts
from libs.planner.workload import Workload
from tools.planner import cli


def options(args: argparse.Namespace) -> SimOptions:
    return SimOptions(
        args.profile,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        seed=args.seed,
        engine=cli.engine_overrides(args),
    )


def goodput(fleet: Counts, workload: Workload, slo: Slo, sim: SimOptions, high: float, steps: int) -> float:
    """The highest rate (req/s, whole fleet) meeting the objectives, by bisection in (0, high]."""
    low = 0.0
    for _ in range(steps):
        rate = (low + high) / 2
        result = simulate(fleet, workload.at_rate(rate), sim)
        if attainment(result.outcomes, slo) >= slo.attainment:
            low = rate
        else:
            high = rate
    return low


def fixed(args: argparse.Namespace) -> dict[str, Any]:
    slo, workload, sim = cli.slo_of(args), cli.workload_of(args), options(args)
    fleets = [Counts(p, d) for p in range(1, args.max_prefill + 1) for d in range(1, args.max_decode + 1)]
    fleets += [Counts(colocated=c) for c in range(1, args.max_colocated + 1)]
    trials = [trial(f, lambda fl: simulate(fl, workload, sim), slo, args.duration_s) for f in fleets]
    meeting = [t for t in trials if t.meets(slo)]
    best = min(meeting, key=lambda t: (t.fleet.total, -t.attainment), default=None)
    best_disagg = min(
        (t for t in meeting if t.fleet.disaggregated),
        key=lambda t: (t.fleet.total, -t.attainment),
        default=None,
    )
    best_coloc = min(
        (t for t in meeting if not t.fleet.disaggregated), key=lambda t: t.fleet.total, default=None
    )
    rec = recommend(
        workload,
        args.profile,
        slo,
        cores=args.cores,
        duration_s=args.duration_s,
        seed=args.seed,
        engine_overrides=cli.engine_overrides(args),
    )
    lines = [
        f"# Fixed allocations at {args.rate:g} req/s",
        "",
        cli.conditions(args),
        "",
        "| fleet | workers | attainment | TTFT met | ITL met |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t.fleet.name} | {t.fleet.total} | {t.attainment:.3f} | {t.ttft_attainment:.3f} | {t.itl_attainment:.3f} |"
        for t in trials
    ]

    def name(t: Any) -> str:
        return "none meets" if t is None else t.fleet.name

    within = None
    if best_disagg is not None:
        within = (
            abs(rec.disaggregated.prefill - best_disagg.fleet.prefill) <= 1
            and abs(rec.disaggregated.decode - best_disagg.fleet.decode) <= 1
        )
    lines += [
        "",
        f"- best fixed allocation (fewest workers): **{name(best)}**; best disaggregated: {name(best_disagg)};"
        f" best colocated: {name(best_coloc)}",
        f"- planning mode: model {rec.model_disaggregated.name} / {rec.model_colocated.name}, checked"
        f" {rec.disaggregated.name} / {rec.colocated.name}, **choice {rec.choice.name}**",
        f"- planning mode's disaggregated fleet within one worker per role of the sweep's best: {within}",
        f"- planning mode's choice is the sweep's best: {best is not None and rec.choice == best.fleet}",
    ]
    return {
        "markdown": "\n".join(lines),
        "trials": [t.__dict__ for t in trials],
        "best": name(best),
        "recommendation": rec.choice.name,
        "recommended_disaggregated": rec.disaggregated.name,
    }


def goodputs(args: argparse.Namespace) -> dict[str, Any]:
    workload, sim = cli.workload_of(args), options(args)
    rows = []
    for itl_ms in args.itl_ms_list:
        slo = replace(cli.slo_of(args), itl_s=itl_ms / 1000.0)
        started = time.monotonic()
        rec = recommend(
            workload,
            args.profile,
            slo,
            cores=args.cores,
            duration_s=args.duration_s,
            seed=args.seed,
            engine_overrides=cli.engine_overrides(args),
        )
        disagg = rec.disaggregated
        colocated = Counts(colocated=disagg.total)
        high = args.rate * 3
        g_disagg = goodput(disagg, workload, slo, sim, high, args.steps)
        g_coloc = goodput(colocated, workload, slo, sim, high, args.steps)
        n = disagg.total
        rows.append(
            {
                "itl_ms": itl_ms,
                "fleet": disagg.name,
                "workers": n,
                "choice": rec.choice.name,
                "goodput_disaggregated_per_worker": g_disagg / n,
                "goodput_colocated_per_worker": g_coloc / n,
                "ratio": (g_disagg / g_coloc) if g_coloc > 0 else float("inf"),
                "threshold": rec.local_prefill_max_tokens,
                "wall_s": time.monotonic() - started,
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        f"# Goodput per worker: the planning mode's XpYd vs Npd of the same size (sized at {args.rate:g} req/s)",
        "",
        cli.conditions(args).replace(f"objectives: {cli.slo_of(args).describe()}", "objectives: below"),
        "",
        "| ITL objective (ms) | planner's disaggregated fleet | its goodput / worker | Npd goodput / worker | ratio | planner's choice |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['itl_ms']:g} | {r['fleet']} | {r['goodput_disaggregated_per_worker']:.2f} |"
        f" {r['goodput_colocated_per_worker']:.2f} | **{r['ratio']:.2f}** | {r['choice']} |"
        for r in rows
    ]
    lines += [
        "",
        f"TTFT objective {args.ttft_ms:g} ms, ITL per request by its {args.itl_stat}, "
        f"attainment {args.attainment:.0%}; bisection {args.steps} steps in (0, {args.rate * 3:g}] req/s, "
        f"{args.duration_s:g} simulated s per run ({args.warmup_s:g} s warm-up).",
    ]
    return {"markdown": "\n".join(lines), "rows": rows}


def capacities(args: argparse.Namespace) -> dict[str, Any]:
    """Each role's requests/s per worker within the objectives: the capacity model beside the
    simulation (one worker of the role, the other role over-provisioned so it never limits)."""
    slo, sim = cli.slo_of(args), options(args)
    engine = Engine.from_profile(args.profile, args.cores, **cli.engine_overrides(args))
    model = capacity(engine, Shape.of(args.isl, args.osl), slo)
    spare = args.spare
    fleets = {
        "prefill": (Counts(prefill=1, decode=spare), model.prefill),
        "decode": (Counts(prefill=spare, decode=1), model.decode),
        "colocated": (Counts(colocated=1), model.colocated),
    }
    rows = []
    for role, (fleet, predicted) in fleets.items():
        measured = goodput(fleet, cli.workload_of(args), slo, sim, max(predicted, 0.1) * 2.5, args.steps)
        rows.append(
            {
                "role": role,
                "fleet": fleet.name,
                "model": predicted,
                "simulated": measured,
                "model_over_simulated": predicted / measured if measured else float("inf"),
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        "# Capacity per worker: the model vs the simulation",
        "",
        cli.conditions(args),
        "",
        "| role | simulated as | model (req/s) | simulation (req/s) | model / simulation |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['role']} | {r['fleet']} | {r['model']:.2f} | {r['simulated']:.2f} | {r['model_over_simulated']:.2f} |"
        for r in rows
    ]
    return {"markdown": "\n".join(lines), "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fixed", "goodput", "capacity"):
        command = sub.add_parser(name)
        cli.add_workload(command)
        cli.add_objectives(command)
        command.add_argument("--duration-s", type=float, default=90.0)
        command.add_argument("--warmup-s", type=float, default=15.0)
        command.add_argument("--json", type=Path, default=None)
        command.add_argument("--markdown", type=Path, default=None)
    fixed_cmd = sub.choices["fixed"]
    fixed_cmd.add_argument("--max-prefill", type=int, default=4)
    fixed_cmd.add_argument("--max-decode", type=int, default=3)
    fixed_cmd.add_argument("--max-colocated", type=int, default=6)
    good = sub.choices["goodput"]
    good.add_argument("--itl-ms-list", type=lambda t: [float(x) for x in t.split(",")], default=[40.0])
    good.add_argument("--steps", type=int, default=7, help="bisection steps")
    cap = sub.choices["capacity"]
    cap.add_argument("--steps", type=int, default=7, help="bisection steps")
    cap.add_argument("--spare", type=int, default=6, help="workers of the other role, so it never limits")
    args = parser.parse_args(argv)
    started = time.monotonic()
    commands = {"fixed": fixed, "goodput": goodputs, "capacity": capacities}
    result = commands[args.command](args)
    text = result["markdown"] + f"\n\n({time.monotonic() - started:.0f} s of wall time)\n"
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    cli.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
