from __future__ import annotations

import json

import pytest
import structlog

from libs.observability.logging import bound_request_id, configure_logging, current_request_id


def test_json_lines_carry_request_id_and_service(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level="info", json=True, service="gateway")
    log = structlog.get_logger("test")
    with bound_request_id("abc123"):
        log.info("prefill done", tokens=12)
    log.info("outside")
    lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
    assert lines[0]["request_id"] == "abc123"
    assert lines[0]["service"] == "gateway"
    assert lines[0]["event"] == "prefill done" and lines[0]["tokens"] == 12
    assert "request_id" not in lines[1]
    assert current_request_id() is None


def test_stdlib_logging_goes_through_the_same_renderer(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    configure_logging(level="warning", json=True)
    with bound_request_id("r-1"):
        logging.getLogger("vllm.engine").warning("engine hiccup")
        logging.getLogger("vllm.engine").info("filtered out")
    lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
    assert len(lines) == 1
    assert lines[0]["event"] == "engine hiccup" and lines[0]["request_id"] == "r-1"


def test_unknown_level_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging(level="loud")
