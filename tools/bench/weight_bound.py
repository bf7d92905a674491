"""Decode at batch 1 on one core against the weight-streaming bound (issue 17's last check).

./bazel run //tools/bench:weight_bound -- --core 1 --out-dir /tmp/weight-bound

At batch 1 every decode step reads all of the model's weights once, so a core cannot decode
faster than (its memory bandwidth) ÷ (the model's bytes). This tool, pinned to one core
(`os.sched_setaffinity`, as `taskset` does) with every library on one thread:

1. measures that core's read bandwidth on a buffer far larger than the caches (default
   2 GiB; the L3 is printed from sysfs) and on one of the model's own size, several ways
   (numpy max, sum and BLAS dot of float32, torch sum of bf16, numpy copy counted as read + write),
   best and median of several passes;
2. runs the Cleave worker's engine (vLLM with the worker's own engine arguments and
   environment for `--device-group <core>`, the worker's process pinned to that core as
   services/worker does) and times batch-1 decode: N more tokens after the first
   (ignore_eos), interleaved with first-token-only runs whose time is subtracted;
3. reports decode tok/s ÷ (the best large-buffer read bandwidth ÷ model bytes): the most
   generous bound, so the ratio is the conservative one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="weight_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--buffer-mib", type=int, default=2048, help="the large buffer (beyond the caches)")
    parser.add_argument("--passes", type=int, default=7, help="bandwidth passes per method")
    parser.add_argument("--decode-tokens", type=int, default=256, help="tokens timed after the first")
    parser.add_argument("--rounds", type=int, default=3, help="decode timings (each with a first-token run)")
    parser.add_argument("--skip-decode", action="store_true", help="bandwidth only")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run the engine with torch.compile (enforce_eager off) instead of the workers' eager mode",
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    return parser.parse_args(argv)


def l3_bytes() -> int | None:
    """The largest cache this core sees, from sysfs (None where not exposed)."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


def _timed(passes: int, nbytes: int, run: Callable[[], Any]) -> dict[str, float]:
    run()  # first touch and warm-up, not timed
    rates = []
    for _ in range(passes):
        started = time.perf_counter()
        run()
        rates.append(nbytes / (time.perf_counter() - started) / 1e9)
    return {"best_gb_s": max(rates), "median_gb_s": statistics.median(rates), "passes": passes}


def bandwidth(size_bytes: int, passes: int) -> dict[str, dict[str, float]]:
    """GB/s of one thread reading (and copying) a buffer of `size_bytes`."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    floats = np.ones(size_bytes // 4, dtype=np.float32)
    copy_to = np.empty_like(floats)
    bf16 = torch.ones(size_bytes // 2, dtype=torch.bfloat16)
    results = {
        "numpy max (read)": _timed(passes, floats.nbytes, floats.max),
        "numpy sum (read)": _timed(passes, floats.nbytes, floats.sum),
        # BLAS's dot of the buffer with itself: each element read once, SIMD, one thread.
        "numpy dot (read)": _timed(passes, floats.nbytes, lambda: np.dot(floats, floats)),
        "torch bf16 sum (read)": _timed(passes, bf16.numel() * 2, bf16.sum),
        # Bytes read plus bytes written (the write-allocate reads are not counted).
        "numpy copy (read+write)": _timed(passes, 2 * floats.nbytes, lambda: np.copyto(copy_to, floats)),
    }
    return results  # the buffers go with this frame


def model_bytes(folder: Path) -> int:
    """Bytes of the model's weights (safetensors tensors, headers excluded). With tied
    embeddings the output projection reads the embedding matrix each step, so every byte is
    read once per decode step at batch 1."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = weights.get_slice(name)
                count = 1
                for dim in tensor.get_shape():
                    count *= dim
                total += count * _dtype_bytes(tensor.get_dtype())
    return total


