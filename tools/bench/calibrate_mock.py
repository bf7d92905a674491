"""Calibrate the mock engine's step-time profile on this machine: time the real engine over a
grid of batch sizes, contexts and prefill lengths, and fit the mock's formula to it.

./bazel run //tools/bench:calibrate_mock -- --cores 1,2 --out-dir /tmp/calibration \
    [--write-profile libs/mockengine/profiles/cpu-smollm2.json] [--method served|offline]

--method served (the default) times the steps through the real serving stack and also fits the
KV handoff (tools/bench/calibrate_served.py says how and why). --method offline, below:
for each core count N, a child process runs the Cleave worker's own engine (vLLM with the
worker's engine arguments and environment for a device group of N cores, the process pinned to
them as services/worker does) and times, with fresh random prompts (no prefix-cache hits):

- decode steps: B prompts of C tokens, (time of B x (T+1) tokens - time of B x 1 token) / T is
  one step of B sequences whose context averages C + T/2;
- prefill steps: one prompt of L tokens and one output token (one step when L fits
  max_num_batched_tokens), the time of the whole generate call.

Each point is the median of --repeats timings. The five coefficients of the formula in
libs/mockengine/timing.py are fitted by least squares on those points (a coefficient the fit
makes negative is fixed at 0 and the rest fitted again), per core count; the report gives each
point's measured and predicted time. With --write-profile the profile file's
`coefficients_by_cores` (and `coefficients`, from the most cores measured) are replaced and its
`calibration` records the date, the CPU and its flags, and the residuals. The machine must be
quiet: a busy core stretches every step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FEATURES = ("base_s", "per_seq_s", "per_prefill_token_s", "per_context_token_s", "per_prefill_attention_s")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="calibrate_mock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--cores", default="1,2", help="comma-separated core counts to calibrate")
    parser.add_argument("--batches", default="1,2,4,8,16", help="decode batch sizes")
    parser.add_argument("--contexts", default="64,512,1536", help="decode contexts (prompt tokens)")
    parser.add_argument("--prefills", default="32,128,512,1024,2000", help="prefill lengths")
    parser.add_argument("--decode-tokens", type=int, default=24, help="decode steps timed per point")
    parser.add_argument("--repeats", type=int, default=3, help="timings per point (median)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--write-profile", type=Path, help="a profile JSON whose coefficients to replace")
    parser.add_argument(
        "--method", choices=("served", "offline"), default="served", help="served stacks or the engine alone"
    )
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # child: cores to measure on
    return parser.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def measure(args: argparse.Namespace, cores: int) -> dict[str, Any]:
    """In a child process: the engine on `cores` cores, timed over the grid."""
    from libs.config.flags import parse
    from libs.models.resolve import resolve_model
    from libs.worker.config import WorkerConfig
    from libs.worker.engine_args import engine_environment, engine_kwargs

    usable = sorted(os.sched_getaffinity(0))
    group = usable[-cores:]
    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True).path
    flags = ["--model", str(model), "--role", "both", "--device-group", ",".join(map(str, group))]
    config = parse(WorkerConfig, flags)
    os.sched_setaffinity(0, set(group))
    os.environ.update(engine_environment(config, set(group)))
    kwargs = engine_kwargs(config)
    kwargs["disable_log_stats"] = True

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**kwargs)
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    rng = random.Random(cores)

    def prompts(count: int, length: int) -> list[TokensPrompt]:
        return [
            TokensPrompt(prompt_token_ids=[rng.randrange(100, 49000) for _ in range(length)])
            for _ in range(count)
        ]

    def timed(count: int, length: int, tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, detokenize=False)
        batch = prompts(count, length)
        started = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        assert all(len(o.outputs[0].token_ids) == tokens for o in outputs)
        return elapsed

    timed(2, 64, 8)  # warm-up
    points: list[dict[str, Any]] = []
    steps = args.decode_tokens
    for context in _ints(args.contexts):
        for batch in _ints(args.batches):
            samples = [
                (timed(batch, context, steps + 1) - timed(batch, context, 1)) / steps
                for _ in range(args.repeats)
            ]
            points.append(
                {
                    "kind": "decode",
                    "batch": batch,
                    "context": context,
                    "seconds": statistics.median(samples),
                    "samples": samples,
                    "shape": [1, batch, 0, batch * (context + steps / 2), 0.0],
                }
            )
            print(
                f"cores {cores}: decode batch {batch} context {context}: {points[-1]['seconds'] * 1e3:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    for length in _ints(args.prefills):
        if length > budget:
            continue  # several chunks: not one step
        samples = [timed(1, length, 1) for _ in range(args.repeats)]
        points.append(
            {
                "kind": "prefill",
                "length": length,
                "seconds": statistics.median(samples),
                "samples": samples,
                "shape": [1, 1, length, 0, length * length / 2],
            }
        )
        print(
            f"cores {cores}: prefill {length}: {points[-1]['seconds'] * 1e3:.1f} ms",
            file=sys.stderr,
            flush=True,
        )
    return {"cores": cores, "device_group": group, "max_num_batched_tokens": budget, "points": points}


def fit(points: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares with every coefficient >= 0: a negative one is fixed at 0, then refit."""
    import numpy as np

    rows = np.array([p["shape"] for p in points], dtype=float)
    seconds = np.array([p["seconds"] for p in points], dtype=float)
    active = list(range(len(FEATURES)))
    while True:
        solution, *_ = np.linalg.lstsq(rows[:, active], seconds, rcond=None)
        negative = [active[i] for i, value in enumerate(solution) if value < 0]
        if not negative:
            break
        active = [i for i in active if i not in negative]
    coefficients = dict.fromkeys(FEATURES, 0.0)
    for index, value in zip(active, solution, strict=True):
        coefficients[FEATURES[index]] = float(value)
    return coefficients


