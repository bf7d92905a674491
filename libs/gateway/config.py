"""The gateway's configuration (the only place its flags are declared). Flag names follow
qaic_disagg's launch commands (docs/architecture.md)."""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.codecs import ADDRESSES, BYTES, NON_NEGATIVE_INT, PORT, POSITIVE_INT, choice
from libs.config.errors import ConfigError
from libs.config.flags import FLOAT, PATH, Codec, flag, group, parse
from libs.config.groups import GrpcSecurityFlags, ServerFlags
from libs.encoder.limits import ImageLimits
from libs.gateway.api import request_limits
from libs.gateway.api.adapters import LoraServingFlags
from libs.gateway.api.context import ApiOptions
from libs.gateway.api.http.auth import ApiKeys
from libs.gateway.api.http.edge import HttpEdge
from libs.gateway.api.http.http_limits import DEFAULT_MAX_BODY_BYTES
from libs.gateway.fleet.admission import AdmissionConfig
from libs.gateway.fleet.breaker import BreakerConfig
from libs.gateway.fleet.discovery import DEFAULT_REFRESH_S as DEFAULT_DNS_REFRESH_S
from libs.gateway.fleet.routing import POLICIES
from libs.gateway.serving import disaggregation
from libs.gateway.serving.migration import DEFAULT_LIMIT as DEFAULT_MIGRATION_LIMIT
from libs.planner.config import PlannerFlags
from libs.stack.config import StackConfig

CLEAVE_API_KEY_ENV = "CLEAVE_API_KEY"
# As the kvstore's --kv-auth-key-file: an HMAC key of at least 16 bytes.
MIN_CACHE_SALT_KEY_BYTES = 16
VLLM_API_KEY_ENV = "VLLM_API_KEY"


def _split_keys(text: str) -> list[str]:
    return [key.strip() for key in text.split(",") if key.strip()]


