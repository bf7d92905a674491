from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from libs.rpc import ports


def test_free_ports_lie_below_the_kernels_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    drawn = {ports.free_port() for _ in range(50)}
    assert all(10000 <= port < low for port in drawn)
    assert len(drawn) > 40  # drawn at random, not one fixed port
    port = drawn.pop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free when returned


def test_a_port_in_use_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = ports.free_port()
        draws = iter([busy, busy, free])
        monkeypatch.setattr(random, "randrange", lambda _a, _b: next(draws))
        assert ports.free_port() == free


def test_port_files_are_read_back_and_absent_ones_are_none(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "worker.port"
    assert ports.read_port_file(path) is None
    ports.write_port_file(path, 45123)
    assert ports.read_port_file(path) == 45123
    assert not path.with_name("worker.port.partial").exists()
