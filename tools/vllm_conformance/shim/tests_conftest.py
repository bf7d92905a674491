"""Root conftest of a conformance run (copied as `tests/conftest.py` by main.py).

vLLM's tests name Hugging Face models (OPT, Qwen, zephyr) that this machine does not have
and cannot download; the server they talk to serves the runner's model under those names, so
the tokenizers and model configs the tests build for their own checks are the runner's model's
too. Fixtures that only fetch LoRA adapters get a path instead (the LoRA tests are left out
by main.py, and the server ignores --lora-modules).
"""

from __future__ import annotations

import os
from typing import Any

import huggingface_hub
import pytest
import vllm.config
import vllm.tokenizers

_MODEL = os.environ["CLEAVE_CONFORMANCE_MODEL"]
_get_tokenizer = vllm.tokenizers.get_tokenizer
_ModelConfig = vllm.config.ModelConfig


def _runner_tokenizer(*args: Any, **kwargs: Any) -> Any:
    # Called as get_tokenizer(name, ...) and as get_tokenizer(tokenizer_name=name, ...).
    kwargs.pop("tokenizer_name", None)
    return _get_tokenizer(_MODEL, *args[1:], **kwargs)


def _runner_model_config(*args: Any, **kwargs: Any) -> Any:
    kwargs["model"] = _MODEL
    kwargs.pop("tokenizer", None)
    return _ModelConfig(**kwargs)


def _no_download(repo_id: str, *args: Any, **kwargs: Any) -> str:
    # Test modules' own fixtures download LoRA adapters (test_chat's zephyr one); the server
    # ignores --lora-modules and the LoRA tests are left out, so a path is all they need.
    return f"/nonexistent/{repo_id}"


# Before any test module imports them by name; never undone (the run's own process).
_patches = pytest.MonkeyPatch()
_patches.setattr(vllm.tokenizers, "get_tokenizer", _runner_tokenizer)
_patches.setattr(vllm.config, "ModelConfig", _runner_model_config)
_patches.setattr(huggingface_hub, "snapshot_download", _no_download)


@pytest.fixture(scope="session")
def zephyr_lora_files() -> str:
    return "/nonexistent/zephyr-lora"
