"""Fixtures for the model-management tests: a tiny GGUF file and its converted folder."""

from pathlib import Path

import pytest

from libs.models.resolve import resolve_model
from libs.models.spec import ResolvedModel

from .tiny_gguf import write_tiny_llama_gguf


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: uses the real SmolLM2 model (tens of seconds); deselect with -m 'not slow'"
    )


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def converted_tiny(tiny_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> ResolvedModel:
    """The tiny GGUF converted once for the session; tests must not modify its folder."""
    return resolve_model(str(tiny_gguf_path), tmp_path_factory.mktemp("cache"), progress=False)
