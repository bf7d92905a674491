"""A running compose stack as the live checks see it (compose_live_checks.py and the checks it
runs): Docker and docker-compose calls, the gateway through its published 127.0.0.1 port, and
the workers' Prometheus text read inside their containers. Standard library only: the checks
run on the host's python3, outside Bazel."""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The workers' --metrics-port in the compose files (inside their containers only).
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


GRPC_IMAGES = ("cleave-tokenizer", "cleave-kvstore", "cleave-worker", "cleave-encoder")


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

    def worker_metrics(self, container: str) -> str:
        """The worker's Prometheus text, read inside its container (its --metrics-port binds
        the container's loopback)."""
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{WORKER_METRICS_PORT}/metrics', timeout=10).read().decode())"
        return self.docker("exec", container, "python3", "-c", fetch, timeout=60)

    def worker_generates(self, container: str) -> float:
        """Generate RPCs the worker in `container` has answered successfully, by its own counter."""
        return counter_value(
            self.worker_metrics(container),
            "cleave_worker_requests_total",
            {"method": "Generate", "outcome": "ok"},
        )

    def gateway_metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as response:
            return str(response.read().decode())

    @property
    def network(self) -> str:
        """The stack's network (docker-compose names it <project>_<name>)."""
        return f"{self.project}_cleave"

    @property
    def secrets_volume(self) -> str:
        return f"{self.project}_secrets"

    @property
    def tag(self) -> str:
        return os.environ.get("CLEAVE_TAG", "latest")

    def services(self) -> dict[str, str]:
        """Service name -> image name (without tag), from the running project's containers."""
        found = {}
        for line in self.docker(
            "ps", "--filter", f"label=com.docker.compose.project={self.project}",
            "--format", '{{.Label "com.docker.compose.service"}} {{.Image}}',
        ).splitlines():  # fmt: skip
            service, _, image = line.partition(" ")
            found[service] = image.rsplit(":", 1)[0]
        return found

    def grpc_services(self) -> dict[str, str]:
        """Cleave's gRPC services: service name -> image. Redis runs in the kvstore's image
        (redis-server) and serves no gRPC."""
        return {s: image for s, image in self.services().items() if image in GRPC_IMAGES and s != "redis"}

    def probe_container(self, *args: str, secrets: bool = True, timeout: float = 180) -> str:
        """A throwaway container of the kvstore image on the stack's network (what any other
        container there could do), read-only, unprivileged; the stack's secrets mounted or not."""
        mounts = ["-v", f"{self.secrets_volume}:/etc/cleave/secrets:ro"] if secrets else []
        return self.docker(
            "run", "--rm", "--network", self.network, "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges:true", *mounts, *args, timeout=timeout,
        )  # fmt: skip

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


def samples(metrics_text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of `name` in Prometheus text exposition, with its labels."""
    found = []
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            label_text, _, value = line[len(name) + 1 :].rpartition("} ")
            labels = dict(part.split("=", 1) for part in re.findall(r'[a-zA-Z_]\w*="[^"]*"', label_text))
            found.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
        elif line.startswith(name + " "):
            found.append(({}, float(line.split()[-1])))
    return found


def total(metrics_text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    return sum(v for found, v in samples(metrics_text, name) if labels.items() <= found.items())
