"""The local stack for a batch: the gateway's config from the flags given, and a gateway that
cannot start reported with its log instead of hanging."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.config.errors import ConfigError
from libs.stack.process import LaunchError
from tools.local_gateway import gateway_config, local_gateway


def test_the_gateway_binds_any_port_and_gets_the_flags_given() -> None:
    config = gateway_config(["--mode", "pd", "--max-model-len", "1024"])
    assert config.port == 0 and config.mode.name == "pd" and config.max_model_len == 1024
    assert config.launches_stack
    assert gateway_config(["--port", "8123"]).port == 8123


def test_bad_gateway_flags_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError):
        gateway_config(["--max-model-len", "0"])


def test_a_gateway_that_exits_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    args = ["--cache-dir", str(tmp_path), "--model", str(tmp_path / "no-such-model")]
    with (
        pytest.raises(LaunchError, match="exited with code") as error,
        local_gateway("run-batch", args, startup_timeout_s=120),
    ):
        pytest.fail("the gateway cannot have become healthy")
    assert "no-such-model" in str(error.value)
    assert (tmp_path / "logs" / "run-batch-gateway.log").exists()
