"""The flag groups Cleave's services are made of. Each flag is spelled here once.

A service's config inherits the groups it needs (`class WorkerConfig(ServerFlags, ...)`);
the gateway holds one `RoleFlags` per role under a prefix (`--prefill-*`, `--decode-*`) and
hands them to the workers it launches with `libs.config.flags.compose`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import BYTES, DEVICE_GROUP, KEY_VALUES, PORT, POSITIVE_INT, enum_of
from libs.config.errors import ConfigError
from libs.config.flags import FLOAT, PATH, Codec, flag
from libs.models.spec import DEFAULT_MODEL

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "cleave"
# vLLM's ModelConfig.max_logprobs: its default and range (-1 = no cap: the vocabulary).
MAX_LOGPROBS_DEFAULT = 20


def _parse_max_logprobs(flag_name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(flag_name, text, "an integer") from None
    if number < -1:
        raise ConfigError(flag_name, text, "-1 (the whole vocabulary) or an integer >= 0")
    return number


MAX_LOGPROBS: Codec[int] = Codec(_parse_max_logprobs, str)
# vLLM's LoRAConfig.max_lora_rank choices (MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _parse_lora_rank(flag_name: str, text: str) -> int:
    if text.strip() not in {str(rank) for rank in LORA_RANKS}:
        raise ConfigError(flag_name, text, "one of " + ", ".join(str(rank) for rank in LORA_RANKS))
    return int(text)


LORA_RANK: Codec[int] = Codec(_parse_lora_rank, str)


@dataclass(frozen=True, kw_only=True)
class ServerFlags:
    host: str = flag("127.0.0.1", help="address to listen on")
    port: int = flag(0, codec=PORT, help="port to listen on (0 = any free port; the bound one is logged)")
    # Launchers start children with --port 0 and read the bound port from this file, so no
    # port is ever picked by one process and bound by another (a race lost in 2 of ~16
    # stack starts when the bind came after a 40-80 s model load).
    port_file: Path | None = flag(
        None, codec=PATH, help="write the bound port to this file once listening (for launchers)"
    )


# The seconds a gRPC service takes from SIGTERM to its exit, at most: 5 s under Kubernetes'
# default terminationGracePeriodSeconds (30), so a pod with the default grace is never
# SIGKILLed while it drains. Deployments with a longer grace raise both (deploy/).
DEFAULT_SHUTDOWN_GRACE_S = 25.0


@dataclass(frozen=True, kw_only=True)
class GrpcServingFlags:
    """How a gRPC service is probed and how it stops (libs/rpc/server.py)."""

    shutdown_grace_s: float = flag(
        DEFAULT_SHUTDOWN_GRACE_S,
        codec=FLOAT,
        help="seconds from SIGTERM to exit, at most: health says NOT_SERVING at once, new calls "
        "are refused, running ones finish (a worker hands what is left to others before the end); "
        "keep it under the pod's terminationGracePeriodSeconds",
    )
    health_port: int | None = flag(
        None,
        codec=PORT,
        help="also serve the gRPC health service alone, in plaintext, on this port (probes that "
        "speak neither TLS nor the token: Kubernetes' grpc probe); unset = only on --port",
    )

    def __post_init__(self) -> None:
        if not self.shutdown_grace_s >= 0:  # also refuses nan
            raise ConfigError("--shutdown-grace-s", self.shutdown_grace_s, "a number of seconds >= 0")


@dataclass(frozen=True, kw_only=True)
class LoggingFlags:
    log_level: str = flag("info", help="debug, info, warning or error")
    log_json: bool = flag(False, help="one JSON object per log line")
    # qaic_disagg's launch commands end in `-v -v -v`.
    verbose: int = flag(
        0, count=True, name="-v", help="more detail: -v = debug logs, -v -v = the engine's too"
    )

    @property
    def effective_log_level(self) -> str:
        return "debug" if self.verbose else self.log_level


@dataclass(frozen=True, kw_only=True)
class ModelFlags:
    model: str = flag(DEFAULT_MODEL, help="'smollm2', a local Hugging Face folder or a .gguf file")
    served_model_name: str | None = flag(None, help="the name clients use (default: the model's own)")
    model_cache_dir: Path = flag(
        DEFAULT_CACHE_DIR / "models", codec=PATH, help="where models converted from GGUF are kept"
    )
    allow_model_download: bool = flag(
        False,
        help="download a hub id (org/name) missing from the local Hugging Face cache "
        "(off: never go online; HF_HUB_OFFLINE=1 also forbids it)",
    )
    max_model_len: int | None = flag(
        None, codec=POSITIVE_INT, help="context length, prompt + generated tokens (default: the model's own)"
    )


class EngineKind(enum.Enum):
    VLLM = "vllm"
    MOCK = "mock"


@dataclass(frozen=True, kw_only=True)
class EngineFlags:
    """Engine settings every worker of one stack must share (KV moves between them)."""

    dtype: str = flag("auto", help="model dtype: auto (bfloat16 on CPU), bfloat16, float16, float32")
    kv_cache_dtype: str = flag(
        "auto", help="vLLM cache dtype; mxint8 = Cloud AI's cache, elsewhere the kvstore's format"
    )
    # vLLM's default is "auto": a client that sets no temperature gets the model's own (e.g.
    # Llama-3.2-Instruct's 0.6), as from `vllm serve`. qaic_disagg's commands pass "vllm".
    generation_config: str = flag(
        "auto",
        help="'auto' (the model's generation_config.json, vLLM's default) or 'vllm' (vLLM's sampling defaults)",
    )
    # vLLM's --max-logprobs and default: the most logprobs (sampled, top and prompt) a request
    # may ask for per position; the workers report it and the gateway refuses more with
    # vLLM's message (libs/gateway/api/logprob_limits.py).
    max_logprobs: int = flag(
        MAX_LOGPROBS_DEFAULT,
        codec=MAX_LOGPROBS,
        help="most logprobs a request may ask for per token (logprobs, top_logprobs, "
        "prompt_logprobs); -1 = the whole vocabulary (vLLM's flag and default)",
    )
    # vLLM's --structured-outputs-config: its xgrammar backend reads disable_any_whitespace only
    # from the engine's config (a request's own option does not reach it).
    structured_outputs_config: str | None = flag(
        None,
        help="vLLM's structured-outputs config as JSON for every engine, e.g. "
        '\'{"backend": "xgrammar", "disable_any_whitespace": true}\' (no whitespace between JSON tokens)',
    )
    # vLLM's LoRA flags, given to every worker: a request naming an adapter is served with it
    # on prefill and decode alike (the gateway's --lora-modules names the adapters).
    enable_lora: bool = flag(False, help="serve LoRA adapters (vLLM's flag)")
    max_loras: int = flag(
        1, codec=POSITIVE_INT, help="adapters one engine step may apply at once (vLLM's flag)"
    )
    max_lora_rank: int = flag(16, codec=LORA_RANK, help="the highest adapter rank served (vLLM's flag)")
    max_cpu_loras: int | None = flag(
        None, codec=POSITIVE_INT, help="adapters each engine keeps in CPU memory (default: --max-loras)"
    )
    # The mock engine (libs/mockengine): a simulator of vLLM's scheduler without a model, for
    # tests, benchmarks and fleet planning; never for users (its tokens are not a model's).
    engine: EngineKind = flag(
        EngineKind.VLLM,
        codec=enum_of(EngineKind),
        help="vllm (the model), or mock: a simulator of vLLM's scheduler and KV cache whose "
        "step times come from --mock-profile (tests, benchmarks, fleet planning; not for users)",
    )
    mock_profile: str = flag(
        "cpu-smollm2",
        help="mock engine: a profile under libs/mockengine/profiles (cpu-smollm2, h100-llama3-8b, "
        "zero) or a path to one: the model's facts and the step-time coefficients",
    )
    mock_time_scale: float = flag(
        1.0, codec=FLOAT, help="mock engine: multiplies every simulated duration (10 = ten times slower)"
    )
    mock_startup_s: float | None = flag(
        None, codec=FLOAT, help="mock engine: seconds before it serves (default: the profile's, a real start)"
    )


class CpuBinding(enum.Enum):
    """Where a CPU engine's OpenMP threads run (vLLM's VLLM_CPU_OMP_THREADS_BIND)."""

    CORES = "cores"  # one thread per core of the device group, or of every usable core
    AUTO = "auto"  # vLLM's choice: leaves a core per engine to its EngineCore process
    NOBIND = "nobind"  # no binding: OpenMP's and the kernel's defaults


@dataclass(frozen=True, kw_only=True)
class RoleFlags:
    """Settings of one worker role; the gateway spells them --prefill-NAME / --decode-NAME."""

    device_group: tuple[int, ...] = flag(
        (), codec=DEVICE_GROUP, help="cores (CPU) or device ids: '0..15', '0,2,4' or '3' (default: all)"
    )
    cpu_binding: CpuBinding = flag(
        CpuBinding.CORES,
        codec=enum_of(CpuBinding),
        help="CPU: 'cores' (threads on every core of the device group), 'auto' (vLLM's binding) or 'nobind'",
    )
    max_num_seqs: int = flag(8, codec=POSITIVE_INT, help="sequences the engine runs at once")
    max_seq_len_to_capture: int | None = flag(
        None, codec=POSITIVE_INT, help="longest sequence captured in a CUDA/QAIC graph"
    )
    override_qaic_config: tuple[tuple[str, str], ...] = flag(
        (), codec=KEY_VALUES, help="'k:v k:v' for the Cloud AI platform plugin"
    )
    speculative_config: str | None = flag(
        None, help='JSON, decode only, e.g. {"method": "ngram", "num_speculative_tokens": 5}'
    )
    kv_cache_bytes: int | None = flag(
        None, codec=BYTES, help="KV cache size, e.g. 2GiB (default: 1GiB on CPU, vLLM's share of GPU memory)"
    )
    mock_faults: str = flag(
        "",
        help="mock engine: faults to inject, e.g. 'crash-at-step=50', 'stall-at-step=20:5', "
        "'refuse-pulls=2' (libs/mockengine/faults.py)",
    )


@dataclass(frozen=True, kw_only=True)
class KvStoreClientFlags:
    kvstore_address: str | None = flag(
        None, help="host:port of the kvstore (fleet-wide prefix KV); unset = none"
    )
    kvstore_chunk_tokens: int = flag(256, codec=POSITIVE_INT, help="must equal the kvstore's --chunk-tokens")
    # vLLM's scheduler and model runner wait on these calls: a slow kvstore costs each engine
    # step at most this, then the prompt is computed here instead.
    kvstore_timeout_s: float = flag(
        2.0, codec=FLOAT, help="deadline of each kvstore call the engine waits on (Lookup, Get), seconds"
    )


@dataclass(frozen=True, kw_only=True)
class ToolParserFlags:
    # vLLM's flag and name: the tokenizer service parses `tool_choice: auto` answers with it.
    tool_call_parser: str | None = flag(
        None,
        help="vLLM's tool parser for `tool_choice: auto` answers (e.g. hermes, llama3_json); "
        "needed by --enable-auto-tool-choice",
    )


@dataclass(frozen=True, kw_only=True)
class ChatTemplateFlags:
    # vLLM's flag: a model without a (tool-aware) template gets one; read by the tokenizer.
    chat_template: str | None = flag(
        None,
        help="vLLM's --chat-template: a Jinja template file, or the template itself, used instead "
        "of the model's own",
    )


@dataclass(frozen=True, kw_only=True)
class GrpcSecurityFlags:
    """Who may call Cleave's gRPC services, for every server and for the channels a service
    opens to the others. Only file paths are flags (argv is readable by every local user);
    the material is read by `libs.rpc.security.load_security` at the process's edge. The
    gateway renders this group into every child of its local stack."""

    grpc_reflection: bool = flag(False, help="serve gRPC server reflection (lists services; off by default)")
    grpc_tls_cert_file: Path | None = flag(
        None, codec=PATH, help="PEM certificate chain: servers serve TLS with it, clients present it (mTLS)"
    )
    grpc_tls_key_file: Path | None = flag(None, codec=PATH, help="PEM private key of --grpc-tls-cert-file")
    grpc_tls_ca_file: Path | None = flag(
        None,
        codec=PATH,
        help="PEM CA bundle: clients verify servers with it; servers then require client certificates "
        "(mTLS); clients use TLS when this or a certificate is given",
    )
    grpc_tls_server_name: str | None = flag(
        None, help="name clients check in servers' certificates instead of the address's host"
    )
    grpc_token_file: Path | None = flag(
        None,
        codec=PATH,
        help="file holding a shared token: servers refuse calls without 'authorization: Bearer "
        "<token>' (health checks excepted), clients send it (else env CLEAVE_GRPC_TOKEN)",
    )
