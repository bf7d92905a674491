"""`--mode` parsing: `pd` (colocated) or `XpYd` (X prefill, Y decode workers)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.config.errors import ConfigError

_DISAGGREGATED = re.compile(r"^(\d+)p(\d+)d$")


@dataclass(frozen=True)
class Topology:
    prefill: int
    decode: int
    colocated: int

    @property
    def name(self) -> str:
        return "pd" if self.colocated else f"{self.prefill}p{self.decode}d"


def parse_mode(text: str) -> Topology:
    if text == "pd":
        return Topology(prefill=0, decode=0, colocated=1)
    match = _DISAGGREGATED.match(text)
    if match and int(match.group(1)) >= 1 and int(match.group(2)) >= 1:
        return Topology(prefill=int(match.group(1)), decode=int(match.group(2)), colocated=0)
    raise ConfigError("--mode", text, "'pd' (colocated) or 'XpYd' with X, Y >= 1, e.g. '1p1d' or '2p1d'")
