"""Fixtures shared by the end-to-end suites: the real default model and the prompt set."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.prompts import build_prompts
from tests.e2e.stack import default_model_dir


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return default_model_dir()


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[tuple[str, list[int]]]:
    return build_prompts(Tokenizer.from_config(TokenizerConfig(path=model_dir)))
