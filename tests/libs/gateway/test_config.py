from __future__ import annotations

from pathlib import Path

import pytest

from libs.config.errors import ConfigError
from libs.config.flags import parse, render
from libs.gateway.api.adapters import LoraModule
from libs.gateway.config import GatewayConfig, parse_args
from libs.gateway.fleet.admission import AdmissionConfig
from libs.gateway.fleet.breaker import BreakerConfig
from libs.stack.local import encoder_config

# qaic_disagg's documented prefill/decode command line, model and device numbers adapted.
QAIC_DISAGG = [
    "--model", "smollm2", "--prefill-port", "9900", "--prefill-device-group", "0..15",
    "--decode-port", "9800", "--decode-device-group", "16..23", "--port", "8000",
    "--prefill-max-num-seqs", "1", "--decode-max-num-seqs", "1",
    "--prefill-max-seq-len-to-capture", "256", "--decode-max-seq-len-to-capture", "256",
    "--max-model-len", "11264",
    "--prefill-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--decode-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--generation-config", "vllm", "--kv-cache-dtype", "mxint8",
]  # fmt: skip


def test_defaults_launch_a_local_1p1d_stack() -> None:
    config = parse_args([])
    assert config.launches_stack
    assert config.mode.name == "1p1d"
    assert (config.model, config.port) == ("smollm2", 8000)


def test_qaic_disagg_flags_parse() -> None:
    config = parse_args(
        [
            *QAIC_DISAGG,
            "--mode",
            "2p1d",
            "--decode-speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 5}',
        ]
    )
    assert config.prefill.device_group == tuple(range(16))
    assert config.decode.device_group == tuple(range(16, 24))
    assert (config.prefill.port, config.decode.port) == (9900, 9800)
    assert config.prefill.max_num_seqs == 1 and config.decode.max_seq_len_to_capture == 256
    assert config.decode.override_qaic_config == (
        ("split_retained_state_io", "True"),
        ("mxfp6_matmul", "True"),
    )
    assert config.decode.speculative_config == '{"method": "ngram", "num_speculative_tokens": 5}'


@pytest.mark.parametrize(
    "argv",
    [
        [],
        QAIC_DISAGG,
        ["--mode", "pd", "--decode-kv-cache-bytes", "3GiB", "--kvstore", "--kvstore-cpu-bytes", "512MiB"],
        [
            "--tokenizer",
            "127.0.0.1:1",
            "--decode-workers",
            "127.0.0.1:2,127.0.0.1:3",
            "--routing",
            "round_robin",
        ],
        ["--log-json", "--startup-timeout-s", "12.5", "--port", "0", "--allow-device-overlap"],
        [
            "--max-request-body-bytes",
            "1MiB",
            "--max-prompt-chars",
            "1000",
            "--max-tokens-cap",
            "64",
            "--max-stop-strings",
            "4",
            "--max-stop-string-chars",
            "16",
            "--max-sequences-per-request",
            "8",
            "--api-key",
            "sk-a,sk-b",
            "--api-key-file",
            "/run/keys",
            "--auth-health",
        ],
        [
            "--request-timeout",
            "30",
            "--max-inflight-per-worker",
            "4",
            "--max-queued-requests",
            "0",
            "--queue-timeout",
            "2.5",
            "--breaker-failures",
            "1",
            "--breaker-cooldown",
            "0.5",
        ],
        ["--migration-limit", "0"],
        [
            "--tokenizer",
            "tokenizer:50051",
            "--decode-workers",
            "decode:50061",
            "--worker-dns-refresh-s",
            "2.5",
        ],
        ["--worker-dns-refresh-s", "0"],
        [
            "--restart-limit",
            "0",
            "--restart-window-s",
            "60",
            "--restart-backoff-s",
            "0.5",
            "--restart-max-backoff-s",
            "8",
        ],
        [
            "--grpc-reflection",
            "--grpc-tls-cert-file",
            "/etc/cleave/tls.crt",
            "--grpc-tls-key-file",
            "/etc/cleave/tls.key",
            "--grpc-tls-ca-file",
            "/etc/cleave/ca.crt",
            "--grpc-tls-server-name",
            "cleave.internal",
            "--grpc-token-file",
            "/run/cleave/grpc-token",
            "--no-grpc-stack-token",
        ],
    ],
)
def test_rendering_gives_back_the_same_config(argv: list[str]) -> None:
    config = parse_args(argv)
    assert parse_args(render(config)) == config


def test_the_local_stacks_grpc_token_is_on_unless_turned_off() -> None:
    assert parse_args([]).grpc_stack_token
    assert parse_args(["--grpc-stack-token"]).grpc_stack_token  # the old spelling still parses
    assert not parse_args(["--no-grpc-stack-token"]).grpc_stack_token
    assert render(parse_args(["--no-grpc-stack-token"])) == ["--no-grpc-stack-token"]


