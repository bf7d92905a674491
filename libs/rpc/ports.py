"""Ports: the one free-port helper, and the file through which a child reports its port."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def free_port() -> int:
    """A port free right now. Only for servers that cannot bind port 0 and report what they
    got (NIXL's side channel, redis-server in tests): between this call and their bind,
    another process may take it. Cleave's own servers bind port 0 and write a port file."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
