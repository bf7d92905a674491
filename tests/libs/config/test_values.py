from __future__ import annotations

import pytest

from libs.config.errors import ConfigError
from libs.config.values import (
    check_disjoint,
    parse_choice,
    parse_device_group,
    parse_key_values,
    parse_port,
    parse_positive_int,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0..15", tuple(range(16))),
        ("16-23", tuple(range(16, 24))),
        ("0,2,4", (0, 2, 4)),
        ("3", (3,)),
        ("0..1, 8", (0, 1, 8)),
    ],
)
def test_device_group_forms(text: str, expected: tuple[int, ...]) -> None:
    assert parse_device_group("--prefill-device-group", text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "device ids such as"),
        ("5..2", "end is >= its start"),
        ("0,x", "bad part 'x'"),
        ("1,1", "at most once"),
        ("-3", "bad part '-3'"),
    ],
)
def test_device_group_errors_name_the_flag(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_group("--decode-device-group", text)
    message = str(info.value)
    assert message.startswith("--decode-device-group: got ")
    assert fragment in message


def test_key_values() -> None:
    assert parse_key_values("--prefill-override-qaic-config", "aic_num_cores:16 mos:1") == (
        ("aic_num_cores", "16"),
        ("mos", "1"),
    )
    assert parse_key_values("--x", "") == ()


@pytest.mark.parametrize("text", ["novalue", "k:", ":v", "a:1 a:2"])
def test_key_values_errors(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--decode-override-qaic-config: got "):
        parse_key_values("--decode-override-qaic-config", text)


def test_numbers_and_choices() -> None:
    assert parse_positive_int("--max-num-seqs", "8") == 8
    assert parse_port("--port", 0) == 0
    with pytest.raises(ConfigError, match="a positive integer"):
        parse_positive_int("--max-num-seqs", 0)
    with pytest.raises(ConfigError, match="an integer"):
        parse_positive_int("--max-num-seqs", "many")
    with pytest.raises(ConfigError, match=r"0\.\.65535"):
        parse_port("--port", 70000)
    with pytest.raises(ConfigError, match="one of 'prefill', 'decode', 'both'"):
        parse_choice("--role", "encode", ["prefill", "decode", "both"])


def test_overlapping_device_groups_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match=r"overlap: \[2, 3\].*--allow-device-overlap"):
        check_disjoint(
            "--prefill-device-group", (0, 1, 2, 3), "--decode-device-group", (2, 3, 4), allow=False
        )
    check_disjoint("--prefill-device-group", (0, 1), "--decode-device-group", (1,), allow=True)
    check_disjoint("--prefill-device-group", (0,), "--decode-device-group", (1,), allow=False)
