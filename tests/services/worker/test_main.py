"""The worker entry point's CPU pinning: a device group this machine cannot run on is a
one-line config error naming the flag; a usable one pins this process (and what it starts)."""

from __future__ import annotations

import os

import pytest

from libs.config.errors import ConfigError
from services.worker.main import pin_to_cores


def test_cores_the_machine_lacks_are_refused_with_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--device-group: got '0,4096'.*\[4096\] are not usable"):
        pin_to_cores((0, 4096))


def test_a_usable_group_pins_this_process() -> None:
    before = os.sched_getaffinity(0)
    first = min(before)
    try:
        pin_to_cores((first,))
        assert os.sched_getaffinity(0) == {first}
    finally:
        os.sched_setaffinity(0, before)
