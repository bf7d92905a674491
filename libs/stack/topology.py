"""`--mode` parsing: `pd` (one colocated worker), `Npd` (N colocated workers, e.g. `2pd`),
`XpYd` (X prefill, Y decode workers), and with vision
encoders (the reference's xEyPD / xEyPzD): `XeYpd` (X encoders, Y colocated workers) and
`XeYpZd` (X encoders, Y prefill, Z decode workers)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.config.errors import ConfigError

_DISAGGREGATED = re.compile(r"^(\d+)p(\d+)d$")
_COLOCATED = re.compile(r"^(\d+)pd$")
_ENCODE_COLOCATED = re.compile(r"^(\d+)e(\d+)pd$")
_ENCODE_DISAGGREGATED = re.compile(r"^(\d+)e(\d+)p(\d+)d$")


@dataclass(frozen=True)
class Topology:
    prefill: int
    decode: int
    colocated: int
    encode: int = 0  # vision encoder services

    @property
    def name(self) -> str:
        if self.encode:
            workers = f"{self.colocated}pd" if self.colocated else f"{self.prefill}p{self.decode}d"
            return f"{self.encode}e{workers}"
        if self.colocated:
            return "pd" if self.colocated == 1 else f"{self.colocated}pd"
        return f"{self.prefill}p{self.decode}d"


def parse_mode(text: str) -> Topology:
    if text == "pd":
        return Topology(prefill=0, decode=0, colocated=1)
    match = _COLOCATED.match(text)
    if match and int(match.group(1)) >= 1:
        return Topology(prefill=0, decode=0, colocated=int(match.group(1)))
    match = _DISAGGREGATED.match(text)
    if match and int(match.group(1)) >= 1 and int(match.group(2)) >= 1:
        return Topology(prefill=int(match.group(1)), decode=int(match.group(2)), colocated=0)
    match = _ENCODE_COLOCATED.match(text)
    if match and int(match.group(1)) >= 1 and int(match.group(2)) >= 1:
        return Topology(prefill=0, decode=0, colocated=int(match.group(2)), encode=int(match.group(1)))
    match = _ENCODE_DISAGGREGATED.match(text)
    if match and min(int(group) for group in match.groups()) >= 1:
        encode, prefill, decode = (int(group) for group in match.groups())
        return Topology(prefill=prefill, decode=decode, colocated=0, encode=encode)
    raise ConfigError(
        "--mode",
        text,
        "'pd' (colocated), 'Npd' (N colocated workers, e.g. '2pd'), 'XpYd' (e.g. '1p1d'), or with "
        "vision encoders 'XeYpd' (e.g. '1e1pd') "
        "or 'XeYpZd' (e.g. '1e1p1d', '2e1p1d'), every count >= 1",
    )
