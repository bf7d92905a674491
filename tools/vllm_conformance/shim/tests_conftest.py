"""Root conftest of a conformance run (copied as `tests/conftest.py` by main.py).

vLLM's tests name Hugging Face models (OPT, Qwen, zephyr) that this machine does not have
and cannot download; the server they talk to serves the runner's model under those names, so
the tokenizers and model configs the tests build for their own checks are the runner's model's
too. The LoRA adapters the tests' fixtures fetch from the hub are adapters for the runner's
model instead, written here (libs/models/tiny_lora.py; each repository its own seed, so two
adapters differ): the server, Cleave's or vLLM's, loads them from these folders.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
import vllm.config
import vllm.tokenizers

from libs.models.tiny_lora import write_adapter

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


# The hub's LoRA adapters vLLM's tests fetch (vLLM's tests/entrypoints/conftest.py, test_chat's).
LORA_REPOS = (
    "typeof/zephyr-7b-beta-lora",
    "charent/self_cognition_Alice",
    "Jackmin108/Qwen3-0.6B-Meow-LoRA",
    "Jackmin108/Qwen3-0.6B-Woof-LoRA",
)
_ADAPTERS = Path(tempfile.mkdtemp(prefix="cleave-conformance-lora-"))


def _no_download(repo_id: str, *args: Any, **kwargs: Any) -> str:
    """A LoRA repository: an adapter for the runner's model (written once); anything else is
    never fetched (a path that does not exist)."""
    if repo_id not in LORA_REPOS:
        return f"/nonexistent/{repo_id}"
    folder = _ADAPTERS / repo_id.replace("/", "--")
    if not folder.is_dir():
        write_adapter(folder, Path(_MODEL), seed=LORA_REPOS.index(repo_id))
    return str(folder)


# Before any test module imports them by name; never undone (the run's own process).
_patches = pytest.MonkeyPatch()
_patches.setattr(vllm.tokenizers, "get_tokenizer", _runner_tokenizer)
_patches.setattr(vllm.config, "ModelConfig", _runner_model_config)
_patches.setattr(huggingface_hub, "snapshot_download", _no_download)


@pytest.fixture(scope="session")
def zephyr_lora_files() -> str:
    return _no_download("typeof/zephyr-7b-beta-lora")
