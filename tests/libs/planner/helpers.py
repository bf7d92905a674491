"""A small mock profile with round numbers, so the tests can compute what to expect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from libs.mockengine.profiles import PROFILES_DIR

COEFFICIENTS = {
    "base_s": 0.01,
    "per_seq_s": 0.001,
    "per_prefill_token_s": 0.0001,
    "per_context_token_s": 0.0,
    "per_prefill_attention_s": 0.0,
}


def write_profile(directory: Path, **changes: Any) -> str:
    """A copy of the zero profile with COEFFICIENTS (or `changes` to them), 16-token blocks,
    room for 64 sequences of 512 tokens, 8 sequences a step, 5 s start-up, 2 ms transfers."""
    data = json.loads((PROFILES_DIR / "zero.json").read_text())
    data["name"] = "unit"
    data["coefficients"] = {**COEFFICIENTS, **changes.pop("coefficients", {})}
    data["model"] = {**data["model"], "block_size": 16, "max_model_len": 512, "kv_bytes_per_element": 2}
    kv_bytes_per_token = (
        2 * data["model"]["num_layers"] * data["model"]["num_kv_heads"] * data["model"]["head_dim"] * 2
    )
    data["scheduler_defaults"] = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "kv_cache_bytes": kv_bytes_per_token * 16 * (64 * 32 + 1),
    }
    data["kv_transfer"] = {"bandwidth_bytes_per_s": 0, "latency_s": 0.002}
    data["startup_s"] = 5.0
    data.update(changes)
    path = directory / "unit.json"
    path.write_text(json.dumps(data))
    return str(path)
