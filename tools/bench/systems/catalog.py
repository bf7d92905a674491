"""The serving systems the comparison starts, as plain data: each system's processes (command
line and environment), its endpoint, and where its Prometheus metrics are.

Fairness: every system gets the same weights folder, dtype, max-model-len, KV cache size
(1 GiB, Cleave's worker default, which its gateway does not expose), max-num-seqs per engine,
and the same cores; the vLLM engines get the settings Cleave's in-process engines use
(eager mode, prefix caching, vLLM's own generation defaults, seed 0).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from libs.config.flags import render
from libs.config.groups import EngineKind
from libs.gateway.config import GatewayConfig
from libs.stack.config import StackRole
from libs.stack.entry_points import ServiceKind
from libs.stack.local import colocated_groups
from libs.stack.local import split_cores as local_split_cores
from libs.stack.process import ProcessSpec
from libs.stack.topology import parse_mode
from libs.worker.config import WorkerConfig
from services.entry_points import ENTRY_POINTS
from tools.bench.systems.scrape import HistogramProbe

SYSTEMS = ("vllm", "cleave-pd", "cleave-1p1d", "cleave-1p1d-kvstore", "cleave-1p1d-conditional", "vllm-pd")
# Not run by default: tools/bench/reference_server with known latencies, to check what the
# load generators (tools/bench, GuideLLM) add to what a server does.
CALIBRATION_SYSTEMS = ("reference",)
# Not run by default either: variants of a Cleave system for A/B runs of one of its options.
VARIANT_SYSTEMS = ("cleave-pd-per-request", "cleave-2pd")
# The same stacks with every worker on the mock engine (libs/mockengine): the calibrated CPU
# profile beside the real engine (issue 29's calibration report), and the zero-time profile,
# which delivers tokens as fast as the serving layer takes them (relay capacity).
MOCK_SYSTEMS = ("cleave-pd-mock", "cleave-1p1d-mock", "cleave-pd-mock-zero", "cleave-pd-mock-h100")
REFERENCE_TTFT_MS = 200
REFERENCE_ITL_MS = 50
# Cleave systems by name: (gateway --mode, whether the stack runs a kvstore).
_CLEAVE_SYSTEMS = {
    "cleave-pd": ("pd", False),
    # Two colocated workers, one per half of the cores: the all-pd fleet of 1p1d's size (issue 32).
    "cleave-2pd": ("2pd", False),
    "cleave-1p1d": ("1p1d", False),
    "cleave-1p1d-kvstore": ("1p1d", True),
    "cleave-1p1d-conditional": ("1p1d", False),
    "cleave-pd-per-request": ("pd", False),
    "cleave-pd-mock": ("pd", False),
    "cleave-1p1d-mock": ("1p1d", False),
    "cleave-pd-mock-zero": ("pd", False),
    "cleave-pd-mock-h100": ("pd", False),
}
# Mock systems: the profile their workers run (--mock-profile; a mock worker picks the profile's
# coefficients for its device group's cores, as a real CPU engine computes on them).
_MOCK_PROFILES = {
    "cleave-pd-mock": "cpu-smollm2",
    "cleave-1p1d-mock": "cpu-smollm2",
    "cleave-pd-mock-zero": "zero",
    # Accelerator step times (8B on one H100): one token per stream per step, ~100 steps/s.
    "cleave-pd-mock-h100": "h100-llama3-8b",
}
# Systems whose gateway opens a Generate call per request instead of sharing one GenerateMany
# call per worker (--worker-streams; libs/gateway/fleet/shared_stream.py).
_PER_REQUEST_STREAMS = frozenset({"cleave-pd-per-request"})
# Systems whose gateway runs --disagg-policy conditional (libs/gateway/serving/disaggregation.py).
_CONDITIONAL = frozenset({"cleave-1p1d-conditional"})
# NIXL's progress thread: Cleave's workers poll every --nixl-progress-delay-us (default 1000);
# vLLM's NixlConnector as shipped creates its agent through nixl's Python API, which sets
# pthrDelay = 0 (busy polling: one core per engine). vllm-pd gets Cleave's interval by default.
CLEAVE_NIXL_PROGRESS_DELAY_US = cast(int, WorkerConfig.__dataclass_fields__["nixl_progress_delay_us"].default)
VLLM_NIXL_PROGRESS_DELAY_US = 0
CLEAVE_PREFIX = "cleave-"
HOST = "127.0.0.1"

# Cleave's workers get 1 GiB of CPU KV cache (services/worker --cpu-kv-cache-gib default);
# vLLM's CPU backend takes the same from VLLM_CPU_KVCACHE_SPACE (an integer, GiB).
KV_CACHE_GIB = 1
# What Cleave's vLLM engine gets by default (vLLM's SchedulerConfig default); the
# OpenAI server would also pick 2048 on CPU, but only by a different rule, so it is pinned.
MAX_NUM_BATCHED_TOKENS = 2048

_PREFILL_STAGE = "prefill_stage_ms"
_ENGINE_PREFILL = "engine_prefill_ms"
_KV_TRANSFER = "kv_transfer_ms"

_COLOCATED = "n/a: colocated"
_CLEAVE_UNMEASURED = {
    _ENGINE_PREFILL: (
        "not measured: the worker's cleave_worker_prefill_seconds is only exported with --metrics-port,"
        " which the gateway's local stack does not pass"
    ),
}

# Column labels and what each stage number means, for the reports.
STAGE_LABELS = {
    _PREFILL_STAGE: "prefill stage",
    _ENGINE_PREFILL: "engine prefill",
    _KV_TRANSFER: "KV transfer",
}
STAGE_DESCRIPTIONS = {
    _PREFILL_STAGE: "prefill request as the router sees it (queue + prompt compute + RPC), mean ms",
    _ENGINE_PREFILL: "vLLM engine's prefill phase (scheduled -> first token), mean ms",
    _KV_TRANSFER: "NIXL KV pull on the decode engine, mean ms",
}


@dataclass(frozen=True)
class ServingSettings:
    model_path: Path
    served_name: str = "smollm2"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    max_num_seqs: int = 8
    cores: tuple[int, ...] = (0, 1)
    python: str = sys.executable
    startup_timeout_s: float = 900.0
    # None: vLLM's own NixlConnector as shipped (its NIXL progress thread busy-polls a core).
    # A number: Cleave's NixlConnector subclass with this poll interval, as Cleave's workers use.
    vllm_pd_progress_delay_us: int | None = None
    # A profile (name or path) for every mock system instead of its own: the served
    # calibration (tools/bench/calibrate_served.py) runs a mock stack on coefficients it fitted.
    mock_profile: str | None = None

    def __post_init__(self) -> None:
        if not self.cores:
            raise ValueError("no cores to run on")
        if len(set(self.cores)) != len(self.cores):
            raise ValueError(f"cores listed twice: {self.cores}")


@dataclass(frozen=True)
class SystemPlan:
    name: str
    base_url: str  # the OpenAI-compatible endpoint the benchmark talks to
    processes: tuple[ProcessSpec, ...]  # started in this order, stopped in reverse
    metrics_urls: dict[str, str] = field(default_factory=dict)  # source label -> /metrics URL
    probes: tuple[HistogramProbe, ...] = ()
    # Shown instead of a number for stages without a probe: n/a (the system has no such
    # stage) or not measured (it has one, nothing times it), with the reason.
    stage_notes: dict[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def is_cleave(self) -> bool:
        return self.name.startswith(CLEAVE_PREFIX)


PortSource = Callable[[], int]


def core_list(cores: Sequence[int]) -> str:
    """(0, 1) -> '0-1', (0, 2, 3, 4) -> '0,2-4': a list both vLLM's VLLM_CPU_OMP_THREADS_BIND and
    Cleave's --*-device-group accept."""
    parts: list[str] = []
    ordered = sorted(cores)
    start = previous = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == previous + 1:
            previous = core
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if core is not None:
            start = previous = core
    return ",".join(parts)


