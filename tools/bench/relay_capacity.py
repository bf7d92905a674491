"""Relay capacity: how much CPU each serving process spends per token when tokens come as fast as
the serving layer can take them (the mock engine's zero-time profile: no step waits).

./bazel run //tools/bench:relay_capacity -- --streams 1,16,64,256 --out-dir /tmp/relay \
    [--system cleave-pd-mock-zero] [--rounds 2] [--clients 2]

A stack of the chosen system (tools/bench/systems/catalog.py; its workers on the mock engine)
serves closed-loop streamed chat completions, `--max-tokens` each with ignore_eos, from
`--clients` load-generator processes that open the streams and count their SSE events by
scanning bytes for `data: `, never parsing JSON (a parsing client costs more CPU per token than
the gateway it measures). For every stream count: tokens/s, and ms of CPU per generated token of
each process role (gateway, tokenizer, worker shells, the mock engine cores, the load generator
itself), from /proc (tools/bench/proc_cpu.py) and the clients' own rusage. Figures are
simulated (profile zero): they are the serving layer's own costs, not a model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

GENERATOR = "load generator"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relay_capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="cleave-pd-mock-zero")
    parser.add_argument("--streams", default="1,16,64,256", help="comma-separated concurrent streams")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per stream count")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per stream (ignore_eos)")
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--clients", type=int, default=2, help="load-generator processes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-num-seqs", type=int, default=256, help="per engine: every stream runs")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out-dir", type=Path, required=True)
    # A client process: its URL, streams, seconds, max tokens, prompt words; prints its counts.
    parser.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- the load generator (one process) ---------------------------------------------------------


async def _stream(host: str, port: int, body: bytes) -> int:
    """One streamed completion over a raw HTTP/1.1 connection; its count of SSE data events."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    events = 0
    tail = b""
    while chunk := await reader.read(65536):
        data = tail + chunk
        # A marker inside `tail` was counted with the previous read; one across the boundary now.
        events += data.count(b"data: ") - tail.count(b"data: ")
        tail = data[-5:]
    writer.close()
    return events - 1  # the final `data: [DONE]`


async def _client(url: str, streams: int, seconds: float, max_tokens: int, words: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    model = "smollm2"
    stop_at = time.monotonic() + seconds
    events = requests = 0

    async def loop(index: int) -> None:
        nonlocal events, requests
        while time.monotonic() < stop_at:
            prompt = " ".join(f"word{(index * 7 + i) % 997}" for i in range(words))
            body = json.dumps(
                {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
            ).encode()
            # Not `events += await ...`: that reads `events` before the await and loses the
            # other streams' counts added meanwhile.
            got = await _stream(host, int(port), body)
            events += got
            requests += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(streams)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "events": events,
        "requests": requests,
        "seconds": time.monotonic() - started,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


# -- the measurement --------------------------------------------------------------------------


@dataclass
class Point:
    round: int
    streams: int
    seconds: float
    tokens: int
    requests: int
    cpu_s: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds
    events: int = 0  # SSE data events the clients read

    def ms_per_token(self) -> dict[str, float]:
        return {role: 1000.0 * s / max(self.tokens, 1) for role, s in self.cpu_s.items()}


def _measure(url: str, roots: list[int], streams: int, args: argparse.Namespace, round_: int) -> Point:
    from tools.bench import proc_cpu

    per_client = [
        streams // args.clients + (1 if i < streams % args.clients else 0) for i in range(args.clients)
    ]
    before = proc_cpu.snapshot(roots)
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.bench.relay_capacity",
                "--out-dir",
                str(args.out_dir),
                "--client",
                url,
                str(n),
                str(args.seconds),
                str(args.max_tokens),
                str(args.prompt_words),
            ],
            stdout=subprocess.PIPE,
        )
        for n in per_client
        if n > 0
    ]
    reports = [json.loads(c.communicate()[0]) for c in clients]
    spent = proc_cpu.cpu_by_role(before, proc_cpu.snapshot(roots))
    spent[GENERATOR] = sum(r["cpu_s"] for r in reports)
    requests = int(sum(r["requests"] for r in reports))
    # Every stream runs to max_tokens (ignore_eos), and every started one finishes: exact.
    tokens = requests * args.max_tokens
    # SSE chunks: a role chunk, then one per delta the worker sent (a delta holds every token
    # of its request that was ready, so a slow reader gets several per chunk).
    events = int(sum(r["events"] for r in reports))
    if requests and events < 2 * requests:
        raise RuntimeError(f"{events} SSE events for {requests} streams: streams ended without tokens")
    return Point(round_, streams, max(r["seconds"] for r in reports), tokens, requests, spent, events)