# Written back as given; ApiKeys never prints the keys themselves (repr, logs).
_API_KEYS: Codec[ApiKeys] = Codec(
    lambda _flag, text: ApiKeys(_split_keys(text)), lambda keys: ",".join(keys.keys)
)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig(ServerFlags, StackConfig, GrpcSecurityFlags, LoraServingFlags):
    """Cleave gateway: one OpenAI-compatible endpoint over prefill/decode workers."""

    port: int = flag(8000, codec=PORT, help="HTTP port of the OpenAI API (0 = any free port)")
    # Addresses of running services; when no worker address is given the gateway starts a
    # local stack of child processes instead (StackConfig's flags).
    tokenizer: str | None = flag(None, help="address of a running tokenizer service")
    prefill_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running prefill workers")
    decode_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running decode workers")
    pd_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running colocated workers")
    encoders: tuple[str, ...] = flag(
        (), codec=ADDRESSES, help="addresses of running vision encoders (image parts; none = text-only)"
    )
    wait_for_workers_s: float = flag(
        300.0,
        codec=FLOAT,
        help="seconds the gateway waits at start for a first given worker to answer (workers "
        "started beside it may still load their model); 0 = fail at once",
    )
    worker_dns_refresh_s: float = flag(
        DEFAULT_DNS_REFRESH_S,
        codec=FLOAT,
        help="seconds between DNS lookups of the worker host names given: each name stands for "
        "every address it resolves to (compose --scale, a Kubernetes headless Service), added "
        "and retired without a restart; 0 = hand the addresses to gRPC as given",
    )
    routing: str = flag("least_load", codec=choice(sorted(POLICIES)), help="routing policy")
    # Conditional disaggregation (libs/gateway/serving/disaggregation.py; Dynamo's disaggregated router,
    # llm-d's selective P/D): per request, remote prefill or prefill on the decode worker.
    disagg_policy: str = flag(
        disaggregation.ALWAYS,
        codec=choice(disaggregation.POLICIES),
        help="always: every prompt is prefilled on a prefill worker (KV handoff to decode); "
        "conditional: short uncached prompts, or long ones while the prefill workers are backed up "
        "and the decode worker is not, are computed on the decode worker (no handoff)",
    )
    local_prefill_max_tokens: int = flag(
        disaggregation.DEFAULT_LOCAL_PREFILL_MAX_TOKENS,
        codec=NON_NEGATIVE_INT,
        help="conditional: prompts with at most this many uncached tokens prefill on the decode worker",
    )
    remote_prefill_max_queue: int = flag(
        disaggregation.DEFAULT_REMOTE_PREFILL_MAX_QUEUE,
        codec=POSITIVE_INT,
        help="conditional: when the least loaded prefill worker has this many requests, longer "
        "prompts prefill on the decode worker (see --local-prefill-max-decode-load)",
    )
    local_prefill_max_decode_load: int = flag(
        disaggregation.DEFAULT_LOCAL_PREFILL_MAX_DECODE_LOAD,
        codec=NON_NEGATIVE_INT,
        help="conditional: ...unless the decode worker already has this many other requests",
    )
    # libs/gateway/fleet/shared_stream.py: one GenerateMany call per worker instead of a Generate
    # call per request (per-message gRPC cost is most of the serving layer's CPU per token).
    worker_streams: str = flag(
        "shared",
        codec=choice(("shared", "per-request")),
        help="shared: every request to a worker streams its tokens on one long-lived gRPC call "
        "(GenerateMany), one message per engine step for all of them; per-request: a Generate "
        "call per request (workers that serve no GenerateMany get that anyway)",
    )
    # Not rendered to children (GrpcSecurityFlags is): the gateway makes the token they get.
    # On by default: other local users can read the children's loopback ports and command
    # lines, not the token's file.
    grpc_stack_token: bool = flag(
        True,
        help="local stack: secure its gRPC services with a fresh random token (a 0600 file in a "
        "private temp folder) unless --grpc-token-file or CLEAVE_GRPC_TOKEN gives one; "
        "--no-grpc-stack-token leaves them open to every local user",
    )
    # Dynamo's flag: a request whose decode worker fails mid-stream continues on another.
    migration_limit: int = flag(
        DEFAULT_MIGRATION_LIMIT,
        codec=NON_NEGATIVE_INT,
        help="times a request may move to another worker when its decode worker fails mid-stream (0 = never)",
    )
    # Request routing robustness: one deadline per request (libs/gateway/common/deadline.py),
    # bounded in-flight requests per worker and a bounded queue (admission.py), a circuit
    # breaker per worker (breaker.py).
    request_timeout_s: float = flag(
        600.0,
        codec=FLOAT,
        name="request-timeout",
        help="seconds from a request's arrival to its last token, given to every gRPC call as its "
        "deadline; past it the workers abort the request and the client gets 504 (0 = no limit)",
    )
    max_inflight_per_worker: int = flag(
        0,
        codec=NON_NEGATIVE_INT,
        help="requests this gateway sends one worker at once, at most the worker's own bound "
        "(its --max-inflight-requests, other gateways' requests counted); more wait in the "
        "gateway's queue (0 = the worker's bound)",
    )
    max_queued_requests: int = flag(
        1024,
        codec=NON_NEGATIVE_INT,
        help="requests waiting for a worker with room; past it a request is refused (429, Retry-After)",
    )
    queue_timeout_s: float = flag(
        60.0,
        codec=FLOAT,
        name="queue-timeout",
        help="seconds a request waits in the queue before it is refused (429, Retry-After; "
        "0 = as long as --request-timeout allows)",
    )
    # The HTTP server's drain on SIGTERM (uvicorn's graceful shutdown): it stops accepting at
    # once (readiness fails), and the requests it is serving run to their end, for at most this.
    shutdown_grace_s: float = flag(
        0.0,
        codec=FLOAT,
        help="seconds the gateway lets running requests finish after SIGTERM before it cancels "
        "them (new connections are refused at once); 0 = as long as --request-timeout allows. "
        "Keep it under the pod's terminationGracePeriodSeconds",
    )
    breaker_failures: int = flag(
        3,
        codec=POSITIVE_INT,
        help="consecutive failed requests (or failed stats polls) of a worker that stop routing to it",
    )
    breaker_cooldown_s: float = flag(
        5.0,
        codec=FLOAT,
        name="breaker-cooldown",
        help="seconds before a stopped worker is probed again (doubling while it fails, up to 12x)",
    )
    # The HTTP edge's bounds (libs/gateway/api/http/edge.py); a request past one is a 4xx.
    max_request_body_bytes: int = flag(
        DEFAULT_MAX_BODY_BYTES, codec=BYTES, help="larger request bodies are refused (413) unread"
    )
    max_prompt_chars: int = flag(
        0,
        codec=NON_NEGATIVE_INT,
        help="longer prompts are refused (400) before tokenizing; 0 = "
        f"{request_limits.CHARS_PER_CONTEXT_TOKEN} x the context length",
    )
    max_tokens_cap: int | None = flag(
        None,
        codec=POSITIVE_INT,
        help="most tokens one completion generates (default: the rest of the context)",
    )
    # vLLM's flag of the same name and default: cached-token counts are a side channel.
    enable_prompt_tokens_details: bool = flag(
        False, help="report usage.prompt_tokens_details.cached_tokens (prompt tokens served from a cache)"
    )
    # vLLM's flag of the same name: usage on every stream, whatever its stream_options say.
    enable_force_include_usage: bool = flag(
        False, help="streams carry usage on every chunk and at the end, as if every request asked for it"
    )
    return_tokens_as_token_ids: bool = flag(
        False, help="logprobs name tokens as token_id:<id> unless a request sets return_tokens_as_token_ids"
    )
    max_stop_strings: int = flag(
        request_limits.DEFAULT_MAX_STOP_STRINGS, codec=POSITIVE_INT, help="most stop strings per request"
    )
    max_stop_string_chars: int = flag(
        request_limits.DEFAULT_MAX_STOP_STRING_CHARS, codec=POSITIVE_INT, help="longest stop string"
    )
    max_sequences_per_request: int = flag(
        request_limits.DEFAULT_MAX_SEQUENCES, codec=POSITIVE_INT, help="most prompts x n in one request"
    )
    # API keys, as vLLM's --api-key: the flag, a file (keeps keys off command lines), or the
    # environment (CLEAVE_API_KEY, comma-separated, and VLLM_API_KEY) when neither is given.
    api_key: ApiKeys = flag(
        ApiKeys(),
        codec=_API_KEYS,
        help="comma-separated keys clients must send as 'Authorization: Bearer KEY'",
    )
    api_key_file: Path | None = flag(None, codec=PATH, help="a file of API keys, one per line")
    auth_health: bool = flag(False, help="require the API key on /health, /ready, /metrics and /ping too")
    # Tenants never share prefix KV: each key's requests carry a cache salt derived from it.
    cache_salt_per_api_key: bool = flag(
        False,
        help="salt each API key's requests' prefix caches (engines, kvstore, routing) with a keyed "
        "hash of the key, in front of any cache_salt the request gives: keys share no cached KV",
    )
    cache_salt_key_file: Path | None = flag(
        None,
        codec=PATH,
        help="the secret --cache-salt-per-api-key hashes keys with (every gateway sharing workers "
        "or a kvstore needs the same one; default: a random secret per gateway process)",
    )
    # The SLA planner of a local stack (libs/planner, docs/planner.md): it sizes the stack's
    # prefill and decode (or colocated) workers for --planner-ttft-ms / --planner-itl-ms,
    # starting workers and draining them. A fleet with several gateways runs services/planner.
    # vLLM's flag. Each process is a whole gateway (its own pool, admission and routing state);
    # per-worker bounds still hold, as for gateway replicas (the workers enforce them).
    api_server_count: int = flag(
        1,
        codec=POSITIVE_INT,
        help="gateway processes serving the HTTP API on one address, sharing its socket; /metrics "
        "counts all of them (vLLM's flag)",
    )
    listen_fd: int | None = flag(
        None,
        codec=NON_NEGATIVE_INT,
        help="serve the HTTP API on this inherited listening socket (set by --api-server-count "
        "for its processes; not for users)",
    )
    planner: bool = flag(
        False,
        help="local stack: an SLA planner starts and drains workers to meet --planner-ttft-ms and "
        "--planner-itl-ms (the --planner-* flags; docs/planner.md)",
    )
    planning: PlannerFlags = group("planner", factory=PlannerFlags)
    # vLLM's flag: FastAPI's root_path, for a gateway behind a path-based routing proxy.
    root_path: str = flag(
        "", help="the path prefix a proxy serves the API under (e.g. /llm); both paths work"
    )

    # vLLM's flag: `tool_choice: auto` (also implied by tools without a tool_choice) is parsed
    # by --tool-call-parser in the tokenizer service; without it such requests are a 400.
    enable_auto_tool_choice: bool = flag(
        False, help="serve `tool_choice: auto` (needs --tool-call-parser; libs/gateway/api/tools.py)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in (
            ("--request-timeout", self.request_timeout_s),
            ("--queue-timeout", self.queue_timeout_s),
            ("--breaker-cooldown", self.breaker_cooldown_s),
            ("--worker-dns-refresh-s", self.worker_dns_refresh_s),
            ("--wait-for-workers-s", self.wait_for_workers_s),
            ("--shutdown-grace-s", self.shutdown_grace_s),
        ):
            if not value >= 0:  # also refuses nan
                raise ConfigError(name, value, "a number of seconds >= 0")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            # vLLM's rule (its message: "--enable-auto-tool-choice requires --tool-call-parser").
            raise ConfigError("--tool-call-parser", None, "a tool parser name with --enable-auto-tool-choice")
        if self.lora_modules and not self.enable_lora:
            raise ConfigError("--enable-lora", False, "on when --lora-modules names adapters")
        if self.cache_salt_key_file is not None and not self.cache_salt_per_api_key:
            raise ConfigError("--cache-salt-per-api-key", False, "on when --cache-salt-key-file is given")
        if self.api_server_count > 1 and self.planner:
            raise ConfigError(
                "--api-server-count",
                self.api_server_count,
                "1 with --planner: the API processes are given the stack's workers once, so none "
                "would see the workers the planner adds",
            )
        if self.api_server_count > 1 and self.listen_fd is not None:
            raise ConfigError("--listen-fd", self.listen_fd, "unset with --api-server-count > 1")
        if self.planner and not self.launches_stack:
            raise ConfigError(
                "--planner",
                True,
                "off with worker addresses: a fleet started elsewhere runs services/planner",
            )
        if not self.launches_stack and not self.tokenizer:
            raise ConfigError(
                "--tokenizer", None, "the tokenizer service's address when worker addresses are given"
            )

    @property
    def launches_stack(self) -> bool:
        return not (self.prefill_workers or self.decode_workers or self.pd_workers)

    def api_keys(self, environ: Mapping[str, str] = os.environ) -> ApiKeys:
        """Keys from --api-key and --api-key-file; with neither, from the environment
        (vLLM's order: the command line wins). Raises ConfigError for an unreadable file."""
        keys = list(self.api_key.keys)
        if self.api_key_file is not None:
            try:
                text = self.api_key_file.read_text()
            except OSError as error:
                raise ConfigError(
                    "--api-key-file", str(self.api_key_file), f"a readable file ({error.strerror})"
                ) from None
            keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
        if not keys:
            keys = _split_keys(environ.get(CLEAVE_API_KEY_ENV, "")) + _split_keys(
                environ.get(VLLM_API_KEY_ENV, "")
            )
        return ApiKeys(keys)

    def disagg(self) -> disaggregation.DisaggConfig:
        return disaggregation.DisaggConfig(
            policy=self.disagg_policy,
            local_prefill_max_tokens=self.local_prefill_max_tokens,
            remote_prefill_max_queue=self.remote_prefill_max_queue,
            local_prefill_max_decode_load=self.local_prefill_max_decode_load,
        )

    @property
    def http_shutdown_grace_s(self) -> int | None:
        """uvicorn's timeout_graceful_shutdown (whole seconds; None: no limit of its own)."""
        grace = self.shutdown_grace_s or self.request_timeout_s
        return math.ceil(grace) if grace else None

    def breaker(self) -> BreakerConfig:
        return BreakerConfig(
            failures_to_open=self.breaker_failures,
            cooldown_s=self.breaker_cooldown_s,
            max_cooldown_s=12 * self.breaker_cooldown_s,
        )

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(
            max_inflight_per_worker=self.max_inflight_per_worker,
            max_queued_requests=self.max_queued_requests,
            queue_timeout_s=self.queue_timeout_s,
        )

    def api_options(self) -> ApiOptions:
        return ApiOptions(
            prompt_tokens_details=self.enable_prompt_tokens_details,
            force_include_usage=self.enable_force_include_usage,
            return_tokens_as_token_ids=self.return_tokens_as_token_ids,
            enable_auto_tool_choice=self.enable_auto_tool_choice,
            image_limits=ImageLimits(
                allow_http=self.allow_image_urls,
                http_timeout_s=self.image_fetch_timeout_s,
                allow_private=self.allow_private_image_urls,
            ),
        )

    def http_edge(self, environ: Mapping[str, str] = os.environ) -> HttpEdge:
        limits = request_limits.RequestLimits(
            max_prompt_chars=self.max_prompt_chars,
            max_stop_strings=self.max_stop_strings,
            max_stop_string_chars=self.max_stop_string_chars,
            max_sequences=self.max_sequences_per_request,
            max_tokens_cap=self.max_tokens_cap,
        )
        keys = self.api_keys(environ)
        return HttpEdge(
            max_body_bytes=self.max_request_body_bytes,
            limits=limits,
            api_keys=keys,
            auth_health=self.auth_health,
            root_path=self.root_path,
            cache_salt_key=self.cache_salt_key(keys),
        )

    def cache_salt_key(self, keys: ApiKeys) -> bytes | None:
        """The secret tenant salts are derived with (--cache-salt-per-api-key), or None when off.
        Raises ConfigError without API keys (no tenants to tell apart) or for an unusable file."""
        if not self.cache_salt_per_api_key:
            return None
        if not keys:
            raise ConfigError(
                "--cache-salt-per-api-key", True, "API keys (--api-key, --api-key-file, CLEAVE_API_KEY)"
            )
        if self.cache_salt_key_file is None:
            return secrets.token_bytes(32)
        try:
            secret = self.cache_salt_key_file.read_bytes().strip()
        except OSError as error:
            raise ConfigError(
                "--cache-salt-key-file", str(self.cache_salt_key_file), f"a readable file ({error.strerror})"
            ) from None
        if len(secret) < MIN_CACHE_SALT_KEY_BYTES:
            raise ConfigError(
                "--cache-salt-key-file",
                str(self.cache_salt_key_file),
                f"a file holding at least {MIN_CACHE_SALT_KEY_BYTES} bytes of secret",
            )
        return secret


def parse_args(argv: Sequence[str] | None = None) -> GatewayConfig:
    return parse(GatewayConfig, argv)
