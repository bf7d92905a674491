"""Model management: turn a model name or local path into a Hugging Face-format folder.

Import the submodules directly (``libs.models.resolve``, ``libs.models.tiny``); this package
file stays empty so that importing a light module never pulls in torch or transformers.
"""
