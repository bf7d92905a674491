"""A worker's configuration: parsed once at the process edge, passed everywhere else."""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import NON_NEGATIVE_INT, PORT, POSITIVE_INT, enum_of
from libs.config.errors import ConfigError
from libs.config.flags import INT, Codec, flag
from libs.config.groups import (
    EngineFlags,
    GrpcSecurityFlags,
    GrpcServingFlags,
    KvStoreClientFlags,
    LoggingFlags,
    ModelFlags,
    RoleFlags,
    ServerFlags,
)
from libs.config.roles import Role
from libs.worker.speculative import Method, SpeculativeSpec, parse_speculative_config


def _parse_hosts(flag_name: str, text: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    for host in hosts:
        if "/" in host:  # a network: every address in it is trusted (libs/worker/handoff.py)
            try:
                ipaddress.ip_network(host, strict=False)
            except ValueError:
                raise ConfigError(
                    flag_name, text, f"an address network such as 10.244.0.0/16; bad item {host!r}"
                ) from None
        elif ":" in host and not _is_ip(host.strip("[]")):  # host:port, not an IPv6 address
            raise ConfigError(flag_name, text, f"comma-separated hosts without ports; bad item {host!r}")
    return hosts


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


HOSTS: Codec[tuple[str, ...]] = Codec(_parse_hosts, ",".join)


def _parse_names(flag_name: str, text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if "/" in name or ":" in name or _is_ip(name):
            raise ConfigError(flag_name, text, f"comma-separated DNS names without ports; bad item {name!r}")
    return names


NAMES: Codec[tuple[str, ...]] = Codec(_parse_names, ",".join)


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    QAIC = "qaic"


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(
    ServerFlags,
    GrpcServingFlags,
    LoggingFlags,
    ModelFlags,
    EngineFlags,
    RoleFlags,
    KvStoreClientFlags,
    GrpcSecurityFlags,
):
    """Cleave engine worker (vLLM): prefill, decode or both."""

    role: Role = flag(Role.BOTH, codec=enum_of(Role), help="prefill, decode or both (colocated)")
    device: Device = flag(Device.CPU, codec=enum_of(Device), help="cpu, cuda or qaic")
    metrics_port: int | None = flag(None, codec=PORT, help="Prometheus /metrics port (unset = off)")
    # 127.0.0.1 by default: a scraper on another host (Prometheus in a cluster) needs the pod's
    # address, e.g. 0.0.0.0 behind a NetworkPolicy (deploy/k8s).
    metrics_host: str = flag("127.0.0.1", help="address /metrics listens on (with --metrics-port)")
    block_size: int | None = flag(None, codec=POSITIVE_INT, help="KV block size in tokens (default: vLLM's)")
    # KV handoff (NIXL) side channel this worker listens on (prefill) or uses (decode).
    kv_host: str = flag("127.0.0.1", help="NIXL side-channel host")
    kv_port: int = flag(0, codec=PORT, help="NIXL side-channel port (0 = a free port picked at start)")
    kv_lease_s: int = flag(30, codec=INT, help="seconds prefilled KV waits for its decode worker")
    # Decode side: a handoff descriptor makes vLLM connect to its host; see libs/worker/handoff.py.
    kv_allowed_hosts: tuple[str, ...] = flag(
        (),
        codec=HOSTS,
        help="hosts or networks (comma-separated, e.g. 10.244.0.0/16) whose prefill KV a decode "
        "worker pulls, besides loopback and its own --kv-host",
    )
    # Kubernetes: the prefill workers' headless Service, whose answer is the ready prefill pods
    # (peers.py): no network range written into the manifests.
    kv_allowed_dns: tuple[str, ...] = flag(
        (),
        codec=NAMES,
        help="host names (comma-separated, e.g. the prefill workers' headless Service) whose DNS "
        "addresses a decode worker pulls KV from, looked up again when a handoff names a new one",
    )
    nixl_progress_delay_us: int = flag(
        1000,
        codec=INT,
        help="NIXL progress-thread poll interval; 0 = NIXL's busy polling (one core per worker)",
    )
    # vLLM's flag: prompts may carry precomputed image embeddings (the encoder service's,
    # modes xEyPD / xEyPzD) instead of pixels; this worker then never runs the vision tower.
    enable_mm_embeds: bool = flag(False, help="take image embeddings from the encoder service (vLLM's flag)")
    openmp_library: str = flag(
        "auto",
        help="CPU, speculating workers: Intel OpenMP (libiomp5.so) preloaded into the engine; "
        "'auto' = the one Cleave ships, 'none' = vLLM's default (libgomp)",
    )
    # Counted across every gateway (libs/worker/capacity.py); each gateway's own
    # --max-inflight-per-worker defaults to it.
    max_inflight_requests: int = flag(
        0,
        codec=NON_NEGATIVE_INT,
        help="requests this worker runs at once, from all gateways together; one more is refused "
        "before it runs and its gateway waits for room (0 = twice --max-num-seqs)",
    )
    # Not flags: fixed for every Cleave worker.
    seed: int = 0

    @property
    def enforce_eager(self) -> bool:
        """Eager on CPU only. vLLM's CPU default compiles the model with inductor at start-up,
        which needs a C++ compiler (the images ship none) and minutes per engine on a small
        machine. On CUDA the compiled mode with CUDA graphs is vLLM's default and what
        `--*-max-seq-len-to-capture` (vLLM's max_cudagraph_capture_size) sizes; forcing eager
        there would make that flag inert and cost GPU users the graphs. Cloud AI: the platform
        plugin compiles ahead of time either way."""
        return self.device is Device.CPU

    @property
    def model_path(self) -> Path:
        """The model folder, once the entry point has resolved `--model` into one."""
        return Path(self.model)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_lease_s < 6:
            # vLLM renews leases every lease/6 seconds (integer division).
            raise ConfigError("--kv-lease-s", self.kv_lease_s, "at least 6 seconds")
        if self.nixl_progress_delay_us < 0:
            raise ConfigError("--nixl-progress-delay-us", self.nixl_progress_delay_us, "0 or more")
        if self.kvstore_chunk_tokens <= 0:
            raise ConfigError("--kvstore-chunk-tokens", self.kvstore_chunk_tokens, "a positive integer")
        if not self.kvstore_timeout_s > 0:
            raise ConfigError("--kvstore-timeout-s", self.kvstore_timeout_s, "a positive number of seconds")
        if self.speculative_config:
            spec = parse_speculative_config(self.speculative_config)  # a bad key fails here, at start-up
            if self.role is Role.PREFILL and spec.method is not Method.DRAFT_MODEL:
                raise ConfigError(
                    "--speculative-config",
                    self.speculative_config,
                    "unset on a prefill worker (it emits one token); only a draft model is given to "
                    "prefill, so that its KV for the prompt is computed and handed over too",
                )

    @property
    def speculative(self) -> SpeculativeSpec | None:
        """`--speculative-config`, checked (a ConfigError naming the bad key)."""
        if not self.speculative_config:
            return None
        return parse_speculative_config(self.speculative_config)

    @property
    def engine_kv_cache_dtype(self) -> str:
        """What vLLM's cache holds. The QAIC plugin keeps KV in MXINT8 itself (qaic_disagg's
        `--kv-cache-dtype mxint8`); elsewhere MXINT8 is only how KV travels to and rests in
        the kvstore (no CPU or CUDA attention kernel reads it), so the cache stays native."""
        if self.kv_cache_dtype == "mxint8" and self.device is not Device.QAIC:
            return "auto"
        return self.kv_cache_dtype

    @property
    def transfers_kv(self) -> bool:
        return self.role is not Role.BOTH
