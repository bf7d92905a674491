from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from libs.config.codecs import BYTES, DEVICE_GROUP, KEY_VALUES, POSITIVE_INT
from libs.config.errors import ConfigError
from libs.config.flags import PATH, build_parser, compose, flag, group, parse, render
from libs.config.groups import GrpcSecurityFlags, LoggingFlags, ModelFlags, RoleFlags, ServerFlags
from libs.config.roles import Role
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.tokenization.server_config import TokenizerServerConfig
from libs.worker.config import WorkerConfig


@dataclass(frozen=True, kw_only=True)
class Inner:
    size: int = flag(1 << 20, codec=BYTES)
    cores: tuple[int, ...] = flag((), codec=DEVICE_GROUP)


@dataclass(frozen=True, kw_only=True)
class Outer(ServerFlags):
    name: str | None = flag(None)
    verbose: bool = flag(False)
    count: int = flag(3, codec=POSITIVE_INT)
    pairs: tuple[tuple[str, str], ...] = flag((), codec=KEY_VALUES)
    where: Path = flag(Path("/tmp"), codec=PATH)
    first: Inner = group("first", factory=Inner)
    second: Inner = group("second", factory=Inner)


def test_defaults_parse_from_nothing_and_render_to_nothing() -> None:
    assert parse(Outer, []) == Outer()
    assert render(Outer()) == []


def test_groups_are_prefixed_and_values_go_through_their_codecs() -> None:
    config = parse(
        Outer, ["--first-size", "2GiB", "--second-cores", "0..2", "--pairs", "a:1 b:2", "--verbose"]
    )
    assert config.first.size == 2 << 30 and config.second.cores == (0, 1, 2)
    assert config.second.size == 1 << 20 and config.first.cores == ()
    assert config.pairs == (("a", "1"), ("b", "2")) and config.verbose


def test_render_round_trips_every_kind_of_value() -> None:
    config = Outer(
        host="0.0.0.0", port=7, name="x y", verbose=True, count=9, pairs=(("k", "v"),), where=Path("/a b"),
        first=Inner(size=1536 << 20, cores=(0, 2, 3)), second=Inner(size=1000),
    )  # fmt: skip
    argv = render(config)
    assert "--first-size" in argv and argv[argv.index("--first-size") + 1] == "1536MiB"
    assert parse(Outer, argv) == config


def test_a_bad_value_names_its_flag() -> None:
    with pytest.raises(ConfigError, match=r"--second-size: got 'lots'"):
        parse(Outer, ["--second-size", "lots"])
    with pytest.raises(ConfigError, match="--count"):
        parse(Outer, ["--count", "0"])


def test_unknown_flags_are_refused_by_argparse() -> None:
    with pytest.raises(SystemExit):
        parse(Outer, ["--no-such-flag", "1"])


def test_help_shows_defaults() -> None:
    text = build_parser(Outer).format_help()
    assert "--first-size" in text and "default: 1MiB" in text


GRPC_SECURITY_ARGV = [
    "--grpc-reflection", "--grpc-tls-cert-file", "/etc/cleave/tls.crt", "--grpc-tls-key-file", "/etc/cleave/tls.key",
    "--grpc-tls-ca-file", "/etc/cleave/ca.crt", "--grpc-tls-server-name", "cleave.internal",
    "--grpc-token-file", "/run/cleave/token",
]  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "argv"),
    [
        (WorkerConfig, ["--role", "decode", "--device-group", "1", "--kv-cache-bytes", "2GiB",
                        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}', "--kvstore-address", "h:1", "--kv-port", "9"]),
        (WorkerConfig, ["--role", "prefill", "--override-qaic-config", "a:1", "--device", "qaic", "--log-json"]),
        (WorkerConfig, ["--cpu-binding", "auto"]),
        (TokenizerServerConfig, ["--model", "/m", "--max-model-len", "8192", "--port-file", "/tmp/p"]),
        (KvStoreProcessConfig, ["--cpu-bytes", "512MiB", "--disk-dir", "/tmp/kv", "--redis-url", "redis://h:1"]),
        *((cls, GRPC_SECURITY_ARGV) for cls in (WorkerConfig, TokenizerServerConfig, KvStoreProcessConfig)),
    ],
)  # fmt: skip
def test_every_service_config_round_trips(cls: type, argv: list[str]) -> None:
    config: object = parse(cls, argv)
    assert parse(cls, render(config)) == config


def test_compose_takes_only_the_named_groups() -> None:
    role = RoleFlags(max_num_seqs=2, kv_cache_bytes=1 << 30)
    worker = compose(
        WorkerConfig, (role, RoleFlags), (ModelFlags(max_model_len=4096), ModelFlags), role=Role.DECODE
    )
    assert (worker.max_num_seqs, worker.kv_cache_bytes, worker.max_model_len) == (2, 1 << 30, 4096)
    assert worker.port == 0  # the gateway's own port never leaks into a child
    with pytest.raises(TypeError, match="does not include"):
        compose(TokenizerServerConfig, (role, RoleFlags))
    with pytest.raises(TypeError, match="no fields"):
        compose(TokenizerServerConfig, (LoggingFlags(), LoggingFlags), role=Role.DECODE)


def test_repeatable_verbose_flag_as_in_qaic_disagg_commands() -> None:
    config = parse(TokenizerServerConfig, ["-v", "-v", "-v"])
    assert config.verbose == 3 and config.effective_log_level == "debug"
    assert render(config) == ["-v", "-v", "-v"] and parse(TokenizerServerConfig, render(config)) == config
    assert parse(TokenizerServerConfig, []).effective_log_level == "info"


def test_grpc_security_flags_default_to_plaintext_without_reflection_and_reach_each_service() -> None:
    assert parse(GrpcSecurityFlags, []) == GrpcSecurityFlags() and render(GrpcSecurityFlags()) == []
    flags = parse(GrpcSecurityFlags, GRPC_SECURITY_ARGV)
    assert flags.grpc_reflection and flags.grpc_token_file == Path("/run/cleave/token")
    assert flags.grpc_tls_server_name == "cleave.internal"
    assert parse(GrpcSecurityFlags, render(flags)) == flags
    # How the gateway hands its group to a child: every flag of the group, nothing else.
    worker = compose(WorkerConfig, (flags, GrpcSecurityFlags), role=Role.DECODE)
    argv = render(worker)
    assert len(argv) == len(["--role", "decode", *render(flags)]) and parse(WorkerConfig, argv) == worker
    assert compose(GrpcSecurityFlags, (worker, GrpcSecurityFlags)) == flags


@dataclass(frozen=True, kw_only=True)
class Many:
    sizes: tuple[int, ...] = flag((), codec=POSITIVE_INT, many=True)
    after: int = flag(1, codec=POSITIVE_INT)


def test_a_many_valued_flag_takes_every_value_after_it_and_round_trips() -> None:
    config = parse(Many, ["--sizes", "3", "4", "5", "--after", "2"])
    assert config == Many(sizes=(3, 4, 5), after=2)
    assert render(config) == ["--sizes", "3", "4", "5", "--after", "2"]
    assert parse(Many, render(config)) == config
    assert parse(Many, []) == Many() and render(Many()) == []
    with pytest.raises(ConfigError, match="--sizes"):
        parse(Many, ["--sizes", "3", "zero"])