async def _run(args: argparse.Namespace) -> list[Point]:
    from libs.models.resolve import resolve_model
    from libs.rpc.ports import free_port
    from libs.stack.process import Launched, start, wait_ready
    from tools.bench.systems.catalog import ServingSettings, plan_system

    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True)
    settings = ServingSettings(
        model_path=model.path, max_num_seqs=args.max_num_seqs, cores=tuple(sorted(os.sched_getaffinity(0)))
    )
    points = []
    for round_ in range(1, args.rounds + 1):
        plan = plan_system(args.system, settings, free_port)
        launched = Launched()
        try:
            for spec in plan.processes:
                launched.processes.append(start(spec, args.out_dir / "logs" / f"round{round_}"))
            await wait_ready(launched.processes, settings.startup_timeout_s)
            roots = [p.process.pid for p in launched.processes]
            warm = argparse.Namespace(**{**vars(args), "seconds": 3.0})
            _measure(plan.base_url, roots, 4, warm, round_)
            for streams in [int(s) for s in args.streams.split(",")]:
                point = _measure(plan.base_url, roots, streams, args, round_)
                points.append(point)
                per = point.ms_per_token()
                print(
                    f"relay_capacity: round {round_} {streams} streams: {point.tokens / point.seconds:.0f} tok/s; "
                    + ", ".join(f"{role} {ms:.4f} ms/token" for role, ms in sorted(per.items())),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            launched.stop(60.0)
    return points


def markdown(points: Sequence[Point], system: str, cpu: str) -> str:
    roles = sorted({r for p in points for r in p.cpu_s}, key=lambda r: (r == GENERATOR, r))
    lines = [
        f"Relay capacity of {system} (simulated: mock engine, profile zero) on {cpu}.",
        "ms of CPU per generated token, median (min-max) over rounds:",
        "",
        "| streams | tok/s | tokens per SSE event | " + " | ".join(roles) + " |",
        "|---" * (3 + len(roles)) + "|",
    ]
    for streams in sorted({p.streams for p in points}):
        runs = [p for p in points if p.streams == streams]
        rate = statistics.median(p.tokens / p.seconds for p in runs)
        cells = []
        for role in roles:
            values = [p.ms_per_token().get(role, 0.0) for p in runs]
            cells.append(f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})")
        per_event = statistics.median(p.tokens / max(p.events, 1) for p in runs)
        lines.append(f"| {streams} | {rate:.0f} | {per_event:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.client:
        url, streams, seconds, max_tokens, words = args.client
        result = asyncio.run(_client(url, int(streams), float(seconds), int(max_tokens), int(words)))
        print(json.dumps(result))
        return 0
    from tools.bench.calibrate_mock import cpu_facts

    args.out_dir.mkdir(parents=True, exist_ok=True)
    points = asyncio.run(_run(args))
    facts = cpu_facts()
    cpu = f"{facts['model']} ({', '.join(facts['flags'])}), {facts['cores']} cores"
    (args.out_dir / "relay_capacity.json").write_text(json.dumps([vars(p) for p in points], indent=2) + "\n")
    text = markdown(points, args.system, cpu)
    (args.out_dir / "relay_capacity.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