def split_cores(cores: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Cleave's local-stack split (libs/stack/local.py); disaggregated systems need 2 cores."""
    prefill, decode = local_split_cores(tuple(cores))
    if not prefill:
        raise ValueError(f"a disaggregated system needs at least 2 cores, got {list(cores)}")
    return prefill, decode


def _vllm_server(
    name: str,
    settings: ServingSettings,
    port: int,
    cores: Sequence[int],
    kv_transfer: dict[str, Any] | None = None,
    side_channel_port: int | None = None,
) -> ProcessSpec:
    argv = [
        settings.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(settings.model_path),
        "--served-model-name", settings.served_name,
        "--host", HOST,
        "--port", str(port),
        "--max-model-len", str(settings.max_model_len),
        "--dtype", settings.dtype,
        "--max-num-seqs", str(settings.max_num_seqs),
        "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--generation-config", "vllm",
        "--seed", "0",
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": core_list(cores),
        # Prefix-cache block hashes must agree across processes (Cleave's workers set it too).
        "PYTHONHASHSEED": "0",
    }
    if kv_transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer, separators=(",", ":"))]
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = HOST
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port)
    return ProcessSpec(name, tuple(argv), env, f"http://{HOST}:{port}/health")


def _kv_transfer_config(role: str, settings: ServingSettings) -> dict[str, Any]:
    config: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    if settings.vllm_pd_progress_delay_us is not None:
        config["kv_connector_module_path"] = "libs.worker.vllm_nixl_connector"
        config["kv_connector_extra_config"] = {"nixl_progress_delay_us": settings.vllm_pd_progress_delay_us}
    return config