def predicted(coefficients: dict[str, float], shape: Sequence[float]) -> float:
    return sum(coefficients[name] * value for name, value in zip(FEATURES, shape, strict=True))


def cpu_facts() -> dict[str, Any]:
    model, flags = "unknown", list[str]()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "unknown":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
    return {
        "model": model,
        "flags": [f for f in wanted if f in flags],
        "cores": os.cpu_count(),
        "kernel": platform.release(),
    }


def report(results: list[dict[str, Any]], cpu: dict[str, Any]) -> str:
    lines = [f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}), {cpu['cores']} cores", ""]
    for result in results:
        c = result["coefficients"]
        lines += [
            f"## {result['cores']} core(s) (device group {result['device_group']})",
            "",
            "coefficients: " + ", ".join(f"{name} {value * 1e3:.4f} ms" for name, value in c.items()),
            "",
            "| point | measured ms | predicted ms | error |",
            "|---|---|---|---|",
        ]
        for point in result["points"]:
            label = (
                f"decode batch {point['batch']} context {point['context']}"
                if point["kind"] == "decode"
                else f"prefill {point['length']} tokens"
            )
            guess = predicted(c, point["shape"])
            lines.append(
                f"| {label} | {point['seconds'] * 1e3:.2f} | {guess * 1e3:.2f} | {(guess / point['seconds'] - 1) * 100:+.0f}% |"
            )
        lines.append("")
    return "\n".join(lines)


