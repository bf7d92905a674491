"""The long live checks (compose_live_checks.py; run by hand, results in docs/deploy.md):

- rolling: decode at 2 replicas under continuous streams (--streams, 16), one decode container
  recreated as a rolling update does it (SIGTERM and its stop grace: it drains; a new one
  created; wait until the gateway routes to it): 0 failed requests.
- soak: --streams continuous streams for --soak-seconds (600); every service's health probed
  all along, as Kubernetes probes it (deploy/k8s: gRPC health port, 5 s timeout; the gateway's
  /health and /ready, 3 s) from a container on the stack's network, and Docker's own health
  checks (exec, 10 s) read back: no probe may fail or time out, no request may fail.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tests.deploy.live_stack import CheckFailed, Stack, _parse_docker_time, log, wait_for
from tests.deploy.live_streams import Stream, body, stream_chat

PROBE_LOOP = Path(__file__).with_name("probe_loop.py")
HEALTH_PORT = 50090
GRPC_TIMEOUT_S, HTTP_TIMEOUT_S = 5.0, 3.0  # deploy/k8s's probe timeouts


class Load:
    """`streams` clients, each sending one streamed chat after another until stopped: text
    (max 32 tokens, run to their end) and, every other one, json_schema."""

    def __init__(self, stack: Stack, streams: int) -> None:
        self._stack = stack
        self._model = stack.get_json("/v1/models")["data"][0]["id"]
        self._stop = threading.Event()
        self.finished: list[Stream] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(streams)
        self._clients: list[Future[None]] = [self._pool.submit(self._client, i) for i in range(streams)]

    def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            request = body(self._model, index + n, structured=(index + n) % 2 == 1, max_tokens=32)
            seen = stream_chat(self._stack.base, request, Stream())
            with self._lock:
                self.finished.append(seen)
            n += 1

    def stop(self) -> list[Stream]:
        self._stop.set()
        for client in self._clients:
            client.result(timeout=600)
        self._pool.shutdown()
        return self.finished

    def failed(self) -> list[Stream]:
        with self._lock:
            return [s for s in self.finished if not s.ok]


def summary(streams: list[Stream]) -> str:
    ttft = sorted(s.first_token_s for s in streams if s.first_token_s is not None)
    p = ttft[int(0.99 * (len(ttft) - 1))] if ttft else float("nan")
    return f"{len(streams)} requests, {sum(not s.ok for s in streams)} failed, TTFT p50 {statistics.median(ttft) if ttft else float('nan'):.2f} s p99 {p:.2f} s"


def check_rolling(stack: Stack, args: argparse.Namespace) -> None:
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=2", "decode", timeout=300)
    first, second = stack.containers("decode")[:2]
    wait_for("the second decode container healthy",
             lambda: stack.inspect(second, "{{.State.Health.Status}}") == "healthy", args.recovery_timeout, 3)  # fmt: skip
    wait_for(
        "the gateway routing to two decode workers",
        lambda: sum(w["healthy"] for w in stack.decode_workers()) == 2,
        60,
    )
    load = Load(stack, args.streams)
    try:
        time.sleep(20)
        log(f"rolling: under {args.streams} streams, recreating decode container {first[:12]}")
        stopped = time.monotonic()
        stack.docker("stop", "--time", "60", first, timeout=120)  # SIGTERM: it drains
        drained = time.monotonic() - stopped
        exit_code = stack.inspect(first, "{{.State.ExitCode}}")
        stack.docker("rm", first)
        stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=2", "decode", timeout=300)
        replacement = next(c for c in stack.containers("decode") if c != second)
        healthy = wait_for("the new decode container healthy",
                           lambda: stack.inspect(replacement, "{{.State.Health.Status}}") == "healthy",
                           args.recovery_timeout, 3)  # fmt: skip
        wait_for("the gateway routing to both again",
                 lambda: sum(w["healthy"] for w in stack.decode_workers()) == 2, 60)  # fmt: skip
        time.sleep(20)
    finally:
        streams = load.stop()
    failed = [(s.status, s.errors[:1]) for s in streams if not s.ok]
    log(
        f"rolling: drained in {drained:.1f}s (exit {exit_code}); replacement healthy after {healthy:.0f}s; {summary(streams)}"
    )
    if failed or exit_code != "0":
        raise CheckFailed(
            f"rolling: {len(failed)} failed requests {failed[:5]}; drained worker exit {exit_code}"
        )
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=1", "decode", timeout=300)


def check_soak(stack: Stack, args: argparse.Namespace) -> None:
    services = stack.services()
    grpc_services = list(stack.grpc_services())
    targets = [f"grpc@{s}:{HEALTH_PORT}:{GRPC_TIMEOUT_S}" for s in grpc_services]
    targets += [f"http@gateway:8000/health:{HTTP_TIMEOUT_S}", f"http@gateway:8000/ready:{HTTP_TIMEOUT_S}"]
    prober = stack.docker(
        "run", "-d", "--network", stack.network, "--read-only", "--cap-drop", "ALL",
        "-v", f"{PROBE_LOOP}:/probe_loop.py:ro", "--entrypoint", "python3", f"cleave-kvstore:{stack.tag}",
        "/probe_loop.py", str(args.soak_seconds), "5", *targets,
    ).strip()  # fmt: skip
    containers = {c: s for s in services for c in stack.containers(s) if s != "secrets"}
    docker_probes: dict[tuple[str, str], dict[str, object]] = {}
    load = Load(stack, args.streams)
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.soak_seconds:
            time.sleep(20)
            for container, service in containers.items():
                for entry in (
                    json.loads(stack.inspect(container, "{{json .State.Health.Log}}") or "null") or []
                ):
                    docker_probes[(service, entry["Start"])] = entry
            log(
                f"soak: {time.monotonic() - started:.0f}s, {len(load.finished)} requests, {len(load.failed())} failed"
            )
    finally:
        streams = load.stop()
        stack.docker("wait", prober, timeout=120)
        probes = [
            json.loads(line) for line in stack.docker("logs", prober).splitlines() if line.startswith("{")
        ]
        stack.docker("rm", "-f", prober)
    report = []
    failures = [p for p in probes if not p["ok"]]
    for target in sorted({p["target"] for p in probes}):
        seconds = sorted(p["seconds"] for p in probes if p["target"] == target)
        report.append(f"{target.rsplit(':', 1)[0]}: {len(seconds)} probes, max {seconds[-1]:.3f}s, "
                      f"p99 {seconds[int(0.99 * (len(seconds) - 1))]:.3f}s")  # fmt: skip
    by_service: dict[str, list[float]] = {}
    docker_failures = []
    for (service, _), entry in docker_probes.items():
        took = _parse_docker_time(str(entry["End"])) - _parse_docker_time(str(entry["Start"]))
        by_service.setdefault(service, []).append(took)
        if entry["ExitCode"] != 0:
            docker_failures.append((service, entry["ExitCode"], str(entry["Output"])[:200]))
    for service, seconds in sorted(by_service.items()):
        report.append(f"docker exec probe {service}: {len(seconds)}, max {max(seconds):.2f}s")
    log("soak: " + summary(streams) + "; " + "; ".join(report))
    failed_requests = [(s.status, s.errors[:1]) for s in streams if not s.ok]
    if failures or docker_failures or failed_requests:
        raise CheckFailed(f"soak: probe failures {failures[:5]}, docker health failures {docker_failures[:5]}, "
                          f"failed requests {failed_requests[:5]}")  # fmt: skip