def _plan_vllm(settings: ServingSettings, ports: PortSource) -> SystemPlan:
    port = ports()
    url = f"http://{HOST}:{port}"
    return SystemPlan(
        "vllm",
        url,
        (_vllm_server("vllm", settings, port, settings.cores),),
        metrics_urls={"server": f"{url}/metrics"},
        probes=(HistogramProbe(_ENGINE_PREFILL, "server", "vllm:request_prefill_time_seconds"),),
        stage_notes={_PREFILL_STAGE: _COLOCATED, _KV_TRANSFER: _COLOCATED},
        description=f"vLLM OpenAI server, one engine on cores {core_list(settings.cores)}",
    )


def _plan_vllm_pd(settings: ServingSettings, ports: PortSource) -> SystemPlan:
    prefill_cores, decode_cores = split_cores(settings.cores)
    prefill_port, decode_port, proxy_port = ports(), ports(), ports()
    prefill_side, decode_side = ports(), ports()
    prefill_url, decode_url = f"http://{HOST}:{prefill_port}", f"http://{HOST}:{decode_port}"
    proxy_url = f"http://{HOST}:{proxy_port}"
    prefill = _vllm_server(
        "vllm-pd-prefill", settings, prefill_port, prefill_cores,
        _kv_transfer_config("kv_producer", settings), prefill_side,
    )  # fmt: skip
    decode = _vllm_server(
        "vllm-pd-decode", settings, decode_port, decode_cores,
        _kv_transfer_config("kv_consumer", settings), decode_side,
    )  # fmt: skip
    proxy = ProcessSpec(
        "vllm-pd-proxy",
        (
            settings.python,
            "-m",
            "tools.vllm_disagg_proxy.main",
            "--host",
            HOST,
            "--port",
            str(proxy_port),
            "--prefill",
            prefill_url,
            "--decode",
            decode_url,
        ),
        health_url=f"{proxy_url}/health",
    )
    connector = (
        "vLLM's NixlConnector"
        if settings.vllm_pd_progress_delay_us is None
        else (
            f"Cleave's NixlConnector subclass (NIXL poll {settings.vllm_pd_progress_delay_us} us,"
            " each engine's threads kept on its cores)"
        )
    )
    return SystemPlan(
        "vllm-pd",
        proxy_url,
        (prefill, decode, proxy),
        metrics_urls={
            "proxy": f"{proxy_url}/metrics",
            "prefill": f"{prefill_url}/metrics",
            "decode": f"{decode_url}/metrics",
        },
        probes=(
            HistogramProbe(_PREFILL_STAGE, "proxy", "vllm_disagg_proxy_prefill_seconds"),
            HistogramProbe(_ENGINE_PREFILL, "prefill", "vllm:request_prefill_time_seconds"),
            HistogramProbe(_KV_TRANSFER, "decode", "vllm:nixl_xfer_time_seconds"),
        ),
        description=(
            f"two vLLM OpenAI servers ({connector}), prefill on cores {core_list(prefill_cores)}, "
            f"decode on cores {core_list(decode_cores)}, behind tools/vllm_disagg_proxy"
        ),
    )


def _gateway_config(settings: ServingSettings, mode: str, port: int) -> GatewayConfig:
    role = StackRole(max_num_seqs=settings.max_num_seqs)
    return GatewayConfig(
        mode=parse_mode(mode),
        host=HOST,
        port=port,
        model=str(settings.model_path),
        served_model_name=settings.served_name,
        max_model_len=settings.max_model_len,
        dtype=settings.dtype,
        prefill=role,
        decode=role,
        startup_timeout_s=float(int(settings.startup_timeout_s)),
    )


