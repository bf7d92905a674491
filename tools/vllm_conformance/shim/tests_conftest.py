"""Root conftest of a conformance run (copied as `tests/conftest.py` by main.py).

vLLM's tests name Hugging Face models (OPT, Qwen, zephyr) that this machine does not have
and cannot download; the server they talk to serves the runner's model under those names, so
the tokenizers and model configs the tests build for their own checks are the runner's model's
too. Fixtures from vLLM's conftests that only prepare LoRA adapters are stand-ins (the LoRA
tests are left out by main.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import vllm.config
import vllm.tokenizers

_MODEL = os.environ["CLEAVE_CONFORMANCE_MODEL"]
_get_tokenizer = vllm.tokenizers.get_tokenizer
_ModelConfig = vllm.config.ModelConfig


def _runner_tokenizer(_name: Any, *args: Any, **kwargs: Any) -> Any:
    return _get_tokenizer(_MODEL, *args, **kwargs)


def _runner_model_config(*args: Any, **kwargs: Any) -> Any:
    kwargs["model"] = _MODEL
    kwargs.pop("tokenizer", None)
    return _ModelConfig(**kwargs)


# Before any test module imports them by name; never undone (the run's own process).
_patches = pytest.MonkeyPatch()
_patches.setattr(vllm.tokenizers, "get_tokenizer", _runner_tokenizer)
_patches.setattr(vllm.config, "ModelConfig", _runner_model_config)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # vLLM's tests are pytest-asyncio tests; anyio's plugin runs them (anyio_mode = auto).
    return "asyncio"


@pytest.fixture(scope="session")
def zephyr_lora_files() -> str:
    return "/nonexistent/zephyr-lora"