def test_migration_limit_is_dynamos_flag_with_its_default() -> None:
    assert parse_args([]).migration_limit == 2
    assert parse_args(["--migration-limit", "0"]).migration_limit == 0
    with pytest.raises(ConfigError, match="--migration-limit"):
        parse_args(["--migration-limit", "-1"])


def test_per_role_kv_cache_bytes() -> None:
    config = parse_args(["--prefill-kv-cache-bytes", "512MiB", "--decode-kv-cache-bytes", "2G"])
    assert (config.prefill.kv_cache_bytes, config.decode.kv_cache_bytes) == (512 << 20, 2 << 30)


def test_overlapping_groups_need_explicit_permission() -> None:
    flags = ["--prefill-device-group", "0,1", "--decode-device-group", "1"]
    with pytest.raises(ConfigError, match=r"overlap: \[1\]"):
        parse_args(flags)
    assert parse_args([*flags, "--allow-device-overlap"]).decode.device_group == (1,)


def test_worker_addresses_need_a_tokenizer_and_routing_must_exist() -> None:
    with pytest.raises(ConfigError, match="--tokenizer"):
        parse_args(["--decode-workers", "127.0.0.1:1"])
    assert not parse_args(["--decode-workers", "127.0.0.1:1", "--tokenizer", "127.0.0.1:2"]).launches_stack
    with pytest.raises(ConfigError, match="--routing: got 'fastest'"):
        parse_args(["--routing", "fastest"])
    with pytest.raises(ConfigError, match="--decode-workers"):
        parse_args(["--decode-workers", "localhost", "--tokenizer", "127.0.0.1:2"])


def test_kvstore_flags_start_one_or_use_one() -> None:
    assert not parse_args([]).uses_kvstore
    started = parse_args(["--kvstore", "--kvstore-redis-url", "redis://127.0.0.1:6379"])
    assert started.uses_kvstore and started.kvstore_redis_url == "redis://127.0.0.1:6379"
    assert parse_args(["--kvstore-address", "127.0.0.1:7700"]).uses_kvstore
    with pytest.raises(ConfigError, match=r"--kvstore: .*not both"):
        parse_args(["--kvstore", "--kvstore-address", "127.0.0.1:7700"])


