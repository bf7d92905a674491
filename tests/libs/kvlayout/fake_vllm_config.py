"""A stand-in for vLLM's VllmConfig with the attributes Cleave reads: enough to compute an
engine's KV facts and to construct the kvstore connector, without starting an engine."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


def model_folder(root: Path) -> Path:
    """A model folder the fingerprint can read: config.json and one weights file."""
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 3}))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    return folder


def fake_vllm_config(
    model: Path,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dtype: str = "auto",
    block_size: int = 16,
) -> Any:
    parallel_config = SimpleNamespace(tensor_parallel_size=1)

    def per_rank(value: int) -> Any:
        def getter(parallel: Any) -> int:
            assert parallel is parallel_config
            return value

        return getter

    return SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model),
            served_model_name="tiny",
            hf_text_config=SimpleNamespace(model_type="llama"),
            dtype=dtype,
            max_model_len=256,
            get_vocab_size=lambda: 1000,
            get_num_layers=per_rank(3),
            get_num_kv_heads=per_rank(2),
            get_head_size=lambda: 32,
            get_diff_sampling_param=dict,  # --generation-config vllm: no model defaults
            is_multimodal_model=False,
        ),
        cache_config=SimpleNamespace(block_size=block_size, cache_dtype=cache_dtype, num_gpu_blocks=40),
        scheduler_config=SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=2048),
        parallel_config=parallel_config,
        device_config=SimpleNamespace(device_type="cpu"),
        kv_transfer_config=SimpleNamespace(
            engine_id="engine-0",
            kv_connector_extra_config={
                "kvstore_address": "127.0.0.1:1",
                "kvstore_chunk_tokens": 64,
                "kvstore_save": False,
            },
        ),
    )
