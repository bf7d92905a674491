"""What a resolved model is: a local Hugging Face-format folder ready for vLLM or transformers."""

import enum
from dataclasses import dataclass
from pathlib import Path

# The model a deployment gets when it names none: small enough to run on any CPU.
DEFAULT_MODEL = "smollm2"


class ModelOrigin(enum.Enum):
    """Where the folder in a `ResolvedModel` came from."""

    BUILTIN = "builtin"  # a name shipped with Cleave, converted from a packaged GGUF file
    HF_FOLDER = "hf_folder"  # a local Hugging Face folder, used as is
    GGUF_FILE = "gguf_file"  # a local .gguf file, converted once into the cache
    HUB_CACHE = "hub_cache"  # an `org/name` hub id found in the local Hugging Face cache


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: every consumer reads `path` and nothing else."""

    # HF-format folder: config.json, *.safetensors weights, tokenizer files, generation_config.json.
    path: Path
    # The name clients use to address the model (OpenAI "model" field) and logs show.
    served_name: str
    origin: ModelOrigin
    # What was actually read: the folder itself, or the .gguf file that `path` was converted from.
    source: Path


def fitted_context_length(asked: int | None, folder: Path) -> int | None:
    """A requested context length capped at the model's own (None = the model's own); what
    was asked when the model names no length. Positions past the model's training length
    give garbage, and vLLM refuses them, so a command line copied from a bigger model's
    deployment (qaic_disagg's documented one asks for 11264) should not stop the stack."""
    try:
        own = context_length(folder)
    except ValueError:
        return asked
    return own if asked is None else min(asked, own)


def context_length(folder: Path) -> int:
    """The model's own context length, from its config.json (a vision-language model keeps
    it in `text_config`), as vLLM derives its default max_model_len."""
    import json

    config = json.loads((folder / "config.json").read_text())
    for source in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if isinstance(source.get(key), int) and source[key] > 0:
                return int(source[key])
    raise ValueError(f"{folder / 'config.json'} names no context length (max_position_embeddings)")
