"""The local stack: from the gateway's StackConfig to running services and their addresses.

Every child's command line is its config type rendered back to flags; the configs are
composed from the stack's flag groups (the `--decode-*` group becomes a decode worker's
RoleFlags), so a flag added to a group reaches the children with no code here. The gateway's
--grpc-* flags (GrpcSecurityFlags) reach every child, so one token file or certificate set
secures the whole stack.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from libs.config.flags import compose
from libs.config.groups import (
    ChatTemplateFlags,
    EngineFlags,
    GrpcSecurityFlags,
    LoggingFlags,
    ModelFlags,
    RoleFlags,
    ToolParserFlags,
)
from libs.config.roles import Role
from libs.encoder.server_config import EncoderConfig
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.models.resolve import resolve_model
from libs.stack.config import StackConfig, StackRole, usable_cores
from libs.stack.entry_points import EntryPoints, ServiceKind
from libs.stack.launcher import LocalStack
from libs.tokenization.server_config import TokenizerServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.speculative import Method, parse_speculative_config

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StackAddresses:
    tokenizer: str
    workers: dict[Role, list[str]]  # the worker role -> addresses
    served_model: str
    kvstore: str | None
    encoders: tuple[str, ...] = ()  # vision encoder services (modes XeYpd, XeYpZd)
    # The config the stack's workers were made from (model resolved, device groups set): more
    # workers like them are made from it (the planner's local connector). None: given addresses.
    config: StackConfig | None = None


def split_cores(cores: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Default device groups for a disaggregated stack: prefill on the first half of the
    usable cores, decode on the rest, so the two never fight over a core (the point of
    disaggregating). One core: no split (both share it)."""
    if len(cores) < 2:
        return (), ()
    ordered = tuple(sorted(cores))
    half = len(ordered) // 2
    return ordered[:half], ordered[half:]


def with_default_groups(config: StackConfig, cores: tuple[int, ...]) -> StackConfig:
    """Device groups for a disaggregated stack's roles: the halves of `cores`, or, when one
    role's group is given, the other cores for the other role. A colocated (pd) worker keeps
    no group and computes on every core it may use (libs/worker/engine_args.py)."""
    given_prefill, given_decode = config.prefill.device_group, config.decode.device_group
    if config.mode.colocated or (given_prefill and given_decode):
        return config
    if given_prefill or given_decode:
        rest = tuple(core for core in sorted(cores) if core not in (given_prefill or given_decode))
        if not rest:
            return config
        prefill_group, decode_group = (given_prefill, rest) if given_prefill else (rest, given_decode)
    else:
        prefill_group, decode_group = split_cores(cores)
    if not prefill_group:
        return config
    log.info("pinning local workers to cores", prefill=prefill_group, decode=decode_group)
    return replace(
        config,
        prefill=replace(config.prefill, device_group=prefill_group),
        decode=replace(config.decode, device_group=decode_group),
    )


def confine_draft(config: StackConfig) -> StackConfig:
    """The decode's draft model off the prefill worker's cores. On CPU the draft computes
    inside the decode engine, whose OpenMP team takes in the draft's device_group
    (libs/worker/engine_args.py); qaic_disagg's documented command gives the draft device 0,
    one of its prefill devices. A team spanning a core another engine computes on waits at
    every barrier for its thread there: measured on 2 cores under load, the first 40-token
    draft-model request took 78 s instead of 4 s, and the prefill worker, starved on its
    own core, stopped answering the gateway's polls. Those cores are dropped from the
    draft's group (--allow-device-overlap keeps them)."""
    text = config.decode.speculative_config
    if not text or config.allow_device_overlap or not config.prefill.device_group:
        return config
    spec = parse_speculative_config(text)
    shared = sorted(set(spec.draft_device_group) & set(config.prefill.device_group))
    if not shared or spec.draft_override_qaic_config is None:
        return config
    kept = [core for core in spec.draft_device_group if core not in shared]
    overrides = {
        key: value for key, value in spec.draft_override_qaic_config.items() if key != "device_group"
    }
    if kept:
        overrides["device_group"] = kept
    log.warning(
        "the draft model's device_group shares cores with the prefill worker; on CPU the draft "
        "computes on the decode worker's cores instead",
        draft_device_group=list(spec.draft_device_group),
        prefill_device_group=list(config.prefill.device_group),
        dropped=shared,
    )
    confined = replace(spec, draft_device_group=tuple(kept), draft_override_qaic_config=overrides)
    return replace(config, decode=replace(config.decode, speculative_config=confined.to_json()))