def _plan_cleave(settings: ServingSettings, ports: PortSource, name: str) -> SystemPlan:
    mode, kvstore = _CLEAVE_SYSTEMS[name]
    port = ports()
    url = f"http://{HOST}:{port}"
    config = _gateway_config(settings, mode, port)
    if mode.endswith("pd"):
        # Colocated workers take the decode options: one engine gets every core, as vLLM does;
        # several split them (libs/stack/local.py colocated_groups), as prefill and decode do.
        config = replace(config, decode=replace(config.decode, device_group=tuple(sorted(settings.cores))))
        if mode == "pd":
            description = f"Cleave gateway, one colocated worker on cores {core_list(settings.cores)}"
        else:
            groups = colocated_groups(config, tuple(sorted(settings.cores)))
            description = f"Cleave gateway, {mode}: colocated workers on cores " + ", ".join(
                core_list(group) for group in groups
            )
        probes: tuple[HistogramProbe, ...] = ()
        notes = {
            _PREFILL_STAGE: _COLOCATED,
            _ENGINE_PREFILL: _CLEAVE_UNMEASURED[_ENGINE_PREFILL],
            _KV_TRANSFER: _COLOCATED,
        }
    else:
        prefill_cores, decode_cores = split_cores(settings.cores)
        config = replace(
            config,
            prefill=replace(config.prefill, device_group=prefill_cores),
            decode=replace(config.decode, device_group=decode_cores),
        )
        description = (
            f"Cleave gateway, {mode}: prefill on cores {core_list(prefill_cores)}, "
            f"decode on cores {core_list(decode_cores)}"
        )
        probes = (
            HistogramProbe(_PREFILL_STAGE, "gateway", "cleave_gateway_stage_seconds", {"stage": "prefill"}),
            # The decode workers' NIXL telemetry, re-exported by the gateway from polled stats.
            HistogramProbe(_KV_TRANSFER, "gateway", "cleave_gateway_worker_kv_pull_seconds"),
        )
        notes = {_ENGINE_PREFILL: _CLEAVE_UNMEASURED[_ENGINE_PREFILL]}
    if name in _CONDITIONAL:
        config = replace(config, disagg_policy="conditional")
        description += (
            f"; conditional disaggregation (prompts of <= {config.local_prefill_max_tokens} uncached tokens,"
            " or long ones while prefill is backed up, prefill on the decode worker)"
        )
    if name in _MOCK_PROFILES:
        profile = settings.mock_profile or _MOCK_PROFILES[name]
        config = replace(config, engine=EngineKind.MOCK, mock_profile=profile, mock_startup_s=0.0)
        description += f"; every worker on the mock engine (profile {profile}, simulated)"
    if name in _PER_REQUEST_STREAMS:
        config = replace(config, worker_streams="per-request")
        description += "; a Generate call per request (--worker-streams per-request)"
    if kvstore:
        # Prefill workers save full 256-token chunks to the kvstore; the gateway sends a prompt
        # straight to decode when the kvstore holds all but a short tail of it, and the decode
        # worker loads the prefix. The prefill stage's n then counts the requests not skipped.
        config = replace(config, kvstore=True)
        description += "; a kvstore (CPU tier) shares prompt-prefix KV, prefill skipped on a hit"
    argv = (settings.python, "-m", ENTRY_POINTS.module(ServiceKind.GATEWAY), *render(config))
    spec = ProcessSpec(name, argv, {}, f"{url}/ready")
    return SystemPlan(
        name,
        url,
        (spec,),
        metrics_urls={"gateway": f"{url}/metrics"},
        probes=probes,
        stage_notes=notes,
        description=description,
    )


def _plan_reference(settings: ServingSettings, ports: PortSource) -> SystemPlan:
    port = ports()
    url = f"http://{HOST}:{port}"
    argv = (
        settings.python, "-m", "tools.bench.reference_server",
        "--host", HOST,
        "--port", str(port),
        "--model", settings.served_name,
        "--ttft-ms", str(REFERENCE_TTFT_MS),
        "--itl-ms", str(REFERENCE_ITL_MS),
    )  # fmt: skip
    no_stages = "n/a: a fixed-latency server"
    return SystemPlan(
        "reference",
        url,
        (ProcessSpec("reference", argv, {}, f"{url}/health"),),
        stage_notes={_PREFILL_STAGE: no_stages, _ENGINE_PREFILL: no_stages, _KV_TRANSFER: no_stages},
        description=(
            f"tools/bench/reference_server: first chunk after {REFERENCE_TTFT_MS} ms, "
            f"then one every {REFERENCE_ITL_MS} ms; no model"
        ),
    )


def plan_system(name: str, settings: ServingSettings, ports: PortSource) -> SystemPlan:
    """The processes and endpoints of one system; ports come from `ports()` (free ports)."""
    if name == "reference":
        return _plan_reference(settings, ports)
    if name == "vllm":
        return _plan_vllm(settings, ports)
    if name == "vllm-pd":
        return _plan_vllm_pd(settings, ports)
    if name in _CLEAVE_SYSTEMS:
        return _plan_cleave(settings, ports, name)
    known = SYSTEMS + CALIBRATION_SYSTEMS + VARIANT_SYSTEMS + MOCK_SYSTEMS
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(known)}")
