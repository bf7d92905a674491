"""KvFacts -> KvLayout, and the facts read from vLLM's configuration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cleave.common.v1 import common_pb2
from libs.kvlayout.from_vllm import engine_kv_facts
from libs.kvlayout.layout import KvFacts, kv_layout
from tests.libs.kvlayout.fake_vllm_config import fake_vllm_config, model_folder

FACTS = KvFacts(
    model_fingerprint="m",
    block_size=16,
    kv_cache_dtype="bfloat16",
    num_layers=30,
    num_kv_heads=3,
    head_dim=64,
)


def test_every_fact_is_in_the_layout() -> None:
    assert kv_layout(FACTS) == common_pb2.KvLayout(
        model_fingerprint="m",
        block_size=16,
        kv_dtype=common_pb2.DTYPE_BFLOAT16,
        num_layers=30,
        num_kv_heads=3,
        head_dim=64,
    )


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("float32", common_pb2.DTYPE_FLOAT32),
        ("float16", common_pb2.DTYPE_FLOAT16),
        ("fp8", common_pb2.DTYPE_FP8_E4M3),
        ("fp8_e5m2", common_pb2.DTYPE_FP8_E5M2),
        ("mxint8", common_pb2.DTYPE_MXINT8),
        ("auto", common_pb2.DTYPE_UNSPECIFIED),  # must be resolved before; never guessed
        ("fp8_inc", common_pb2.DTYPE_UNSPECIFIED),
    ],
)
def test_cache_dtype_names(name: str, dtype: int) -> None:
    assert kv_layout(replace(FACTS, kv_cache_dtype=name)).kv_dtype == dtype


@pytest.mark.parametrize(
    ("model_dtype", "cache_dtype", "expected"),
    [
        (torch.float32, "auto", "float32"),
        (torch.bfloat16, "auto", "bfloat16"),
        (torch.bfloat16, "fp8_e5m2", "fp8_e5m2"),
    ],
)
def test_facts_from_vllm_name_what_the_cache_holds(
    tmp_path: Path, model_dtype: torch.dtype, cache_dtype: str, expected: str
) -> None:
    facts = engine_kv_facts(
        fake_vllm_config(model_folder(tmp_path), dtype=model_dtype, cache_dtype=cache_dtype)
    )
    assert facts.kv_cache_dtype == expected
    assert (facts.block_size, facts.num_layers, facts.num_kv_heads, facts.head_dim) == (16, 3, 2, 32)


def test_the_fingerprint_is_read_from_the_model_vllm_loaded(tmp_path: Path) -> None:
    folders = [tmp_path / name for name in ("a", "b", "c")]
    for folder in folders:
        folder.mkdir()
    same, copy, other = (model_folder(folder) for folder in folders)
    (other / "model.safetensors").write_bytes(b"\0" * 65)

    def fingerprint(model: Path) -> str:
        return engine_kv_facts(fake_vllm_config(model)).model_fingerprint

    assert fingerprint(same) == fingerprint(copy) != fingerprint(other)
