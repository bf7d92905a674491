"""Issue 15's live checks on a running compose stack (docs/deploy.md, "Live checks"):

    python3 tests/deploy/compose_live_checks.py --project P --compose-file F [--port 8000]
        [--checks kill,scale]

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
  `docker exec`, from the worker's --metrics-port on its loopback); then scale back to 1 and
  check the gateway retires the second one and still answers.

Started by tests/deploy/compose_smoke.sh --live-checks after its chat completion (CI: .ci/run),
on the same stack. Standard library only: it runs on the host's python3, outside Bazel. Every
wait has a timeout; a failure exits 1 (the smoke script then prints the containers' logs).
HTTP goes only to the gateway's published 127.0.0.1 port.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# The decode worker's --metrics-port in the compose files (inside its container only).
WORKER_METRICS_PORT = 9400
CHAT = {
    "model": "smollm2",
    "temperature": 0,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"compose_live_checks: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no HTTP answer within the client's timeout (or no connection)
    body: Any
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.body["choices"][0]["message"]["content"].strip())

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.body}) after {self.seconds:.1f}s"
        error = self.body.get("error", {}) if isinstance(self.body, dict) else {}
        return f"{self.status} {error.get('code')} {error.get('message')!r} in {self.seconds:.2f}s"


def openai_error(body: Any) -> bool:
    """An OpenAI error object: {"error": {"message": str, "type": str, "code": ...}}."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and isinstance(error.get("type"), str)
        and "code" in error
    )


def counter_value(metrics_text: str, name: str, labels: dict[str, str]) -> float:
    """The value of one sample of Prometheus text exposition; 0 when the sample is absent (a
    labelled counter appears only once incremented)."""
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, _, value = line[len(name) + 1 :].rpartition("} ")
        found = dict(part.split("=", 1) for part in label_text.split(",") if part)
        if {k: v.strip('"') for k, v in found.items()} == labels:
            return float(value)
    return 0.0


class Stack:
    def __init__(self, project: str, compose_file: str, port: int) -> None:
        self.project = project
        self.compose_file = compose_file
        self.base = f"http://127.0.0.1:{port}"

    # --- Docker

    def docker(self, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise CheckFailed(f"docker {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def compose(self, *args: str, timeout: float) -> None:
        command = ["docker-compose", "--project-name", self.project, "--file", self.compose_file, *args]
        log("+ " + " ".join(command))
        result = subprocess.run(command, timeout=timeout, check=False)
        if result.returncode != 0:
            raise CheckFailed(f"{' '.join(command)} exited {result.returncode}")

    def containers(self, service: str) -> list[str]:
        """Running and stopped containers of `service`, by their compose number."""
        ids = self.docker(
            "ps", "-aq",
            "--filter", f"label=com.docker.compose.project={self.project}",
            "--filter", f"label=com.docker.compose.service={service}",
        ).split()  # fmt: skip
        return sorted(
            ids,
            key=lambda i: int(
                self.inspect(i, '{{index .Config.Labels "com.docker.compose.container-number"}}')
            ),
        )

    def inspect(self, container: str, template: str) -> str:
        return self.docker("inspect", "--format", template, container).strip()

    def worker_generates(self, container: str) -> float:
        """Generate RPCs the worker in `container` has answered successfully, by its own counter."""
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{WORKER_METRICS_PORT}/metrics', timeout=10).read().decode())"
        text = self.docker("exec", container, "python3", "-c", fetch, timeout=60)
        return counter_value(text, "cleave_worker_requests_total", {"method": "Generate", "outcome": "ok"})

    # --- the gateway, through its published port

    def get_json(self, path: str, timeout: float = 10) -> Any:
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def decode_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.get_json("/health")["workers"] if w["role"] == "decode"]

    def chat(self, timeout: float) -> Answer:
        request = urllib.request.Request(
            self.base + "/v1/chat/completions",
            data=json.dumps(CHAT).encode(),
            headers={"content-type": "application/json"},
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return Answer(response.status, json.load(response), time.monotonic() - started)
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            return Answer(error.code, body, time.monotonic() - started)
        except (OSError, TimeoutError) as error:  # URLError, a timeout, a reset connection
            return Answer(None, repr(error), time.monotonic() - started)


def wait_for(what: str, condition: Callable[[], bool], timeout: float, every: float = 1.0) -> float:
    """Seconds until `condition()` held; CheckFailed after `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise CheckFailed(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)
    return time.monotonic() - started


def health_probe_seconds(stack: Stack, container: str) -> list[float]:
    """How long the container's last health probes took (Docker keeps the last five)."""
    log_json = stack.inspect(container, "{{json .State.Health.Log}}")
    probes = json.loads(log_json) if log_json not in ("", "null") else []
    seconds = []
    for probe in probes:
        start, end = (_parse_docker_time(probe[k]) for k in ("Start", "End"))
        seconds.append(round(end - start, 2))
    return seconds


def _parse_docker_time(text: str) -> float:
    """Seconds since the epoch of Docker's RFC 3339 times (2026-12-02T03:40:01.123456789Z; the
    nanoseconds that datetime cannot parse kept as a fraction)."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?", text)
    if match is None:
        raise CheckFailed(f"not a Docker time: {text!r}")
    whole = calendar.timegm(time.strptime(match[1], "%Y-%m-%dT%H:%M:%S"))
    return whole + float("0." + (match[2] or "0"))


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

    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "decode=1", "decode", timeout=300)
    retired = wait_for(
        "the gateway retiring the second decode worker", lambda: len(stack.decode_workers()) == 1, 60
    )
    answer = stack.chat(args.request_timeout)
    if not answer.ok:
        raise CheckFailed(f"after scaling back to one decode worker: {answer.describe()}")
    log(f"scale back to 1: the gateway retired the second worker within {retired:.1f}s and still answers")


CHECKS: dict[str, Callable[[Stack, argparse.Namespace], None]] = {"kill": check_kill, "scale": check_scale}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--project", required=True)
    parser.add_argument("--compose-file", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--checks", default="kill,scale", help="comma-separated: kill, scale")
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
