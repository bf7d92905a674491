"""Run inside a probe container on a compose stack's network (live_soak.py): probes every target
as the kubelet would, every INTERVAL seconds for DURATION seconds, and prints one JSON line per
probe: how long it took and whether it passed within its timeout. The gRPC probe is the images'
own (/opt/cleave/healthcheck.py: Health/Check over a bare HTTP/2 connection, no process started
per probe, like the kubelet's); HTTP is a GET.

    python3 probe_loop.py DURATION INTERVAL grpc@host:port:timeout http@host:port/path:timeout ...
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import urllib.request

spec = importlib.util.spec_from_file_location("healthcheck", "/opt/cleave/healthcheck.py")
assert spec is not None and spec.loader is not None
healthcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(healthcheck)


def probe(kind: str, address: str, timeout: float) -> tuple[bool, str]:
    if kind == "grpc":
        host, _, port = address.rpartition(":")
        try:
            status = healthcheck.grpc_health_status(host, int(port), timeout)
        except OSError as error:
            return False, repr(error)
        return status == 1, f"status {status}"
    try:
        with urllib.request.urlopen(f"http://{address}", timeout=timeout) as reply:
            return reply.status == 200, str(reply.status)
    except OSError as error:
        return False, repr(error)


def loop(target: str, duration: float, interval: float, lock: threading.Lock) -> None:
    kind, _, rest = target.partition("@")
    address, _, timeout_text = rest.rpartition(":")
    timeout = float(timeout_text)
    end = time.monotonic() + duration
    while time.monotonic() < end:
        started = time.monotonic()
        ok, detail = probe(kind, address, timeout)
        took = time.monotonic() - started
        with lock:
            print(json.dumps({"target": target, "ok": ok and took <= timeout, "seconds": round(took, 4),
                              "detail": detail, "at": time.time()}), flush=True)  # fmt: skip
        time.sleep(max(0.0, interval - took))


def main(argv: list[str]) -> int:
    duration, interval, targets = float(argv[0]), float(argv[1]), argv[2:]
    lock = threading.Lock()
    threads = [threading.Thread(target=loop, args=(t, duration, interval, lock)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
