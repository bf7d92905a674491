"""Codecs for the value syntaxes of Cleave's flags: text -> value -> the same text."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TypeVar

from libs.config import values
from libs.config.flags import Codec

E = TypeVar("E", bound=enum.Enum)

PORT: Codec[int] = Codec(values.parse_port, str)
POSITIVE_INT: Codec[int] = Codec(values.parse_positive_int, str)
NON_NEGATIVE_INT: Codec[int] = Codec(
    lambda flag, text: values.parse_positive_int(flag, text, allow_zero=True), str
)
BYTES: Codec[int] = Codec(values.parse_bytes, values.format_bytes)
DEVICE_GROUP: Codec[tuple[int, ...]] = Codec(values.parse_device_group, values.format_device_group)
KEY_VALUES: Codec[tuple[tuple[str, str], ...]] = Codec(values.parse_key_values, values.format_key_values)
ADDRESSES: Codec[tuple[str, ...]] = Codec(values.parse_addresses, ",".join)


def choice(options: Iterable[str]) -> Codec[str]:
    allowed = tuple(options)
    return Codec(lambda flag, text: values.parse_choice(flag, text, allowed), str)


def enum_of(kind: type[E]) -> Codec[E]:
    def parse(flag: str, text: str) -> E:
        return kind(values.parse_choice(flag, text, [member.value for member in kind]))

    return Codec(parse, lambda member: str(member.value))
