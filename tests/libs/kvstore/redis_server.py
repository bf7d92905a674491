"""A throwaway redis-server on a free loopback port, for tests.

Uses Debian's /usr/bin/redis-server (CI installs the `redis-server` package). Persistence is
off and the data directory is a temp dir, so nothing outlives the test.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from libs.rpc.ports import free_port

REDIS_SERVER = "/usr/bin/redis-server"
START_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or (REDIS_SERVER if Path(REDIS_SERVER).exists() else None)
    if found is None:
        raise RuntimeError(
            "redis-server not found: install Debian's redis-server package (apt-get install redis-server)"
        )
    return found


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None, password: str | None = None) -> None:
        self.workdir = workdir
        self.password = password
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        self._process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--save",
                "",
                "--appendonly",
                "no",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.workdir / 'redis.log').read_text()[-2000:]}")
            try:
                with redis.Redis(
                    port=self.port, password=self.password, socket_connect_timeout=0.5
                ) as client:
                    if client.ping():
                        return self
            except redis.ConnectionError:
                time.sleep(0.02)
        raise TimeoutError(f"redis-server on port {self.port} did not answer within {START_TIMEOUT_S}s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2)