def _dtype_bytes(dtype: str) -> int:
    return {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I32": 4, "I64": 8}[dtype]


def decode_rate(
    model: Path, core: int, tokens: int, rounds: int, *, compiled: bool = False
) -> dict[str, Any]:
    """Batch-1 decode tok/s of the Cleave worker's engine on `core`."""
    from libs.config.flags import parse
    from libs.worker.config import WorkerConfig
    from libs.worker.engine_args import engine_environment, engine_kwargs

    config = parse(WorkerConfig, ["--model", str(model), "--role", "both", "--device-group", str(core)])
    os.environ.update(engine_environment(config, os.sched_getaffinity(0)))
    kwargs = engine_kwargs(config)
    kwargs["disable_log_stats"] = True  # no stat logger here; not on the decode path
    if compiled:
        kwargs["enforce_eager"] = False

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**kwargs)
    prompt = TokensPrompt(prompt_token_ids=[1, 9690, 198, 2683, 359, 253, 5356, 31, 2])

    def run(max_tokens: int) -> float:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
        started = time.perf_counter()
        outputs = llm.generate([prompt], params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        produced = len(outputs[0].outputs[0].token_ids)
        if produced != max_tokens:
            raise RuntimeError(f"asked for {max_tokens} tokens, the engine produced {produced}")
        return elapsed

    run(tokens + 1)  # warm-up
    rates, firsts, longs = [], [], []
    for _ in range(rounds):
        first = run(1)
        long = run(tokens + 1)
        firsts.append(first)
        longs.append(long)
        rates.append(tokens / (long - first))
    return {
        "engine_kwargs": {k: v for k, v in kwargs.items() if isinstance(v, str | int | float | bool)},
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "tokens_timed": tokens,
        "first_token_s": firsts,
        "all_tokens_s": longs,
        "tok_s": rates,
        "median_tok_s": statistics.median(rates),
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"core {result['core']}; largest cache {result['cache_bytes'] / 2**20:.0f} MiB;"
        f" model {result['model_bytes'] / 1e6:.1f} MB ({result['model']})",
        "",
        "| read method | buffer | best GB/s | median GB/s |",
        "|---|---|---|---|",
    ]
    for label, runs in result["bandwidth"].items():
        for method, rate in runs.items():
            lines.append(f"| {method} | {label} | {rate['best_gb_s']:.2f} | {rate['median_gb_s']:.2f} |")
    decode = result.get("decode")
    if decode:
        lines += [
            "",
            f"decode at batch 1: {decode['median_tok_s']:.1f} tok/s median"
            f" ({', '.join(f'{r:.1f}' for r in decode['tok_s'])}; {decode['tokens_timed']} tokens each)",
        ]
        for label, bound in result["bounds"].items():
            lines.append(
                f"- bound from {label}: {bound['bandwidth_gb_s']:.2f} GB/s ÷ model bytes ="
                f" {bound['tok_s']:.1f} tok/s; decode ÷ bound = **{bound['ratio']:.2f}**"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    # One core, one thread everywhere, before numpy or torch is imported.
    os.sched_setaffinity(0, {args.core})
    for name in _ONE_THREAD:
        os.environ[name] = "1"
    from libs.models.resolve import resolve_model

    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True).path
    weights = model_bytes(model)
    result: dict[str, Any] = {
        "core": args.core,
        "model": str(model),
        "model_bytes": weights,
        "cache_bytes": l3_bytes() or 0,
        "bandwidth": {
            f"{args.buffer_mib} MiB": bandwidth(args.buffer_mib << 20, args.passes),
            "model size": bandwidth(weights, args.passes),
        },
    }
    print(report(result), file=sys.stderr, flush=True)
    if not args.skip_decode:
        result["decode"] = decode_rate(
            model, args.core, args.decode_tokens, args.rounds, compiled=args.compiled
        )
        result["bounds"] = {}
        for label in result["bandwidth"]:
            best = max(
                rate["best_gb_s"] for name, rate in result["bandwidth"][label].items() if "(read)" in name
            )
            bound = best * 1e9 / weights
            result["bounds"][f"{label} read (best method)"] = {
                "bandwidth_gb_s": best,
                "tok_s": bound,
                "ratio": result["decode"]["median_tok_s"] / bound,
            }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "weight_bound.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / "weight_bound.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
