"""Errors raised while finding or preparing a model."""


class ModelNotFoundError(ValueError):
    """The requested model is not a built-in name, a local HF folder, or a local GGUF file."""


class ModelConversionError(RuntimeError):
    """A GGUF file was found but could not be turned into a Hugging Face-format folder."""