def with_coefficients(data: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    by_cores = {str(r["cores"]): {**r["coefficients"], "calibrated": True} for r in results}
    return {
        **data,
        "coefficients_by_cores": by_cores,
        "coefficients": by_cores[str(max(r["cores"] for r in results))],
    }


def write_profile(
    path: Path, results: list[dict[str, Any]], cpu: dict[str, Any], handoff: dict[str, Any] | None = None
) -> None:
    data = with_coefficients(json.loads(path.read_text()), results)
    worst = {
        str(r["cores"]): max(
            abs(predicted(r["coefficients"], p["shape"]) / p["seconds"] - 1) for p in r["points"]
        )
        for r in results
    }
    data["calibration"] = [
        f"Calibrated {datetime.now(UTC):%Y-%m-%d} by tools/bench/calibrate_mock.py on {cpu['model']}"
        f" (flags: {', '.join(cpu['flags'])}; {cpu['cores']} cores; kernel {cpu['kernel']}).",
        METHOD_TEXT[results[0].get("method", "offline")],
        "Largest relative error of a fitted point, by cores: "
        + ", ".join(f"{cores}: {error * 100:.0f}%" for cores, error in worst.items()),
    ]
    if handoff is not None:
        data["kv_transfer"] = handoff["transfer"]
        data["calibration"].append(
            "kv_transfer: fitted to the 1p1d stack's TTFT less a mock 1p1d's with the fitted steps and an"
            " instant transfer, at each prefill length: "
            + ", ".join(f"{p['length']} tokens {p['seconds'] * 1e3:.1f} ms" for p in handoff["points"])
        )
    path.write_text(json.dumps(data, indent=2) + "\n")


METHOD_TEXT = {
    "offline": "Each core count: the worker's own engine (vLLM, its engine arguments, pinned to the device group),"
    " decode steps over batches x contexts and one-step prefills, medians of repeated timings;"
    " coefficients fitted by non-negative least squares.",
    "served": "Each core count: a pd stack (gateway, tokenizer, worker) with the worker on that many cores;"
    " decode steps are the median inter-token gap of B streams decoding together, prefill steps the median"
    " TTFT less the TTFT of the same stack on the zero profile (tools/bench/calibrate_served.py);"
    " coefficients fitted by non-negative least squares.",
}


def served(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Steps per core count, then the handoff, through the real serving stacks."""
    from libs.mockengine.profiles import PROFILES_DIR
    from libs.models.resolve import resolve_model
    from tools.bench.calibrate_served import Grid, measure_handoff, measure_served
    from tools.bench.systems.catalog import ServingSettings

    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True)
    settings = ServingSettings(model_path=model.path, cores=tuple(sorted(os.sched_getaffinity(0))))
    grid = Grid(
        batches=tuple(b for b in _ints(args.batches) if b <= settings.max_num_seqs),
        contexts=tuple(_ints(args.contexts)),
        prefills=tuple(n for n in _ints(args.prefills) if n + 2 <= settings.max_model_len),
        repeats=args.repeats,
    )
    results = []
    for cores in _ints(args.cores):
        result = measure_served(cores, settings, grid, args.out_dir / "logs")
        result["coefficients"] = fit(result["points"])
        results.append(result)
    base = json.loads((args.write_profile or PROFILES_DIR / "cpu-smollm2.json").read_text())
    model_facts = base["model"]
    per_token = (
        2 * model_facts["num_layers"] * model_facts["num_kv_heads"] * model_facts["head_dim"]
        * model_facts["kv_bytes_per_element"]
    )  # fmt: skip
    handoff = measure_handoff(
        settings, grid, with_coefficients(base, results), per_token, args.out_dir / "logs"
    )
    return results, handoff


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.measure is not None:
        result = measure(args, args.measure)
        (args.out_dir / f"points-{args.measure}.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    results: list[dict[str, Any]] = []
    handoff: dict[str, Any] | None = None
    if args.method == "served":
        results, handoff = served(args)
    for cores in _ints(args.cores) if args.method == "offline" else ():
        child = [sys.executable, "-m", "tools.bench.calibrate_mock", *argv, "--measure", str(cores)]
        subprocess.run(child, check=True)
        result = json.loads((args.out_dir / f"points-{cores}.json").read_text())
        result["coefficients"] = fit(result["points"])
        results.append(result)
    cpu = cpu_facts()
    (args.out_dir / "calibration.json").write_text(
        json.dumps({"cpu": cpu, "results": results, "handoff": handoff}, indent=2) + "\n"
    )
    text = report(results, cpu)
    if handoff is not None:
        text += "\n## KV handoff (1p1d)\n\n" + json.dumps(handoff, indent=2) + "\n"
    (args.out_dir / "calibration.md").write_text(text)
    print(text)
    if args.write_profile is not None:
        write_profile(args.write_profile, results, cpu, handoff)
        print(f"wrote the coefficients into {args.write_profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
