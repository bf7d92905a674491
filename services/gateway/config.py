"""Gateway command line -> frozen configuration. Flag names follow qaic_disagg's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.errors import ConfigError
from libs.config.values import check_disjoint, parse_device_group, parse_key_values, parse_port
from libs.gateway.routing import POLICIES
from libs.models.spec import DEFAULT_MODEL
from libs.stack.topology import Topology, parse_mode

DEFAULT_CACHE = Path.home() / ".cache" / "cleave"


@dataclass(frozen=True)
class RoleOptions:
    port: int  # first port of the role's workers (0 = free ports)
    device_group: tuple[int, ...]
    max_num_seqs: int
    max_seq_len_to_capture: int | None
    override_qaic_config: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    model: str
    served_model_name: str | None
    cache_dir: Path
    mode: Topology
    # Addresses of running services; when all are empty the gateway starts a local stack.
    tokenizer_address: str | None
    prefill_addresses: tuple[str, ...]
    decode_addresses: tuple[str, ...]
    colocated_addresses: tuple[str, ...]
    routing: str
    max_model_len: int
    kv_cache_dtype: str
    dtype: str
    generation_config: str
    decode_speculative_config: str | None
    prefill: RoleOptions
    decode: RoleOptions
    log_level: str
    log_json: bool
    startup_timeout_s: float
    # Fleet-wide prefix KV: an existing kvstore's address for the local stack's workers, or
    # `kvstore` to have the local stack start one (CPU tier, plus Redis when a URL is given).
    kvstore: bool = False
    kvstore_address: str | None = None
    kvstore_cpu_bytes: str = "1GiB"
    kvstore_redis_url: str | None = None

    @property
    def uses_kvstore(self) -> bool:
        return self.kvstore or self.kvstore_address is not None

    @property
    def launches_stack(self) -> bool:
        return not (self.prefill_addresses or self.decode_addresses or self.colocated_addresses)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Cleave gateway: one OpenAI-compatible endpoint over prefill/decode workers."
    )
    add = p.add_argument
    add("--host", default="127.0.0.1")
    add("--port", default="8000")
    add("--model", default=DEFAULT_MODEL, help="'smollm2', a local Hugging Face folder or a .gguf file")
    add("--served-model-name", default=None)
    add("--cache-dir", type=Path, default=DEFAULT_CACHE, help="converted models and local-stack logs")
    add("--mode", default="1p1d", help="local stack topology: 'pd' (colocated) or 'XpYd', e.g. 1p1d, 2p1d")
    add("--tokenizer", default=None, help="address of a running tokenizer service")
    add("--prefill-workers", default="", help="comma-separated addresses of running prefill workers")
    add("--decode-workers", default="", help="comma-separated addresses of running decode workers")
    add("--pd-workers", default="", help="comma-separated addresses of running colocated workers")
    add("--routing", default="least_load", help="routing policy: " + ", ".join(sorted(POLICIES)))
    add("--max-model-len", type=int, default=2048)
    add("--kv-cache-dtype", default="auto")
    add("--dtype", default="auto", help="model dtype: auto (bfloat16 on CPU), bfloat16, float32")
    add("--generation-config", default="vllm")
    add(
        "--decode-speculative-config",
        default=None,
        help='JSON, e.g. {"method": "ngram", "num_speculative_tokens": 5}',
    )
    for role in ("prefill", "decode"):
        add(f"--{role}-port", default="0", help=f"first gRPC port of the {role} workers (0 = free ports)")
        add(f"--{role}-device-group", default="", help="cores (CPU) or devices: '0..15', '0,2,4', '3'")
        add(f"--{role}-max-num-seqs", type=int, default=8)
        add(f"--{role}-max-seq-len-to-capture", type=int, default=None)
        add(f"--{role}-override-qaic-config", default="", help="'k:v k:v' for the QAIC platform plugin")
    add("--allow-device-overlap", action="store_true", help="let prefill and decode share devices")
    add("--log-level", default="info")
    add("--log-json", action="store_true")
    add("--startup-timeout-s", type=float, default=900.0)
    add(
        "--kvstore",
        action="store_true",
        help="local stack: start a kvstore; workers share prompt-prefix KV through it",
    )
    add("--kvstore-address", default=None, help="local stack: workers use this running kvstore (host:port)")
    add("--kvstore-cpu-bytes", default="1GiB", help="the local kvstore's CPU memory tier")
    add(
        "--kvstore-redis-url",
        default=None,
        help="the local kvstore's Redis tier, e.g. redis://127.0.0.1:6379",
    )
    return p


def _addresses(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def _role(args: argparse.Namespace, role: str) -> RoleOptions:
    group_text = getattr(args, f"{role}_device_group")
    return RoleOptions(
        port=parse_port(f"--{role}-port", getattr(args, f"{role}_port")),
        device_group=parse_device_group(f"--{role}-device-group", group_text) if group_text else (),
        max_num_seqs=getattr(args, f"{role}_max_num_seqs"),
        max_seq_len_to_capture=getattr(args, f"{role}_max_seq_len_to_capture"),
        override_qaic_config=parse_key_values(
            f"--{role}-override-qaic-config", getattr(args, f"{role}_override_qaic_config")
        ),
    )


def parse_args(argv: Sequence[str] | None = None) -> GatewayConfig:
    args = build_parser().parse_args(argv)
    if args.routing not in POLICIES:
        raise ConfigError("--routing", args.routing, "one of " + ", ".join(sorted(POLICIES)))
    prefill, decode = _role(args, "prefill"), _role(args, "decode")
    check_disjoint(
        "--prefill-device-group",
        prefill.device_group,
        "--decode-device-group",
        decode.device_group,
        allow=args.allow_device_overlap,
    )
    config = GatewayConfig(
        host=args.host,
        port=parse_port("--port", args.port),
        model=args.model,
        served_model_name=args.served_model_name,
        cache_dir=args.cache_dir,
        mode=parse_mode(args.mode),
        tokenizer_address=args.tokenizer,
        prefill_addresses=_addresses(args.prefill_workers),
        decode_addresses=_addresses(args.decode_workers),
        colocated_addresses=_addresses(args.pd_workers),
        routing=args.routing,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        dtype=args.dtype,
        generation_config=args.generation_config,
        decode_speculative_config=args.decode_speculative_config,
        prefill=prefill,
        decode=decode,
        log_level=args.log_level,
        log_json=args.log_json,
        startup_timeout_s=args.startup_timeout_s,
        kvstore=args.kvstore,
        kvstore_address=args.kvstore_address,
        kvstore_cpu_bytes=args.kvstore_cpu_bytes,
        kvstore_redis_url=args.kvstore_redis_url,
    )
    if config.kvstore and config.kvstore_address:
        raise ConfigError(
            "--kvstore", True, "either --kvstore (start one) or --kvstore-address (use one), not both"
        )
    if not config.launches_stack and not config.tokenizer_address:
        raise ConfigError(
            "--tokenizer", None, "the tokenizer service's address when worker addresses are given"
        )
    return config
