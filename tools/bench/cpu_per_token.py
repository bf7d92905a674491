"""CPU per generated token of each process of each serving system, interleaved rounds.

./bazel run //tools/bench:cpu_per_token -- --systems vllm,cleave-pd --concurrency 4,16 \
    --rounds 3 --out-dir /tmp/cpu-per-token

Each round starts every system in turn (the order rotates from round to round), warms it up,
reads its processes' idle CPU for a few seconds, then runs the short-chat workload once per
concurrency and reads every process's CPU time from /proc before and after each run
(tools/bench/proc_cpu.py). Reported per system and concurrency: median (min-max over rounds) of
ms of CPU per generated token for each role (gateway, tokenizer, worker, engine; vLLM's
api-server, engine), the serving layer (all but the engine), and per round the serving layer of
each Cleave system ÷ vLLM's api-server of the same round. CPU-seconds are the steadier figure on
a shared machine: throughput and latency move with whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from libs.stack.process import Launched, start, wait_ready
from tools.bench import proc_cpu
from tools.bench.compare import _cores, _names, _out_dir, _resolve_model, warmup_config
from tools.bench.runner import run_benchmark
from tools.bench.systems.catalog import MOCK_SYSTEMS, SYSTEMS, VARIANT_SYSTEMS, ServingSettings, plan_system
from tools.bench.systems.presets import CompareSizes, bench_config

WORKLOAD = "short-chat"
ROLE_ORDER = (
    proc_cpu.GATEWAY,
    proc_cpu.TOKENIZER,
    proc_cpu.WORKER,
    proc_cpu.KVSTORE,
    proc_cpu.API_SERVER,
    proc_cpu.PROXY,
    proc_cpu.OTHER,
    proc_cpu.ENGINE,
)
SERVING = "serving layer"


@dataclass(frozen=True)
class Measurement:
    round: int
    system: str
    concurrency: int
    tokens: int
    duration_s: float
    cpu_s: dict[str, float]  # role -> CPU seconds over the run
    idle_cpu_per_s: dict[str, float]  # role -> CPU seconds per second while idle

    def ms_per_token(self) -> dict[str, float]:
        per = {name: 1000.0 * s / max(self.tokens, 1) for name, s in self.cpu_s.items()}
        per[SERVING] = 1000.0 * proc_cpu.serving_layer(self.cpu_s) / max(self.tokens, 1)
        return per

    def serving_work_ms_per_token(self) -> float:
        """The serving layer's CPU per token less what it spends idle over as long (polls,
        keepalives): the per-token work alone, which does not grow when a loaded machine
        makes the run slower."""
        idle = proc_cpu.serving_layer(self.idle_cpu_per_s) * self.duration_s
        return 1000.0 * max(proc_cpu.serving_layer(self.cpu_s) - idle, 0.0) / max(self.tokens, 1)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cpu_per_token", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--systems",
        default="vllm,cleave-pd",
        help=f"comma-separated: {', '.join(SYSTEMS + VARIANT_SYSTEMS + MOCK_SYSTEMS)}",
    )
    parser.add_argument("--concurrency", default="4,16", help="comma-separated closed-loop concurrencies")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40, help="per run")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle CPU read over this long")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--cores", type=_cores, default=None)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument(
        "--label", default="", help="appended to each system's name, e.g. 'before' (A/B of two builds)"
    )
    parser.add_argument("--first-round", type=int, default=1, help="number of the first round")
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        help="write the report of these cpu_per_token.json files (runs of this tool) and exit",
    )
    args = parser.parse_args(argv)
    args.systems = _names(args.systems, SYSTEMS + VARIANT_SYSTEMS + MOCK_SYSTEMS, "system")
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.out_dir = _out_dir(args.out_dir)
    return args


async def measure_system(
    name: str, settings: ServingSettings, sizes: CompareSizes, args: argparse.Namespace, round_: int
) -> list[Measurement]:
    from libs.rpc.ports import free_port

    plan = plan_system(name, settings, free_port)
    launched = Launched()
    results = []
    try:
        for spec in plan.processes:
            launched.processes.append(start(spec, args.out_dir / "logs" / f"{name}-round{round_}"))
        await wait_ready(launched.processes, settings.startup_timeout_s)
        roots = [p.process.pid for p in launched.processes]
        base = bench_config(WORKLOAD, sizes, plan.base_url, settings.served_name)
        await run_benchmark(warmup_config(base))
        before = proc_cpu.snapshot(roots)
        idle_started = time.perf_counter()
        await asyncio.sleep(args.idle_s)
        idle = proc_cpu.cpu_by_role(before, proc_cpu.snapshot(roots))
        idle_rate = {k: v / (time.perf_counter() - idle_started) for k, v in idle.items()}
        for concurrency in args.concurrency:
            config = replace(base, concurrency=concurrency, warmup_requests=0)
            before = proc_cpu.snapshot(roots)
            result = await run_benchmark(config, progress=False)
            spent = proc_cpu.cpu_by_role(before, proc_cpu.snapshot(roots))
            summary = result.summary
            measurement = Measurement(
                round_, name, concurrency, summary.output_tokens, summary.duration_s, spent, idle_rate
            )
            results.append(measurement)
            per = measurement.ms_per_token()
            shown = ", ".join(f"{k} {per[k]:.3f}" for k in (*ROLE_ORDER, SERVING) if k in per)
            print(
                f"cpu_per_token: round {round_} {name} c={concurrency}: {summary.output_tokens} tokens,"
                f" {summary.output_throughput:.1f} tok/s; ms/token: {shown}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        launched.stop(60.0)
    return results


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def markdown(measurements: Sequence[Measurement], concurrencies: Sequence[int]) -> str:
    lines = [
        "ms of CPU per generated token: median (min–max) over rounds",
        "",
        "| system | concurrency | rounds | tok/s | "
        + " | ".join(r for r in ROLE_ORDER if _seen(measurements, r))
        + f" | {SERVING} | ÷ vllm api-server (same round) | {SERVING}, idle subtracted | ÷ vllm |",
        "|---" * (8 + sum(_seen(measurements, r) for r in ROLE_ORDER)) + "|",
    ]
    systems = list(dict.fromkeys(m.system for m in measurements))
    for system in systems:
        for concurrency in concurrencies:
            runs = [m for m in measurements if m.system == system and m.concurrency == concurrency]
            if not runs:
                continue
            rates = [m.tokens / m.duration_s for m in runs if m.duration_s > 0]
            cells = [
                _spread([m.ms_per_token().get(r, 0.0) for m in runs])
                for r in ROLE_ORDER
                if _seen(measurements, r)
            ]
            ratios, work_ratios = [], []
            for m in runs:
                # vLLM of the same round and build (`--label`: "vllm (before)" for "... (before)").
                label = _label(m.system)
                peer = [
                    p
                    for p in measurements
                    if p.system == f"vllm{label}" and p.round == m.round and p.concurrency == concurrency
                ]
                if m.system != f"vllm{label}" and peer:
                    ratios.append(m.ms_per_token()[SERVING] / peer[0].ms_per_token()[SERVING])
                    work_ratios.append(m.serving_work_ms_per_token() / peer[0].serving_work_ms_per_token())
            lines.append(
                f"| {system} | {concurrency} | {len(runs)} | {statistics.median(rates):.1f} | "
                + " | ".join(cells)
                + f" | {_spread([m.ms_per_token()[SERVING] for m in runs])} | {_spread(ratios)}"
                + f" | {_spread([m.serving_work_ms_per_token() for m in runs])} | {_spread(work_ratios)} |"
            )
    lines += ["", "Idle CPU (ms per second, median over rounds):", ""]
    for system in systems:
        runs = [m for m in measurements if m.system == system and m.concurrency == concurrencies[0]]
        roles = sorted({r for m in runs for r in m.idle_cpu_per_s})
        shown = ", ".join(
            f"{r} {statistics.median(1000 * m.idle_cpu_per_s.get(r, 0.0) for m in runs):.1f}" for r in roles
        )
        lines.append(f"- {system}: {shown}")
    return "\n".join(lines) + "\n"


def _label(system: str) -> str:
    """The " (label)" suffix --label appended to a system's name, or ""."""
    return system[system.index(" (") :] if " (" in system else ""


