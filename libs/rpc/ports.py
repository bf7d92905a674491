"""Ports: the one free-port helper, and the file through which a child reports its port."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default ip_local_port_range starts here
_LOWEST = 10000


def free_port() -> int:
    """A port that is free now and that the kernel will not hand out by itself.

    Only for servers that must be told their port before they bind it and cannot report
    what they got: NIXL's side channel (vLLM binds it after loading the model), redis-server
    in tests and benchmarks, and vLLM's own OpenAI server (tools/vllm_conformance's control
    run). The port is drawn below the kernel's ephemeral range, because
    ports inside it are given to every bind(0) and to the local end of every outgoing
    connection: a side-channel port picked there was taken by a health-check connection
    before vLLM bound it (1 of 11 stack starts), and vLLM's handshake thread died, leaving the
    worker hanging. Below the range only another explicit bind can take it. Cleave's own
    servers never need this: they bind port 0 and write a port file.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(_LOWEST, low)
        if _bindable(port):
            return port
    raise OSError(f"no free port between {_LOWEST} and {low}")


def _ephemeral_low() -> int:
    try:
        low = int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW
    # A range starting very low leaves no room below it; fall back to the default split.
    return low if low > _LOWEST + 1000 else _DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def write_port_file(path: Path, port: int) -> None:
    """Atomically, so a reader never sees a half-written number."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(f"{port}\n")
    os.replace(partial, path)


def read_port_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
