"""The worker entry point's CPU pinning: a device group this machine cannot run on is a
one-line config error naming the flag; a usable one pins this process (and what it starts).
And its context length: never beyond the model's own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from libs.config.errors import ConfigError
from services.worker.main import fitted_max_model_len, pin_to_cores


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


def test_max_model_len_is_capped_at_the_models_own(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert fitted_max_model_len(11264, tmp_path) == 8192  # qaic_disagg's documented value
    assert fitted_max_model_len(2048, tmp_path) == 2048
    assert fitted_max_model_len(None, tmp_path) is None  # vLLM takes the model's own
