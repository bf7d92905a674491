"""An engine's KvFacts, read from vLLM's engine configuration.

The worker reads them in its API process (VllmEngine) and the kvstore connector inside vLLM's
engine core, where the configuration is all it is given; both call engine_kv_facts on it, so
they cannot read different things. No vLLM import: only the config object's attributes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from libs.kvlayout.layout import KvFacts
from libs.models.fingerprint import model_fingerprint


def engine_kv_facts(vllm_config: Any) -> KvFacts:
    model_config = vllm_config.model_config
    parallel_config = vllm_config.parallel_config
    model_type = getattr(model_config.hf_text_config, "model_type", "")
    return KvFacts(
        model_fingerprint=model_fingerprint(Path(model_config.model), model_type),
        block_size=int(vllm_config.cache_config.block_size),
        kv_cache_dtype=_cache_dtype_name(str(vllm_config.cache_config.cache_dtype), model_config.dtype),
        num_layers=model_config.get_num_layers(parallel_config),
        num_kv_heads=model_config.get_num_kv_heads(parallel_config),
        head_dim=model_config.get_head_size(),
    )


def _cache_dtype_name(cache_dtype: str, model_dtype: Any) -> str:
    """vLLM's "auto" means the model's dtype: name it, so that a layout says what the bytes are
    (a bfloat16 and a float32 engine must not share KV)."""
    return str(model_dtype).removeprefix("torch.") if cache_dtype == "auto" else cache_dtype