def test_only_decode_speculates() -> None:
    with pytest.raises(ConfigError, match="--prefill-speculative-config"):
        parse_args(["--prefill-speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'])


def test_help_lists_every_role_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for role in ("prefill", "decode"):
        for name in ("port", "device-group", "max-num-seqs", "kv-cache-bytes", "override-qaic-config"):
            assert f"--{role}-{name}" in text
    assert isinstance(GatewayConfig.__doc__, str)


def test_the_http_edge_from_flags() -> None:
    edge = parse_args(
        ["--max-request-body-bytes", "2MiB", "--max-prompt-chars", "99", "--max-tokens-cap", "7"]
    ).http_edge(environ={})
    assert edge.max_body_bytes == 2 << 20
    assert (edge.limits.max_prompt_chars, edge.limits.max_tokens_cap) == (99, 7)
    assert not edge.api_keys and not edge.auth_health


def test_api_keys_from_flags_file_or_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# one key per line\nsk-file\n\n")
    environ = {"CLEAVE_API_KEY": "sk-env1, sk-env2", "VLLM_API_KEY": "sk-vllm"}
    # The command line (flag or file) wins over the environment, as in vLLM.
    flagged = parse_args(["--api-key", "sk-flag", "--api-key-file", str(key_file)])
    assert flagged.api_keys(environ).keys == ("sk-flag", "sk-file")
    assert parse_args([]).api_keys(environ).keys == ("sk-env1", "sk-env2", "sk-vllm")
    assert not parse_args([]).api_keys({})
    assert "sk-flag" not in repr(flagged)  # a config printed in a log shows no key
    with pytest.raises(ConfigError, match="--api-key-file"):
        parse_args(["--api-key-file", str(tmp_path / "missing")]).api_keys({})


def test_routing_robustness_flags() -> None:
    config = parse_args(["--request-timeout", "0", "--breaker-failures", "2", "--breaker-cooldown", "4"])
    assert config.request_timeout_s == 0
    assert config.breaker() == BreakerConfig(failures_to_open=2, cooldown_s=4.0, max_cooldown_s=48.0)
    assert config.admission() == AdmissionConfig(
        max_inflight_per_worker=0, max_queued_requests=1024, queue_timeout_s=60.0
    )
    for flag in ("--request-timeout", "--queue-timeout", "--breaker-cooldown"):
        with pytest.raises(ConfigError, match=flag):
            parse_args([flag, "-1"])
    with pytest.raises(ConfigError, match="--breaker-failures"):
        parse_args(["--breaker-failures", "0"])


def test_restart_flags_make_the_local_stacks_policy_and_refuse_non_positive_waits() -> None:
    policy = parse_args(["--restart-limit", "2", "--restart-backoff-s", "0.5"]).restart_policy
    assert (policy.max_restarts, policy.backoff_s, policy.max_backoff_s, policy.window_s) == (
        2,
        0.5,
        30.0,
        600.0,
    )
    with pytest.raises(ConfigError, match="--restart-backoff-s"):
        parse_args(["--restart-backoff-s", "0"])
    with pytest.raises(ConfigError, match="--restart-limit"):
        parse_args(["--restart-limit", "-1"])


def test_worker_dns_refresh_defaults_to_a_few_seconds_and_refuses_negatives() -> None:
    assert parse_args([]).worker_dns_refresh_s == 5.0
    with pytest.raises(ConfigError, match="--worker-dns-refresh-s"):
        parse_args(["--worker-dns-refresh-s", "-1"])


def test_auto_tool_choice_is_vllms_pair_of_flags() -> None:
    config = parse_args(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert config.enable_auto_tool_choice and config.tool_call_parser == "hermes"
    assert parse_args(render(config)) == config
    assert parse_args([]).tool_call_parser is None and not parse_args([]).enable_auto_tool_choice
    with pytest.raises(ConfigError, match="--tool-call-parser"):
        parse_args(["--enable-auto-tool-choice"])


def test_private_image_urls_are_refused_unless_allowed() -> None:
    # The gateway's own fetches (no encoder) and its local stack's encoders take the same flags.
    default = parse_args(["--allow-image-urls"])
    assert (
        default.api_options().image_limits.allow_http and not default.api_options().image_limits.allow_private
    )
    assert not encoder_config(default, 0).limits.allow_private
    allowed = parse_args(["--allow-image-urls", "--allow-private-image-urls"])
    assert allowed.api_options().image_limits.allow_private
    assert encoder_config(allowed, 0).limits.allow_private


def test_cache_salt_per_api_key_needs_keys_and_takes_a_secret_file(tmp_path: Path) -> None:
    assert parse_args([]).http_edge({}).cache_salt_key is None
    with pytest.raises(ConfigError, match="--cache-salt-per-api-key"):
        parse_args(["--cache-salt-per-api-key"]).http_edge({})  # no keys: no tenants
    random_secret = parse_args(["--cache-salt-per-api-key", "--api-key", "k"]).http_edge({}).cache_salt_key
    assert random_secret is not None and len(random_secret) == 32
    secret = tmp_path / "salt-key"
    secret.write_bytes(b"0123456789abcdef0123\n")
    flags = ["--cache-salt-per-api-key", "--cache-salt-key-file", str(secret), "--api-key", "k"]
    assert parse_args(flags).http_edge({}).cache_salt_key == b"0123456789abcdef0123"
    secret.write_bytes(b"short")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        parse_args(flags).http_edge({})
    with pytest.raises(ConfigError, match="--cache-salt-per-api-key"):
        parse_args(["--cache-salt-key-file", str(secret)])


def test_api_server_count_passes_each_process_the_stacks_services_and_the_socket() -> None:
    from libs.config.roles import Role
    from libs.gateway.api_servers import process_config
    from libs.stack.local import StackAddresses

    config = parse_args(["--mode", "2p1d", "--api-server-count", "3", "--kvstore"])
    assert config.api_server_count == 3
    addresses = StackAddresses(
        "127.0.0.1:1",
        {Role.PREFILL: ["127.0.0.1:2", "127.0.0.1:3"], Role.DECODE: ["127.0.0.1:4"]},
        "smollm2",
        "127.0.0.1:5",
    )
    child = parse_args(render(process_config(config, addresses, listen_fd=7)))
    assert (child.api_server_count, child.listen_fd, child.port_file) == (1, 7, None)
    assert not child.launches_stack and not child.kvstore
    assert child.tokenizer == "127.0.0.1:1" and child.kvstore_address == "127.0.0.1:5"
    assert child.prefill_workers == ("127.0.0.1:2", "127.0.0.1:3") and child.decode_workers == (
        "127.0.0.1:4",
    )
    assert child.routing == config.routing and child.request_timeout_s == config.request_timeout_s
    with pytest.raises(ConfigError, match="--api-server-count"):
        parse_args(["--api-server-count", "2", "--planner"])
    with pytest.raises(ConfigError, match="--api-server-count"):
        parse_args(["--api-server-count", "0"])


def test_lora_modules_take_vllms_two_spellings_several_after_one_flag() -> None:
    config = parse(
        GatewayConfig,
        [
            "--enable-lora",
            "--lora-modules",
            "sql=/adapters/sql",
            '{"name": "chat", "path": "/adapters/chat", "base_model_name": "smol"}',
        ],
    )
    assert config.lora_modules == (
        LoraModule("sql", "/adapters/sql"),
        LoraModule("chat", "/adapters/chat", "smol"),
    )
    assert parse(GatewayConfig, render(config)) == config  # what --api-server-count children get


def test_lora_modules_without_enable_lora_are_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="--enable-lora"):
        parse(GatewayConfig, ["--lora-modules", "sql=/adapters/sql"])