def _seen(measurements: Sequence[Measurement], role: str) -> bool:
    return any(role in m.cpu_s for m in measurements)


async def run(args: argparse.Namespace, settings: ServingSettings) -> list[Measurement]:
    sizes = CompareSizes(short_requests=args.requests, output_len=args.output_len)
    measurements: list[Measurement] = []
    for round_ in range(args.first_round, args.first_round + args.rounds):
        shift = (round_ - 1) % len(args.systems)
        for name in args.systems[shift:] + args.systems[:shift]:
            measured = await measure_system(name, settings, sizes, args, round_)
            if args.label:
                measured = [replace(m, system=f"{m.system} ({args.label})") for m in measured]
            measurements += measured
            _write(args, measurements)
    return measurements


def _write(args: argparse.Namespace, measurements: Sequence[Measurement]) -> None:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [dict(vars(m)) for m in measurements]
    (args.out_dir / "cpu_per_token.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out_dir / "cpu_per_token.md").write_text(markdown(measurements, args.concurrency))


def load(paths: Sequence[Path]) -> list[Measurement]:
    return [Measurement(**row) for path in paths for row in json.loads(path.read_text())]


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.render:
        measurements = load(args.render)
        concurrencies = sorted({m.concurrency for m in measurements})
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "cpu_per_token.md").write_text(markdown(measurements, concurrencies))
        print(markdown(measurements, concurrencies))
        return 0
    settings = ServingSettings(
        model_path=Path(args.model),
        max_num_seqs=args.max_num_seqs,
        cores=args.cores or tuple(sorted(os.sched_getaffinity(0))),
    )
    from tools.bench.compare import CompareOptions

    options = _resolve_model(
        CompareOptions((), (), args.out_dir, args.model, settings, CompareSizes(), progress=False)
    )
    measurements = asyncio.run(run(args, options.settings))
    print(markdown(measurements, args.concurrency))
    print(f"cpu_per_token: results in {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
