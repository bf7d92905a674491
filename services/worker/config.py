"""Command line -> frozen configuration for one worker process (the only place flags are read)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.values import parse_choice, parse_device_group, parse_key_values, parse_port
from libs.worker.config import Device, Role
from services.flags import add_model_flags, add_server_flags


@dataclass(frozen=True)
class WorkerProcessConfig:
    role: Role
    model: str
    served_model_name: str | None
    model_cache_dir: Path
    host: str
    port: int
    metrics_port: int | None
    log_level: str
    log_json: bool
    device: Device
    device_group: tuple[int, ...]
    max_model_len: int
    max_num_seqs: int
    max_seq_len_to_capture: int | None
    kv_cache_dtype: str
    dtype: str
    cpu_kv_cache_gib: float
    block_size: int | None
    override_qaic_config: tuple[tuple[str, str], ...]
    speculative_config: str | None
    generation_config: str
    kv_host: str
    kv_port: int
    kv_lease_s: int
    nixl_progress_delay_us: int
    kvstore_address: str | None
    kvstore_chunk_tokens: int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Cleave engine worker (vLLM): prefill, decode or both.")
    add = parser.add_argument
    add("--role", required=True, help="prefill, decode or both")
    add_model_flags(parser)
    add_server_flags(parser)
    add("--metrics-port", default=None, help="Prometheus /metrics port (unset = off)")
    add("--device", default="cpu", help="cpu, cuda or qaic")
    add("--device-group", default="", help="devices for this worker: '0..15', '0,2,4' or '3'")
    add("--max-model-len", type=int, default=2048)
    add("--max-num-seqs", type=int, default=8)
    add("--max-seq-len-to-capture", type=int, default=None)
    add("--kv-cache-dtype", default="auto")
    add("--dtype", default="auto", help="model dtype: auto (bfloat16 on CPU), bfloat16, float16, float32")
    add("--cpu-kv-cache-gib", type=float, default=1.0)
    add("--block-size", type=int, default=None)
    add("--override-qaic-config", default="", help="'k:v k:v', passed to the QAIC platform plugin")
    add(
        "--speculative-config",
        default=None,
        help='JSON, e.g. {"method": "ngram", "num_speculative_tokens": 5}',
    )
    add("--generation-config", default="vllm")
    add("--kv-host", default="127.0.0.1", help="NIXL side-channel host")
    add("--kv-port", default="5600", help="NIXL side-channel port")
    add("--kv-lease-s", type=int, default=30, help="seconds prefilled KV waits for its decode worker")
    add(
        "--nixl-progress-delay-us",
        type=int,
        default=1000,
        help="NIXL progress-thread poll interval; 0 = NIXL's default busy polling (one core per worker)",
    )
    add(
        "--kvstore-address",
        default=None,
        help="host:port of the kvstore (fleet-wide prefix KV); unset = none",
    )
    add("--kvstore-chunk-tokens", type=int, default=256, help="must equal the kvstore's --chunk-tokens")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> WorkerProcessConfig:
    args = build_parser().parse_args(argv)
    return WorkerProcessConfig(
        role=Role(parse_choice("--role", args.role, [r.value for r in Role])),
        model=args.model,
        served_model_name=args.served_model_name,
        model_cache_dir=args.model_cache_dir,
        host=args.host,
        port=parse_port("--port", args.port),
        metrics_port=None if args.metrics_port is None else parse_port("--metrics-port", args.metrics_port),
        log_level=args.log_level,
        log_json=args.log_json,
        device=Device(parse_choice("--device", args.device, [d.value for d in Device])),
        device_group=parse_device_group("--device-group", args.device_group) if args.device_group else (),
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_seq_len_to_capture=args.max_seq_len_to_capture,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        block_size=args.block_size,
        override_qaic_config=parse_key_values("--override-qaic-config", args.override_qaic_config),
        speculative_config=args.speculative_config,
        generation_config=args.generation_config,
        kv_host=args.kv_host,
        kv_port=parse_port("--kv-port", args.kv_port),
        kv_lease_s=args.kv_lease_s,
        nixl_progress_delay_us=args.nixl_progress_delay_us,
        kvstore_address=args.kvstore_address,
        kvstore_chunk_tokens=args.kvstore_chunk_tokens,
    )
