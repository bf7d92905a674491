"""Cleave against vLLM on the same model and machine, one system at a time.

./bazel run //tools/bench:compare -- --systems vllm,cleave-pd,cleave-1p1d,vllm-pd \
    --workloads short-chat,long-interference,prefix --out-dir /tmp/compare [--guidellm]

Each system is started as child processes on 127.0.0.1 (free ports, own process groups, logs
under DIR/logs/<system>/), waited on until healthy, measured with every workload (same seed:
identical prompts in the same order on every system), then stopped before the next one starts.
Writes DIR/<workload>.json and DIR/<workload>.md (numbers, Cleave-vs-peer ratios, stage times
scraped from Prometheus, the GuideLLM cross-check with --guidellm) and DIR/raw/ (every request).

Exit codes: 0 every system ran every workload, 1 something failed (see the reports), 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from libs.stack.process import Launched, LaunchError, start, wait_ready
from tools.bench import proc_cpu, report
from tools.bench.config import BenchConfig
from tools.bench.runner import WARMUP_SEED_OFFSET, BenchError, run_benchmark
from tools.bench.systems import guidellm, rounds_report, sweep
from tools.bench.systems.catalog import (
    CALIBRATION_SYSTEMS,
    CLEAVE_NIXL_PROGRESS_DELAY_US,
    MOCK_SYSTEMS,
    SYSTEMS,
    VARIANT_SYSTEMS,
    VLLM_NIXL_PROGRESS_DELAY_US,
    PortSource,
    ServingSettings,
    SystemPlan,
    plan_system,
)
from tools.bench.systems.guidellm_run import GuidellmOptions, ensure_guidellm, run_guidellm
from tools.bench.systems.presets import DESCRIPTIONS, WORKLOADS, CompareSizes, bench_config
from tools.bench.systems.rounds import DEFAULT_SLO_PAIRS, SloPair, goodput, parse_slo_pair, round_orders
from tools.bench.systems.scrape import scrape, stage_mean
from tools.bench.systems.sweep import SweepPoint
from tools.bench.systems.tables import SystemOutcome, markdown, workload_json

Planner = Callable[[str, ServingSettings, PortSource], SystemPlan]


@dataclass(frozen=True)
class CompareOptions:
    systems: tuple[str, ...]
    workloads: tuple[str, ...]
    out_dir: Path
    model: str  # as given: 'smollm2' or a folder; resolved to settings.model_path in main()
    settings: ServingSettings
    sizes: CompareSizes
    stop_timeout_s: float = 60.0
    guidellm: GuidellmOptions | None = None
    progress: bool = True
    # Interleaved rounds (systems/rounds.py): every system once per round, order rotated.
    rounds: int = 1
    slo_pairs: tuple[SloPair, ...] = DEFAULT_SLO_PAIRS
    # Rate sweep: each workload run open loop at each of these rates (req/s) instead of its
    # preset arrival; the report plots throughput against latency per system (sweep.py).
    sweep_rates: tuple[float, ...] = ()


def _names(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}"
        )
    return names


def _cores(text: str) -> tuple[int, ...]:
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            cores += range(int(first), int(last or first) + 1)
        except ValueError:
            raise argparse.ArgumentTypeError(f"cores like '0-1' or '0,2,4', got {text!r}") from None
    return tuple(cores)


def _slo_pair(text: str) -> SloPair:
    try:
        return parse_slo_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        rates = ()
    if not rates or not all(0 < r < float("inf") for r in rates):
        raise argparse.ArgumentTypeError(f"rates like '0.5,1,2' (req/s, each > 0), got {text!r}")
    return rates


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compare", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, in run order: {', '.join(SYSTEMS)} (the default), or "
        "'reference' (a server with known latencies, to calibrate the load generators)",
    )
    add("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    add("--out-dir", type=Path, required=True, help="reports, logs and raw results go here")
    serving = parser.add_argument_group("serving (the same for every system)")
    serving.add_argument("--model", default="smollm2", help="'smollm2' (Cleave's model cache) or a HF folder")
    serving.add_argument("--served-model-name", default="smollm2")
    serving.add_argument("--dtype", default="bfloat16")
    serving.add_argument("--max-model-len", type=int, default=2048)
    serving.add_argument("--max-num-seqs", type=int, default=8, help="per engine")
    serving.add_argument(
        "--cores", type=_cores, default=None, help="default: every core this process may use"
    )
    serving.add_argument("--startup-timeout-s", type=float, default=900.0)
    serving.add_argument("--stop-timeout-s", type=float, default=60.0)
    serving.add_argument(
        "--vllm-pd-progress-delay-us",
        type=int,
        default=CLEAVE_NIXL_PROGRESS_DELAY_US,
        help="vllm-pd's NIXL progress-thread poll interval, through Cleave's NixlConnector subclass; "
        f"default {CLEAVE_NIXL_PROGRESS_DELAY_US}, Cleave's workers' --nixl-progress-delay-us; "
        f"{VLLM_NIXL_PROGRESS_DELAY_US} = vLLM's NixlConnector as shipped (NIXL busy-polls a core)",
    )
    add("--rounds", type=int, default=3, help="interleaved rounds, the system order rotated each round")
    add(
        "--slo",
        action="append",
        type=_slo_pair,
        default=None,
        help="goodput objectives TTFT_MS:ITL_P99_MS (repeatable; default "
        + " and ".join(f"{p.ttft_ms:g}:{p.itl_p99_ms:g}" for p in DEFAULT_SLO_PAIRS)
        + ")",
    )
    add(
        "--sweep-rates",
        type=_rates,
        default=(),
        help="comma-separated req/s: run every workload open loop at each rate and plot throughput"
        " against latency for every system",
    )
    sizes = parser.add_argument_group("workload sizes")
    defaults = CompareSizes()
    for name, value in dataclasses.asdict(defaults).items():
        sizes.add_argument(
            f"--{name.replace('_', '-')}", type=type(value), default=value, help=f"default {value}"
        )
    check = parser.add_argument_group("GuideLLM cross-check")
    check.add_argument("--guidellm", action="store_true", help="also run GuideLLM 0.8.1 on every workload")
    check.add_argument("--guidellm-venv", type=Path, default=guidellm.DEFAULT_VENV)
    check.add_argument(
        "--guidellm-find-links",
        action="append",
        default=None,
        help="pip --find-links for the torch CPU wheel (default: /opt/wheels when it exists)",
    )
    check.add_argument("--guidellm-timeout-s", type=float, default=1200.0, help="per GuideLLM run")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def _out_dir(path: Path) -> Path:
    # `bazel run` starts us in the runfiles tree; relative paths mean the caller's directory.
    base = os.environ.get("BUILD_WORKING_DIRECTORY")
    return path if path.is_absolute() or not base else Path(base) / path


def parse_args(argv: Sequence[str]) -> CompareOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        systems = _names(
            args.systems, SYSTEMS + CALIBRATION_SYSTEMS + VARIANT_SYSTEMS + MOCK_SYSTEMS, "system"
        )
        workloads = _names(args.workloads, WORKLOADS, "workload")
        sizes = CompareSizes(**{name: getattr(args, name) for name in dataclasses.asdict(CompareSizes())})
        settings = ServingSettings(
            model_path=Path(args.model),
            served_name=args.served_model_name,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            cores=args.cores or tuple(sorted(os.sched_getaffinity(0))),
            startup_timeout_s=args.startup_timeout_s,
            vllm_pd_progress_delay_us=args.vllm_pd_progress_delay_us or None,
        )
        if args.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
        for name in systems:  # e.g. a disaggregated system on one core
            plan_system(name, settings, itertools.count(1).__next__)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    check = None
    if args.guidellm:
        links = args.guidellm_find_links
        if links is None:
            links = ["/opt/wheels"] if Path("/opt/wheels").is_dir() else []
        check = GuidellmOptions(
            args.guidellm_venv, guidellm.repo_lock_path(), tuple(links), args.guidellm_timeout_s
        )
    return CompareOptions(
        systems=systems,
        workloads=workloads,
        out_dir=_out_dir(args.out_dir),
        model=args.model,
        settings=settings,
        sizes=sizes,
        stop_timeout_s=args.stop_timeout_s,
        guidellm=check,
        progress=not args.no_progress,
        rounds=args.rounds,
        slo_pairs=tuple(args.slo) if args.slo else DEFAULT_SLO_PAIRS,
        sweep_rates=args.sweep_rates,
    )


def warmup_config(config: BenchConfig) -> BenchConfig:
    """The warmup as a run of its own (closed loop, prompts from the runner's warmup stream), so
    the Prometheus scrapes around the measured run see only measured requests."""
    return replace(
        config,
        seed=config.seed + WARMUP_SEED_OFFSET,
        num_requests=config.warmup_requests,
        warmup_requests=0,
        rate=None,
        concurrency=config.concurrency or 1,
        duration_s=None,
    )


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


async def run_workload(
    plan: SystemPlan,
    workload: str,
    options: CompareOptions,
    pids: Sequence[int] = (),
    rate: float | None = None,
) -> SystemOutcome:
    """One measured run of `workload` (at `rate`, open loop, when given: a sweep point). CPU
    time of the system's processes (`pids` and their descendants) is read around it."""
    config = bench_config(workload, options.sizes, plan.base_url, options.settings.served_name)
    if rate is not None:
        config = replace(config, rate=rate, concurrency=None)
    outcome = SystemOutcome(plan.name, plan.description, None, stage_notes=plan.stage_notes)
    try:
        if config.warmup_requests:
            await run_benchmark(warmup_config(config))
        async with httpx.AsyncClient() as client:
            before = await scrape(client, plan.metrics_urls)
            cpu_before = proc_cpu.snapshot(pids)
            result = await run_benchmark(replace(config, warmup_requests=0), progress=options.progress)
            cpu_after = proc_cpu.snapshot(pids)
            after = await scrape(client, plan.metrics_urls)
    except BenchError as exc:
        return replace(outcome, error=f"benchmark failed: {exc}")
    print(report.format_summary(result) + "\n", flush=True)
    suffix = "" if rate is None else f"-rate{rate:g}"
    report.write_json(options.out_dir / "raw" / f"{plan.name}-{workload}{suffix}.json", [result])
    stages = {p.key: stage_mean(before.get(p.source, ""), after.get(p.source, ""), p) for p in plan.probes}
    good = {p.key: goodput(result.records, result.summary.duration_s, p) for p in options.slo_pairs}
    outcome = replace(
        outcome,
        summary=result.summary,
        stages=stages,
        goodput=good,
        cpu_s=proc_cpu.cpu_by_role(cpu_before, cpu_after),
    )
    if options.guidellm is not None:
        check = await run_guidellm(
            options.guidellm,
            plan,
            workload,
            out_dir=options.out_dir,
            sizes=options.sizes,
            served_name=options.settings.served_name,
            model_path=options.settings.model_path,
        )
        outcome = replace(outcome, guidellm=check)
        if check.result is None:
            print(f"compare: GuideLLM on {plan.name}/{workload}: {check.error}", file=sys.stderr, flush=True)
        else:
            for pair in guidellm.cross_check(result.summary, check.result):
                flag = "  <-- differs by more than 10%" if pair.flagged else ""
                print(
                    f"GuideLLM cross-check {plan.name}/{workload} {pair.metric}: tools/bench"
                    f" {_ms(pair.bench_ms)}, GuideLLM {_ms(pair.guidellm_ms)}{flag}",
                    flush=True,
                )
    return outcome


def _meta(options: CompareOptions, plans: dict[str, SystemPlan], startup: dict[str, float]) -> dict[str, Any]:
    settings = dataclasses.asdict(options.settings)
    settings["model_path"] = str(options.settings.model_path)
    return {
        "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": options.model,
        "settings": settings,
        "sizes": dataclasses.asdict(options.sizes),
        "systems": list(options.systems),
        "startup_s": startup,
        "endpoints": {name: plan.base_url for name, plan in plans.items()},
        "processes": {
            name: [{"name": p.name, "argv": list(p.argv), "env": dict(p.env)} for p in plan.processes]
            for name, plan in plans.items()
        },
    }


def write_reports(
    options: CompareOptions, results: dict[str, list[SystemOutcome]], meta: dict[str, Any]
) -> list[Path]:
    written = []
    options.out_dir.mkdir(parents=True, exist_ok=True)
    for workload, outcomes in results.items():
        config = bench_config(workload, options.sizes, "http://system", options.settings.served_name)
        json_path = options.out_dir / f"{workload}.json"
        json_path.write_text(json.dumps(workload_json(workload, config, outcomes, meta), indent=2) + "\n")
        md_path = options.out_dir / f"{workload}.md"
        note = rounds_report.nixl_note(options.settings)
        md_path.write_text(markdown(workload, DESCRIPTIONS[workload], config, outcomes) + f"\n{note}\n")
        written += [json_path, md_path]
    return written


async def run_comparison(
    options: CompareOptions, planner: Planner = plan_system, ports: PortSource | None = None
) -> dict[str, list[SystemOutcome]]:
    """Every system in turn, every workload on each, in `options.rounds` interleaved rounds (the
    order rotated each round; systems/rounds.py). One round writes its reports into the output
    folder as before; several write each round's under round-N/ and the medians and spreads
    over all rounds as <workload>.rounds.md/json. Returns every outcome of every round."""
    if ports is None:
        from libs.rpc.ports import free_port

        ports = free_port
    for name in options.systems:  # settings a system cannot run with fail now, not 20 minutes in
        planner(name, options.settings, itertools.count(1).__next__)
    if options.guidellm is not None:
        ensure_guidellm(options.guidellm, options.out_dir / "logs" / "guidellm-install.log")
    orders = round_orders(options.systems, options.rounds)
    rounds: dict[str, list[list[SystemOutcome]]] = {w: [] for w in options.workloads}
    swept: list[SweepPoint] = []
    for index, order in enumerate(orders):
        folder = options.out_dir if options.rounds == 1 else options.out_dir / f"round-{index + 1}"
        this_round = replace(options, out_dir=folder)
        if options.rounds > 1:
            print(
                f"compare: round {index + 1}/{options.rounds}: {', '.join(order)}",
                file=sys.stderr,
                flush=True,
            )
        results = await _run_round(this_round, order, planner, ports, index, swept)
        for workload in options.workloads:
            # The systems' own order, whatever the round's, so every round's tables read alike.
            rounds[workload].append(sorted(results[workload], key=lambda o: options.systems.index(o.system)))
    if not options.sweep_rates:  # goodput and CPU per token: in every report, one round too
        notes = [rounds_report.nixl_note(options.settings)]
        rounds_report.write(options.out_dir, rounds, orders, options.slo_pairs, notes)
    if options.sweep_rates:
        labels = {p.key: p.label for p in options.slo_pairs}
        sweep.write(swept, options.workloads, options.out_dir, labels)
        return {
            w: [
                SystemOutcome(p.system, "", p.summary, error=None if p.summary else "failed")
                for p in swept
                if p.workload == w
            ]
            for w in options.workloads
        }
    return {w: [o for outcomes in rounds[w] for o in outcomes] for w in options.workloads}


async def _run_round(
    options: CompareOptions,
    order: Sequence[str],
    planner: Planner,
    ports: PortSource,
    index: int,
    swept: list[SweepPoint],
) -> dict[str, list[SystemOutcome]]:
    """One round: each system started, measured on every workload (or every sweep rate), stopped."""
    results: dict[str, list[SystemOutcome]] = {w: [] for w in options.workloads}
    plans: dict[str, SystemPlan] = {}
    startup: dict[str, float] = {}
    for name in order:
        plan = planner(name, options.settings, ports)
        plans[name] = plan
        launched = Launched()
        print(f"compare: starting {name}: {plan.description}", file=sys.stderr, flush=True)
        try:
            for spec in plan.processes:
                launched.processes.append(start(spec, options.out_dir / "logs" / name))
            startup[name] = await wait_ready(launched.processes, options.settings.startup_timeout_s)
            print(
                f"compare: {name} ready after {startup[name]:.0f}s at {plan.base_url}",
                file=sys.stderr,
                flush=True,
            )
            pids = [p.pid for p in launched.processes]
            for workload in options.workloads:
                for rate in options.sweep_rates:
                    point = await run_workload(plan, workload, options, pids, rate)
                    swept.append(SweepPoint(workload, name, rate, index, point.summary, point.goodput))
                if not options.sweep_rates:
                    results[workload].append(await run_workload(plan, workload, options, pids))
        except LaunchError as exc:
            print(f"compare: {name} failed to start: {exc}", file=sys.stderr, flush=True)
            for workload in options.workloads:
                if len(results[workload]) < len(plans):
                    results[workload].append(SystemOutcome(name, plan.description, None, error=str(exc)))
            for workload in options.workloads:
                swept.extend(SweepPoint(workload, name, r, index, None, {}) for r in options.sweep_rates)
        finally:
            print(f"compare: stopping {name}", file=sys.stderr, flush=True)
            launched.stop(options.stop_timeout_s)
        if not options.sweep_rates:
            write_reports(options, results, _meta(options, plans, startup))
    return results


def _resolve_model(options: CompareOptions) -> CompareOptions:
    if options.settings.model_path.is_dir():
        return replace(
            options, settings=replace(options.settings, model_path=options.settings.model_path.resolve())
        )
    from libs.models.resolve import resolve_model  # torch + transformers: only when needed

    resolved = resolve_model(options.model, Path.home() / ".cache" / "cleave" / "models", progress=True)
    return replace(options, settings=replace(options.settings, model_path=resolved.path))


def main(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    try:
        options = _resolve_model(options)
        results = asyncio.run(run_comparison(options))
    except KeyboardInterrupt:
        print("compare: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 1
    suffix = ".sweep.md" if options.sweep_rates else ".rounds.md"
    for workload in options.workloads:
        print((options.out_dir / f"{workload}{suffix}").read_text())
    print(f"compare: reports in {options.out_dir}", file=sys.stderr)
    complete = all(
        o.summary is not None and o.summary.completed > 0 for runs in results.values() for o in runs
    )
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
