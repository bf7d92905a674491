"""A model's identity for KV compatibility: the weights and config, not the path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def model_fingerprint(model_path: Path, model_type: str) -> str:
    """config.json plus weight file names and sizes: the same model copied to another folder
    or machine has the same fingerprint, so its workers can share KV."""
    digest = hashlib.sha256(model_type.encode())
    config_file = model_path / "config.json"
    if config_file.exists():
        digest.update(json.dumps(json.loads(config_file.read_text()), sort_keys=True).encode())
    for weights in sorted(model_path.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]
