"""Convert one GGUF file into a bf16 safetensors Hugging Face folder (weights + tokenizer).

This module only writes into a folder it is given; deciding where, caching, locking and
publishing atomically are the job of `libs.models.gguf_cache`.
"""

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from libs.models.errors import ModelConversionError

log = structlog.get_logger(__name__)

# Files a converted folder must hold for vLLM and transformers to load it without the GGUF.
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)

# Keys transformers writes into tokenizer_config.json that describe how *this* load was done,
# not the tokenizer; left in, they would make later loads of the folder claim to be offline.
_LOAD_TIME_TOKENIZER_KEYS = ("is_local", "local_files_only")

# from_pretrained flips process-wide state (torch's default dtype, the progress-bar switch), so
# two conversions in threads of one process could leave each other's settings behind.
# Conversions are rare and CPU-bound anyway: one at a time per process costs nothing.
_ONE_CONVERSION_PER_PROCESS = threading.Lock()

# transformers' "no limit" sentinel for model_max_length (int(1e30)).
_UNBOUNDED_MODEL_MAX_LENGTH = 10**29


def convert_gguf_to_hf(gguf_path: Path, dest: Path, progress: bool) -> None:
    """Write the model in `gguf_path` as a bf16 safetensors HF folder into the empty folder `dest`.

    Raises ModelConversionError when transformers cannot read the file (for example an
    architecture it does not support). Never touches the network.
    """
    with _ONE_CONVERSION_PER_PROCESS:
        _convert(gguf_path, dest, progress)


def _convert(gguf_path: Path, dest: Path, progress: bool) -> None:
    # Imported here, not at module level: resolving a plain HF folder must not pay for torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.perf_counter()
    log.info("models.gguf_conversion_started", gguf=str(gguf_path), dest=str(dest))
    stages = tqdm(total=4, desc="convert GGUF", unit="stage", disable=not progress, leave=True)
    try:
        with _transformers_progress_bars(enabled=progress):
            stages.set_postfix_str("reading tokenizer")
            try:
                tokenizer = AutoTokenizer.from_pretrained(
                    gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
                )
            except Exception as error:
                raise ModelConversionError(
                    f"Could not read the tokenizer from GGUF file {gguf_path}: {error}"
                ) from error
            stages.update(1)

            stages.set_postfix_str("dequantizing weights")
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    gguf_path.parent,
                    gguf_file=gguf_path.name,
                    local_files_only=True,
                    dtype=torch.bfloat16,
                    # Dense weights, always: by default transformers keeps them packed when the
                    # optional `kernels` package is installed, and packed weights cannot be saved.
                    quantization_config=GgufConfig(dequantize=True),
                )
            except Exception as error:
                raise ModelConversionError(
                    f"Could not load the weights of GGUF file {gguf_path}: {error}"
                ) from error
            stages.update(1)

            stages.set_postfix_str("writing safetensors")
            _forget_gguf_quantization(model)
            model.save_pretrained(dest)
            stages.update(1)

            stages.set_postfix_str("writing tokenizer")
            tokenizer.save_pretrained(dest)
            _clean_tokenizer_config(
                dest / "tokenizer_config.json",
                chat_template=tokenizer.chat_template,
                max_positions=getattr(model.config, "max_position_embeddings", None),
            )
            stages.update(1)
    finally:
        stages.close()

    check_converted_folder(dest)
    log.info(
        "models.gguf_conversion_finished",
        gguf=str(gguf_path),
        dest=str(dest),
        seconds=round(time.perf_counter() - started, 2),
        bytes=folder_size(dest),
    )


def _forget_gguf_quantization(model: Any) -> None:
    """Make a dequantized GGUF model savable as plain bf16.

    save_pretrained refuses a model whose quantizer says it is not serializable, and a
    quantization_config left in config.json would make vLLM look for a GGUF loader. The
    weights are already dense, so both are stale.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _clean_tokenizer_config(
    path: Path, chat_template: str | list[Any] | dict[str, Any] | None, max_positions: int | None
) -> None:
    """Make tokenizer_config.json self-describing, like the one of an HF hub checkout."""
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for key in _LOAD_TIME_TOKENIZER_KEYS:
        config.pop(key, None)
    # transformers 5 writes the template to chat_template.jinja only; older readers (and people)
    # look for it in tokenizer_config.json, so it goes in both, with identical text.
    if isinstance(chat_template, str):
        config["chat_template"] = chat_template
    if max_positions and config.get("model_max_length", 0) >= _UNBOUNDED_MODEL_MAX_LENGTH:
        config["model_max_length"] = max_positions
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_converted_folder(folder: Path) -> None:
    """Raise ModelConversionError unless `folder` holds everything a converted model needs."""
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not any(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ModelConversionError(f"Converted folder {folder} lacks {', '.join(missing)}")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise ModelConversionError(f"Converted folder {folder} still declares a quantization_config")


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


@contextlib.contextmanager
def _transformers_progress_bars(enabled: bool) -> Iterator[None]:
    """Show or hide transformers' own tqdm bars (dequantizing, loading) for the conversion.

    transformers only offers a process-wide switch, so it is restored afterwards.
    """
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    if enabled:
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
        else:
            transformers_logging.disable_progress_bar()