def colocated_groups(config: StackConfig, cores: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Device groups of the colocated workers: one worker keeps its --decode-device-group (or
    none: every core it may use); several split that group, or the usable cores, into equal
    consecutive slices, so colocated engines never share a core (as prefill and decode do
    not). Fewer cores than workers: no split (they share)."""
    count = config.mode.colocated
    given = config.decode.device_group
    if count <= 1:
        return [given] * count
    pool = tuple(sorted(given or cores))
    if len(pool) < count:
        return [given] * count
    size = len(pool) // count
    return [pool[i * size : (i + 1) * size] for i in range(count)]


def worker_config(
    config: StackConfig,
    role: Role,
    options: StackRole,
    index: int,
    kvstore_address: str | None,
    security: GrpcSecurityFlags = GrpcSecurityFlags(),  # noqa: B008 (frozen)
) -> WorkerConfig:
    if role is Role.PREFILL:
        options = replace(options, speculative_config=_prefill_speculative_config(config))
    return compose(
        WorkerConfig,
        (config, ModelFlags),
        (config, EngineFlags),
        (config, LoggingFlags),
        (options, RoleFlags),
        (security, GrpcSecurityFlags),
        role=role,
        port=options.port + index if options.port else 0,
        kvstore_address=kvstore_address,
    )


def _prefill_speculative_config(config: StackConfig) -> str | None:
    """A draft model runs on prefill too, not to speculate (prefill emits one token) but so
    that the draft's KV for the prompt exists: the decode engine holds the draft's KV layers
    as well, and vLLM's NIXL handoff moves every layer (it refuses unequal layer counts)."""
    decode = config.decode.speculative_config
    if decode and parse_speculative_config(decode).method is Method.DRAFT_MODEL:
        return decode
    return None


def kvstore_config(config: StackConfig, security: GrpcSecurityFlags) -> KvStoreProcessConfig:
    """The config of the kvstore `--kvstore` starts."""
    return compose(
        KvStoreProcessConfig,
        (security, GrpcSecurityFlags),
        log_level=config.log_level,
        log_json=config.log_json,
        store=KvStoreConfig(
            cpu_bytes=config.kvstore_cpu_bytes,
            redis_url=config.kvstore_redis_url,
            kv_auth_key_file=config.kvstore_auth_key_file,
        ),
    )


def _start_kvstore(
    config: StackConfig, stack: LocalStack, entry_points: EntryPoints, security: GrpcSecurityFlags
) -> str | None:
    """The kvstore the workers use: the one given, one started here, or none."""
    if not config.kvstore:
        return config.kvstore_address
    kvstore = kvstore_config(config, security)
    # The workers need its address on their command lines.
    module = entry_points.module(ServiceKind.KVSTORE)
    return stack.start("kvstore", "kvstore", module, kvstore).wait_bound()


def encoder_config(
    config: StackConfig,
    index: int,
    security: GrpcSecurityFlags = GrpcSecurityFlags(),  # noqa: B008 (frozen)
) -> EncoderConfig:
    """An encoder child's config: the stack's model, in the workers' dtype (the embeddings
    are their language model's inputs; on CPU `auto` is bfloat16 there too)."""
    options = config.encode
    return compose(
        EncoderConfig,
        (config, ModelFlags),
        (config, LoggingFlags),
        (security, GrpcSecurityFlags),
        dtype="bfloat16" if config.dtype == "auto" else config.dtype,
        port=options.port + index if options.port else 0,
        max_num_seqs=options.max_num_seqs,
        allow_image_urls=config.allow_image_urls,
        image_fetch_timeout_s=config.image_fetch_timeout_s,
        allow_private_image_urls=config.allow_private_image_urls,
    )


def tokenizer_config(
    config: StackConfig,
    security: GrpcSecurityFlags = GrpcSecurityFlags(),  # noqa: B008 (frozen)
) -> TokenizerServerConfig:
    """The tokenizer child's config: the stack's model, logging, security and tool parser."""
    return compose(
        TokenizerServerConfig,
        (config, ModelFlags),
        (config, LoggingFlags),
        (security, GrpcSecurityFlags),
        (config, ToolParserFlags),
        (config, ChatTemplateFlags),
    )


async def launch(
    config: StackConfig,
    stack: LocalStack,
    *,
    entry_points: EntryPoints,
    security: GrpcSecurityFlags = GrpcSecurityFlags(),  # noqa: B008 (frozen)
) -> StackAddresses:
    """Starts the tokenizer, the kvstore (if asked) and the workers, each from its entry
    point in `entry_points` (the services layer's: services/entry_points.py); returns once
    all serve. The stack restarts crashed children by the config's --restart-* policy from
    then on. Every child gets `security`'s flags: it serves, and calls the others, with them."""
    stack.restart_policy = config.restart_policy
    resolved = resolve_model(
        config.model, config.model_cache_dir, progress=True, allow_download=config.allow_model_download
    )
    served = config.served_model_name or resolved.served_name
    config = replace(config, model=str(resolved.path), served_model_name=served)
    tokenizer = tokenizer_config(config, security)
    stack.start("tokenizer", "tokenizer", entry_points.module(ServiceKind.TOKENIZER), tokenizer)
    kvstore_address = _start_kvstore(config, stack, entry_points, security)
    config = confine_draft(with_default_groups(config, usable_cores()))
    topology = config.mode
    # (name prefix, role, how many, options): colocated workers take the decode options.
    launches = [
        ("pd", Role.BOTH, topology.colocated, config.decode),
        ("prefill", Role.PREFILL, topology.prefill, config.prefill),
        ("decode", Role.DECODE, topology.decode, config.decode),
    ]
    for i in range(topology.encode):
        encoder = encoder_config(config, i, security)
        stack.start(f"encode-{i}", "encode", entry_points.module(ServiceKind.ENCODER), encoder)
    groups = colocated_groups(config, usable_cores())
    for prefix, role, count, options in launches:
        for i in range(count):
            if role is Role.BOTH and count > 1:
                options = replace(config.decode, device_group=groups[i])
            worker = worker_config(config, role, options, i, kvstore_address, security)
            if topology.encode:
                # Prompts with images come with the encoder's embeddings (decode takes them
                # only when it computes a prompt itself: no handoff).
                worker = replace(worker, enable_mm_embeds=True)
            stack.start(f"{prefix}-{i}", role.value, entry_points.module(ServiceKind.WORKER), worker)
    print(
        f"cleave: starting a local {topology.name} stack with {served} (logs in {stack.log_dir})",
        file=sys.stderr,
        flush=True,
    )
    await stack.wait_ready(config.startup_timeout_s)
    workers = {role: stack.addresses(role.value) for role in Role}
    encoders = tuple(stack.addresses("encode")) if topology.encode else ()
    return StackAddresses(stack.addresses("tokenizer")[0], workers, served, kvstore_address, encoders, config)


def write_stack_token(directory: Path) -> Path:
    """A fresh random token in a file only this user can read (`directory` should be private,
    e.g. from tempfile.mkdtemp), for --grpc-token-file: the local stack's loopback services
    then refuse calls from other local users, who can read command lines but not the file."""
    path = directory / "grpc-token"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(32))
    return path
