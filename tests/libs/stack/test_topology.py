from __future__ import annotations

import pytest

from libs.config.errors import ConfigError
from libs.stack.topology import parse_mode


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("pd", (0, 0, 1, 0)),
        ("2pd", (0, 0, 2, 0)),
        ("4pd", (0, 0, 4, 0)),
        ("1p1d", (1, 1, 0, 0)),
        ("2p1d", (2, 1, 0, 0)),
        ("3p2d", (3, 2, 0, 0)),
        ("1e1pd", (0, 0, 1, 1)),
        ("1e1p1d", (1, 1, 0, 1)),
        ("2e1p1d", (1, 1, 0, 2)),
        ("1e2pd", (0, 0, 2, 1)),
    ],
)
def test_modes(text: str, counts: tuple[int, int, int, int]) -> None:
    topology = parse_mode(text)
    assert (topology.prefill, topology.decode, topology.colocated, topology.encode) == counts
    assert topology.name == text


def test_one_colocated_worker_is_named_pd() -> None:
    assert parse_mode("1pd") == parse_mode("pd")
    assert parse_mode("1pd").name == "pd"


@pytest.mark.parametrize("text", ["", "0p1d", "1p0d", "pdd", "0pd", "0e1pd", "1e0p1d", "1epd", "e1p1d"])
def test_bad_modes(text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^--mode: got .*'pd' \(colocated\), 'Npd'.*'XpYd'.*'XeYpd'.*'XeYpZd'"
    ):
        parse_mode(text)
