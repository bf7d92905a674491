"""Parsers for the value syntaxes Cleave's launch flags share with qaic_disagg.

Each returns an immutable value or raises ConfigError naming the flag, so a bad command
line fails at start-up with one clear line instead of deep inside an engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from libs.config.errors import ConfigError

_RANGE = re.compile(r"^(\d+)\s*(?:\.\.|-)\s*(\d+)$")


def parse_device_group(flag: str, text: str) -> tuple[int, ...]:
    """`0..15` (inclusive range, also `0-15`), `0,2,4`, `3`, or mixes like `0..3,8`."""
    if not text or not text.strip():
        raise ConfigError(flag, text, "device ids such as '0..15', '0,2,4' or '3'")
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = _RANGE.match(part)
        if match:
            first, last = int(match.group(1)), int(match.group(2))
            if last < first:
                raise ConfigError(flag, text, f"a range whose end is >= its start, not {part!r}")
            ids.extend(range(first, last + 1))
        elif part.isdigit():
            ids.append(int(part))
        else:
            raise ConfigError(flag, text, f"device ids such as '0..15', '0,2,4' or '3'; bad part {part!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError(flag, text, "each device id at most once")
    return tuple(ids)


def parse_key_values(flag: str, text: str) -> tuple[tuple[str, str], ...]:
    """qaic_disagg's override syntax: space-separated `key:value` pairs."""
    pairs: list[tuple[str, str]] = []
    for item in text.split():
        key, sep, value = item.partition(":")
        if not sep or not key or not value:
            raise ConfigError(flag, text, f"space-separated key:value pairs; bad item {item!r}")
        if any(key == existing for existing, _ in pairs):
            raise ConfigError(flag, text, f"each key once; {key!r} repeats")
        pairs.append((key, value))
    return tuple(pairs)


def parse_positive_int(flag: str, value: int | str, *, allow_zero: bool = False) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(flag, value, "an integer") from None
    if number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(flag, value, "a non-negative integer" if allow_zero else "a positive integer")
    return number


def parse_port(flag: str, value: int | str) -> int:
    port = parse_positive_int(flag, value, allow_zero=True)
    if port > 65535:
        raise ConfigError(flag, value, "a TCP port 0..65535 (0 = pick a free one)")
    return port


def parse_choice(flag: str, value: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if value not in options:
        raise ConfigError(flag, value, "one of " + ", ".join(repr(c) for c in options))
    return value


def check_disjoint(
    flag_a: str, group_a: tuple[int, ...], flag_b: str, group_b: tuple[int, ...], *, allow: bool
) -> None:
    """Prefill and decode sharing devices defeats disaggregation; refuse unless asked for."""
    shared = sorted(set(group_a) & set(group_b))
    if shared and not allow:
        raise ConfigError(
            flag_b,
            ",".join(map(str, group_b)),
            f"devices not already in {flag_a} (overlap: {shared}); "
            "pass --allow-device-overlap to share them on purpose",
        )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(flag: str, text: str) -> int:
    """A byte count: 1073741824, 512MiB, 1G, 1.5GiB (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if not match or (match.group(3) and not match.group(2) and match.group(3).lower() != "b"):
        raise ConfigError(flag, text, "a size such as 1073741824, 512MiB or 2G")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ConfigError(flag, text, "a positive size")
    return size


def format_bytes(size: int) -> str:
    """The shortest exact spelling `parse_bytes` reads back: 1GiB, 1536MiB, 1000."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def format_device_group(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids))


def format_key_values(pairs: tuple[tuple[str, str], ...]) -> str:
    return " ".join(f"{key}:{value}" for key, value in pairs)


def parse_addresses(flag: str, text: str) -> tuple[str, ...]:
    """Comma-separated host:port addresses."""
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(flag, text, f"comma-separated host:port addresses; bad item {address!r}")
    return addresses
