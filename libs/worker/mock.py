"""A worker's flags onto the mock engine (libs/mockengine): `--engine mock` runs the same
worker shell over a simulator of vLLM's scheduler instead of a model, for tests, benchmarks and
fleet planning. Nothing on this path imports torch or vLLM: a mock worker is a gRPC process and
a small engine-core process, so a fleet of them fits a small machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

from libs.config.roles import Role
from libs.mockengine.engine import MockEngine
from libs.mockengine.options import MockEngineOptions
from libs.worker.config import WorkerConfig


def mock_options(config: WorkerConfig, address: str) -> MockEngineOptions:
    """`address` (the worker's own gRPC address) names its engine for KV handoffs."""
    vocab_size, eos_token_id = _tokenizer_facts(Path(config.model))
    return MockEngineOptions(
        # Tokens the served model's tokenizer reads, whatever model the profile times.
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        profile=config.mock_profile,
        time_scale=config.mock_time_scale,
        served_model_name=config.served_model_name or Path(config.model).name,
        engine_id=f"mock-{config.role.value}-{address}-{os.getpid()}",
        kv_cache_bytes=config.kv_cache_bytes,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        # Only a prefill worker serves its KV; a decode worker pulls from the descriptor's host.
        kv_host=config.kv_host,
        kv_port=config.kv_port if config.role is Role.PREFILL else None,
        kv_lease_s=float(config.kv_lease_s),
        startup_s=config.mock_startup_s,
        faults=config.mock_faults,
        # A real CPU engine computes on its device group, else on every core it may use.
        cores=len(config.device_group) or len(os.sched_getaffinity(0)),
        speculative_config=json.loads(config.speculative_config) if config.speculative_config else None,
    )


def _tokenizer_facts(model: Path) -> tuple[int | None, int | None]:
    """The vocabulary size and EOS id of the model folder's config (None, None without one)."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    vocab = config.get("vocab_size")
    return (vocab if isinstance(vocab, int) else None), (eos if isinstance(eos, int) else None)


async def start_mock_engine(config: WorkerConfig, address: str) -> MockEngine:
    return await MockEngine.start(mock_options(config, address))
