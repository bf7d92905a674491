from __future__ import annotations

import pytest

from libs.config.errors import ConfigError
from libs.stack.topology import parse_mode


@pytest.mark.parametrize(
    ("text", "counts"), [("pd", (0, 0, 1)), ("1p1d", (1, 1, 0)), ("2p1d", (2, 1, 0)), ("3p2d", (3, 2, 0))]
)
def test_modes(text: str, counts: tuple[int, int, int]) -> None:
    topology = parse_mode(text)
    assert (topology.prefill, topology.decode, topology.colocated) == counts
    assert topology.name == text


@pytest.mark.parametrize("text", ["", "0p1d", "1p0d", "pdd", "1e1p1d"])
def test_bad_modes(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--mode: got .*'pd' \(colocated\) or 'XpYd'"):
        parse_mode(text)
