"""Benchmark load generator for any OpenAI-compatible endpoint.

./bazel run //tools/bench -- --url http://127.0.0.1:8000 --model smollm2 --workload random \
    --rate 1,2,4 --num-requests 50 --goodput ttft:500 tpot:50 --output /tmp/bench.json --plots /tmp/plots

Exit codes: 0 done, 1 some run had no successful request, 2 bad flags or unusable server.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from tools.bench import cli, report
from tools.bench.runner import BenchError, BenchResult, run_sweep


def main(argv: Sequence[str]) -> int:
    options = cli.parse_args(argv)

    def show(result: BenchResult) -> None:
        print(report.format_summary(result) + "\n", flush=True)

    try:
        results = asyncio.run(
            run_sweep(options.config, options.rates, progress=options.progress, on_result=show)
        )
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    if len(results) > 1:
        print(report.format_sweep(results) + "\n")
    try:
        if options.output is not None:
            report.write_json(options.output, results)
            print(f"wrote {options.output}")
        if options.plots is not None:
            from tools.bench import plots  # matplotlib takes a while to import; only when asked

            for path in plots.write_plots(results, options.plots):
                print(f"wrote {path}")
    except OSError as exc:
        print(f"bench: error: cannot write results: {exc}", file=sys.stderr)
        return 2
    return 0 if all(result.summary.completed > 0 for result in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
