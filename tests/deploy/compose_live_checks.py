"""The live checks on a running compose stack (docs/deploy.md, "Live checks"):

    python3 tests/deploy/compose_live_checks.py --project P --compose-file F [--port 8000]
        [--checks kill,scale,security,metrics] [--checks rolling,soak --soak-seconds 600]

CI (.ci/run, through compose_smoke.sh --live-checks) runs kill, scale, security and metrics on
the 1p1d stack; rolling and soak are long, run by hand, their results in docs/deploy.md.

- kill: the decode container's init process is SIGKILLed from the host (what the kernel's
  OOM killer or a crash does). The gateway must report the decode worker unhealthy on
  /health, answer every request during the outage with an OpenAI error object within
  --max-error-s (never hang), keep running itself, and answer again once Docker's restart
  policy has restarted decode and it has loaded. Not `docker kill`: Docker 20.10 records it as
  a manual stop, and no restart policy (`unless-stopped`, `on-failure`, `always`) restarts
  a container stopped that way (measured; docs/deploy.md).
- scale: `docker-compose up -d --scale decode=2` on the running stack; the gateway must list
  the second decode worker without a restart, and concurrent requests must reach both, as
  counted by each decode worker's own Prometheus counter (read inside its container with
  `docker exec`, from the worker's --metrics-port on its loopback); then the second one is
  stopped (SIGTERM, as `--scale decode=1` does) with streams on it, text and json_schema: it
  must drain (every stream completes, none errs) and exit 0 within its grace, and the gateway
  must retire it and still answer.
- security (live_security.py): a container on the stack's network without the stack's secrets,
  and one with its certificate but not its token, call every gRPC service; Redis without its
  password.
- metrics (live_metrics.py): a decode worker's scrape shows vLLM's metric names at the values
  its engine's state and the requests sent imply; the gateway's, vLLM's request counters.
- rolling, soak (live_soak.py): decode recreated under 16 streams; probes under 16 streams.

Started by tests/deploy/compose_smoke.sh --live-checks after its chat completion, on the same
stack. Standard library only: it runs on the host's python3, outside Bazel. Every wait has a
timeout; a failure exits 1 (the smoke script then prints the containers' logs). HTTP goes only
to the gateway's published 127.0.0.1 port; calls to the services go from containers on the
stack's network.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the import path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.deploy.live_metrics import check_metrics
from tests.deploy.live_security import check_security
from tests.deploy.live_soak import check_rolling, check_soak
from tests.deploy.live_stack import (
    Answer,
    CheckFailed,
    Stack,
    health_probe_seconds,
    log,
    openai_error,
    wait_for,
)
from tests.deploy.live_streams import drain_streams_check


def check_kill(stack: Stack, args: argparse.Namespace) -> None:
    decode = stack.containers("decode")
    if len(decode) != 1:
        raise CheckFailed(f"kill check wants one decode container, found {len(decode)}")
    [container] = decode
    gateway = stack.containers("gateway")[0]
    gateway_started = stack.inspect(gateway, "{{.State.StartedAt}}")
    restarts = int(stack.inspect(container, "{{.RestartCount}}"))
    pid = stack.inspect(container, "{{.State.Pid}}")
    log(f"decode probe durations before the kill: {health_probe_seconds(stack, container)} s")
    if not stack.chat(args.request_timeout).ok:
        raise CheckFailed("the stack does not answer before the kill")

    log(f"SIGKILL to decode's init process (host pid {pid}; container {container[:12]})")
    killed = time.monotonic()
    subprocess.run([*([] if os.geteuid() == 0 else ["sudo"]), "kill", "-KILL", pid], check=True, timeout=30)

    unhealthy_after = restarted_after = None
    errors: list[Answer] = []
    while True:
        elapsed = time.monotonic() - killed
        if elapsed > args.recovery_timeout:
            raise CheckFailed(
                f"no good answer {args.recovery_timeout}s after the kill; errors: {len(errors)}"
            )
        if unhealthy_after is None and not any(w["healthy"] for w in stack.decode_workers()):
            unhealthy_after = elapsed
            log(f"gateway /health: decode unhealthy {elapsed:.1f}s after the kill")
        if restarted_after is None and int(stack.inspect(container, "{{.RestartCount}}")) > restarts:
            restarted_after = elapsed
            log(f"Docker restarted decode {elapsed:.1f}s after the kill (restart policy)")
        answer = stack.chat(args.request_timeout)
        if answer.ok:
            break
        if len(errors) < 3 or len(errors) % 20 == 0:
            log(f"request during the outage: {answer.describe()}")
        if answer.status is None or not openai_error(answer.body) or answer.status < 500:
            raise CheckFailed(f"a request during the outage got no OpenAI 5xx error: {answer.describe()}")
        if answer.seconds > args.max_error_s:
            raise CheckFailed(
                f"an error took {answer.seconds:.1f}s (> {args.max_error_s}s): {answer.describe()}"
            )
        errors.append(answer)
        time.sleep(1)
    recovered_after = time.monotonic() - killed

    if not errors:
        raise CheckFailed("the first request after the kill was answered: the kill did not take")
    if unhealthy_after is None:
        raise CheckFailed("the gateway's /health never showed decode unhealthy")
    if restarted_after is None:
        restarted_after = recovered_after  # restarted between the last two polls
    if stack.inspect(gateway, "{{.State.StartedAt}}") != gateway_started:
        raise CheckFailed("the gateway restarted during the outage")
    seconds = [e.seconds for e in errors]
    codes = sorted({f"{e.status} {e.body['error']['code']}" for e in errors})
    log(
        f"kill: unhealthy on /health after {unhealthy_after:.1f}s; {len(errors)} requests during the "
        f"outage answered {', '.join(codes)} in {min(seconds):.2f}/{statistics.median(seconds):.2f}/"
        f"{max(seconds):.2f}s (min/median/max); Docker restarted decode after {restarted_after:.1f}s; "
        f"first good answer {recovered_after:.1f}s after the kill"
    )
    log(f"decode probe durations after the restart: {health_probe_seconds(stack, container)} s")


def check_scale(stack: Stack, args: argparse.Namespace) -> None:
    gateway = stack.containers("gateway")[0]
    gateway_started = stack.inspect(gateway, "{{.State.StartedAt}}")
    scaled = time.monotonic()
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=2", "decode", timeout=300)
    decode = stack.containers("decode")
    if len(decode) != 2:
        raise CheckFailed(f"--scale decode=2 left {len(decode)} decode containers")
    new = decode[1]
    healthy = wait_for(
        "the new decode container healthy",
        lambda: stack.inspect(new, "{{.State.Health.Status}}") == "healthy",
        args.recovery_timeout,
        every=3,
    )
    log(f"the second decode container is healthy {healthy:.1f}s after the scale")
    wait_for(
        "the gateway routing to two decode workers",
        lambda: sum(w["healthy"] for w in stack.decode_workers()) == 2,
        60,
    )
    discovered = time.monotonic() - scaled
    log(f"gateway /health lists two healthy decode workers {discovered:.1f}s after the scale")

    before = {c: stack.worker_generates(c) for c in decode}
    # Concurrent requests: least-load routing sends sequential ones to the same idle worker.
    served = dict.fromkeys(decode, 0.0)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            answers = list(pool.map(lambda _: stack.chat(args.request_timeout), range(4)))
            bad = [a.describe() for a in answers if not a.ok]
            if bad:
                raise CheckFailed(f"requests after the scale failed: {bad}")
            served = {c: stack.worker_generates(c) - before[c] for c in decode}
            if all(served.values()):
                break
    if not all(served.values()):
        raise CheckFailed(f"after 5 rounds of 4 concurrent requests a decode worker served none: {served}")
    if stack.inspect(gateway, "{{.State.StartedAt}}") != gateway_started:
        raise CheckFailed("the gateway restarted during the scale-out")
    log(
        "scale: requests served per decode container, by each worker's own "
        "cleave_worker_requests_total{method=Generate,outcome=ok}: "
        + ", ".join(f"{c[:12]}: {n:.0f}" for c, n in served.items())
    )

    # Scale back to 1 with streams on the worker that goes: it drains (SIGTERM, as compose's
    # scale-down sends it), every stream completes, and it exits 0 within its grace.
    drain_streams_check(stack, args, new)
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=1", "decode", timeout=300)
    retired = wait_for(
        "the gateway retiring the second decode worker", lambda: len(stack.decode_workers()) == 1, 60
    )
    answer = stack.chat(args.request_timeout)
    if not answer.ok:
        raise CheckFailed(f"after scaling back to one decode worker: {answer.describe()}")
    log(f"scale back to 1: the gateway retired the second worker within {retired:.1f}s and still answers")


CHECKS: dict[str, Callable[[Stack, argparse.Namespace], None]] = {
    "kill": check_kill,
    "scale": check_scale,
    "security": check_security,
    "metrics": check_metrics,
    "rolling": check_rolling,
    "soak": check_soak,
}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--project", required=True)
    parser.add_argument("--compose-file", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--checks", default="kill,scale", help=f"comma-separated: {', '.join(CHECKS)}")
    parser.add_argument("--soak-seconds", type=float, default=600, help="soak: how long 16 streams run")
    parser.add_argument("--streams", type=int, default=16, help="rolling, soak: concurrent streams")
    parser.add_argument(
        "--request-timeout", type=float, default=120, help="client timeout of one request (s)"
    )
    parser.add_argument("--max-error-s", type=float, default=10, help="slowest allowed error answer (s)")
    parser.add_argument("--recovery-timeout", type=float, default=600, help="wait for a worker to load (s)")
    args = parser.parse_args(argv)
    stack = Stack(args.project, args.compose_file, args.port)
    for name in args.checks.split(","):
        if name not in CHECKS:
            parser.error(f"unknown check {name!r}; known: {', '.join(CHECKS)}")
    for name in args.checks.split(","):
        started = time.monotonic()
        log(f"check {name}")
        try:
            CHECKS[name](stack, args)
        # OSError: the gateway unreachable on /health; ValueError: a body that is not JSON.
        except (CheckFailed, subprocess.TimeoutExpired, OSError, ValueError) as error:
            log(f"check {name} FAILED after {time.monotonic() - started:.0f}s: {error}")
            return 1
        log(f"check {name} passed in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
