"""A stalled reader beside live streams: the gateway's memory stays bounded and the other
clients' inter-token latency does not move (issue 30's slow-reader check).

./bazel run //tools/bench:slow_reader -- --streams 16 --rounds 2 --out-dir /tmp/slow-reader

A pd stack on the mock engine (the CPU profile's step times; simulated) serves `--streams`
closed-loop streamed chat completions whose inter-token gaps are recorded; in every other run
one more client starts a long stream (`--stalled-tokens`, ignore_eos) and never reads its body.
Each round runs both, in alternating order. Reported per run: the live streams' ITL p50 and
p99, the gateway's RSS at the start and its peak, and what became of the stalled request
(the gateway stops it once it falls libs/gateway/fleet/shared_stream.MAX_BACKLOG responses
behind). Figures are simulated (mock engine, profile cpu-smollm2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="slow_reader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per live stream")
    parser.add_argument(
        "--stalled-tokens",
        type=int,
        default=7000,
        help="tokens the stalled stream asks for (max-model-len 8192)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out-dir", type=Path, required=True)
    return parser.parse_args(argv)


def _body(prompt: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()


async def _open(
    port: int, body: bytes, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent `body`; `receive_buffer` shrinks the kernel's buffer so that a
    client that does not read pushes back on the gateway at once (not after megabytes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def _live(port: int, index: int, stop_at: float, max_tokens: int, gaps: list[float]) -> None:
    """Closed loop: one stream after another; the gap between consecutive SSE events."""
    while time.monotonic() < stop_at:
        reader, writer = await _open(port, _body(f"live stream {index} " * 8, max_tokens))
        last = None
        tail = b""
        while chunk := await reader.read(65536):
            now = time.monotonic()
            data = tail + chunk
            if data.count(b"data: ") > tail.count(b"data: "):
                if last is not None:
                    gaps.append(now - last)
                last = now
            tail = data[-5:]
        writer.close()


async def _stalled(port: int, tokens: int, stop_at: float) -> str:
    """Starts a long stream and reads nothing of its body until the run ends; then what it got."""
    reader, writer = await _open(port, _body("the stalled reader", tokens), receive_buffer=4096)
    await asyncio.sleep(max(stop_at - time.monotonic(), 0.0))
    received = b""
    try:
        async with asyncio.timeout(30):
            while chunk := await reader.read(1 << 20):
                received += chunk
    except TimeoutError:
        return "still open 30 s after it started reading"
    finally:
        writer.close()
    if b"the client fell" in received:
        return "stopped by the gateway (its backlog bound), ended with an error event"
    if received.rstrip().endswith(b"data: [DONE]"):
        return f"completed ({received.count(b'data: ')} events)"
    return f"ended after {len(received)} bytes"


async def _run_once(port: int, pid: int, args: argparse.Namespace, stalled: bool) -> dict[str, Any]:
    import psutil

    gateway = psutil.Process(pid)
    stop_at = time.monotonic() + args.seconds
    gaps: list[float] = []
    rss_start = gateway.memory_info().rss
    peak = rss_start
    tasks = [asyncio.create_task(_live(port, i, stop_at, args.max_tokens, gaps)) for i in range(args.streams)]
    stalled_task = asyncio.create_task(_stalled(port, args.stalled_tokens, stop_at)) if stalled else None
    while time.monotonic() < stop_at:
        peak = max(peak, gateway.memory_info().rss)
        await asyncio.sleep(0.5)
    await asyncio.gather(*tasks)
    outcome = await stalled_task if stalled_task is not None else "-"
    ordered = sorted(gaps)
    return {
        "stalled": stalled,
        "itl_p50_ms": 1000 * statistics.median(ordered),
        "itl_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
        "gaps": len(ordered),
        "rss_start_mib": rss_start / 2**20,
        "rss_peak_mib": peak / 2**20,
        "stalled_outcome": outcome,
    }


async def _main(args: argparse.Namespace) -> list[dict[str, Any]]:
    from libs.models.resolve import resolve_model
    from libs.rpc.ports import free_port
    from libs.stack.process import Launched, start, wait_ready
    from tools.bench.systems.catalog import ServingSettings, plan_system

    model = resolve_model(args.model, Path.home() / ".cache" / "cleave" / "models", progress=True)
    settings = ServingSettings(model_path=model.path, max_num_seqs=args.streams + 4, max_model_len=8192)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for stalled in (False, True) if round_ % 2 else (True, False):
            plan = plan_system("cleave-pd-mock", settings, free_port)
            launched = Launched()
            try:
                for spec in plan.processes:
                    launched.processes.append(start(spec, args.out_dir / "logs" / f"round{round_}-{stalled}"))
                await wait_ready(launched.processes, settings.startup_timeout_s)
                port = int(plan.base_url.rsplit(":", 1)[1])
                run = await _run_once(port, launched.processes[0].process.pid, args, stalled)
                run["round"] = round_
                runs.append(run)
                print(f"slow_reader: {json.dumps(run)}", file=sys.stderr, flush=True)
            finally:
                launched.stop(60.0)
    return runs


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    lines = [
        "Simulated (mock engine, profile cpu-smollm2): live streams' ITL and the gateway's RSS,",
        "with and without a stalled reader.",
        "",
        "| round | stalled reader | ITL p50 ms | ITL p99 ms | gateway RSS start MiB | peak MiB | the stalled request |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['round']} | {'yes' if run['stalled'] else 'no'} | {run['itl_p50_ms']:.1f} | "
            f"{run['itl_p99_ms']:.1f} | {run['rss_start_mib']:.0f} | {run['rss_peak_mib']:.0f} | {run['stalled_outcome']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs = asyncio.run(_main(args))
    (args.out_dir / "slow_reader.json").write_text(json.dumps(runs, indent=2) + "\n")
    text = markdown(runs)
    (args.out_dir / "slow_reader.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
