from __future__ import annotations

import stat
from pathlib import Path

from libs.config.flags import compose, parse, render
from libs.config.groups import CpuBinding, GrpcSecurityFlags
from libs.config.roles import Role
from libs.kvstore.server_config import KvStoreProcessConfig
from libs.stack.config import StackConfig
from libs.stack.local import (
    colocated_groups,
    confine_draft,
    kvstore_config,
    split_cores,
    tokenizer_config,
    with_default_groups,
    worker_config,
    write_stack_token,
)
from libs.tokenization.server_config import TokenizerServerConfig
from libs.worker.config import WorkerConfig
from libs.worker.engine_args import draft_cpu_cores, engine_environment
from libs.worker.speculative import parse_speculative_config


def test_role_flags_reach_that_roles_workers_only() -> None:
    config = parse(
        StackConfig,
        ["--prefill-kv-cache-bytes", "512MiB", "--decode-kv-cache-bytes", "2GiB", "--decode-max-num-seqs", "16",
         "--decode-port", "9800", "--max-model-len", "4096", "--dtype", "float32", "--log-level", "debug",
         "--decode-speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}',
         "--prefill-cpu-binding", "auto"],
    )  # fmt: skip
    prefill = worker_config(config, Role.PREFILL, config.prefill, 0, None)
    decode = worker_config(config, Role.DECODE, config.decode, 1, "127.0.0.1:7700")
    assert (prefill.cpu_binding, decode.cpu_binding) == (CpuBinding.AUTO, CpuBinding.CORES)
    assert parse(WorkerConfig, render(prefill)) == prefill
    assert (prefill.kv_cache_bytes, decode.kv_cache_bytes) == (512 << 20, 2 << 30)
    assert (prefill.max_num_seqs, decode.max_num_seqs) == (8, 16)
    assert (prefill.port, decode.port) == (0, 9801)  # --decode-port is the first decode worker's
    assert prefill.speculative_config is None
    assert decode.speculative_config == '{"method": "ngram", "num_speculative_tokens": 5}'
    assert decode.kvstore_address == "127.0.0.1:7700" and prefill.kvstore_address is None
    assert {w.max_model_len for w in (prefill, decode)} == {4096}
    assert {w.dtype for w in (prefill, decode)} == {"float32"}
    # What the child process is started with parses back to the same config.
    argv = render(decode)
    assert argv[argv.index("--kv-cache-bytes") + 1] == "2GiB"
    assert parse(WorkerConfig, argv) == decode


def test_a_draft_model_goes_to_prefill_too_an_ngram_config_does_not() -> None:
    draft = '{"speculative_model": "smollm2", "num_speculative_tokens": 3}'
    config = parse(StackConfig, ["--decode-speculative-config", draft])
    prefill = worker_config(config, Role.PREFILL, config.prefill, 0, None)
    decode = worker_config(config, Role.DECODE, config.decode, 0, None)
    assert prefill.speculative_config == decode.speculative_config == draft
    ngram = parse(
        StackConfig, ["--decode-speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}']
    )
    assert worker_config(ngram, Role.PREFILL, ngram.prefill, 0, None).speculative_config is None


def test_the_draft_leaves_the_prefill_workers_cores() -> None:
    # qaic_disagg's draft-model command gives the draft device 0, a prefill device; on CPU
    # the decode engine's team would then straddle the prefill's core (test_speculative:
    # the first request took 78 s instead of 4 s under load, and prefill stopped answering).
    draft = (
        '{"speculative_model": "smollm2", "num_speculative_tokens": 3,'
        ' "draft_override_qaic_config": {"device_group": [0, 3], "num_cores": 6}}'
    )
    args = [
        "--prefill-device-group",
        "0,1",
        "--decode-device-group",
        "2",
        "--decode-speculative-config",
        draft,
    ]
    config = confine_draft(parse(StackConfig, args))
    decode = parse(WorkerConfig, render(worker_config(config, Role.DECODE, config.decode, 0, None)))
    assert draft_cpu_cores(decode) == (3,)
    spec = parse_speculative_config(config.decode.speculative_config or "")
    assert spec.draft_override_qaic_config == {"device_group": [3], "num_cores": 6}
    # Only the shared cores go; all of them: the key goes, the other overrides stay.
    alone = confine_draft(
        parse(StackConfig, [*args[:4], "--decode-speculative-config", draft.replace("0, 3", "0")])
    )
    assert parse_speculative_config(alone.decode.speculative_config or "").draft_override_qaic_config == {
        "num_cores": 6
    }
    # Asked for: kept as written.
    overlap = parse(StackConfig, [*args, "--allow-device-overlap"])
    assert confine_draft(overlap) == overlap


def test_the_local_kvstore_gets_its_tiers_and_auth_key_file() -> None:
    config = parse(
        StackConfig,
        ["--kvstore", "--kvstore-redis-url", "redis://127.0.0.1:1", "--kvstore-auth-key-file", "/keys/kv"],
    )
    kvstore = kvstore_config(config, GrpcSecurityFlags())
    assert kvstore.store.redis_url == "redis://127.0.0.1:1"
    assert kvstore.store.kv_auth_key_file == Path("/keys/kv")
    argv = render(kvstore)
    assert argv[argv.index("--kv-auth-key-file") + 1] == "/keys/kv"  # the path, never the key
    assert parse(KvStoreProcessConfig, argv) == kvstore


def test_default_groups_split_the_usable_cores() -> None:
    assert split_cores((3, 2, 1, 0)) == ((0, 1), (2, 3))
    assert split_cores((5,)) == ((), ())
    config = with_default_groups(parse(StackConfig, []), (0, 1))
    assert (config.prefill.device_group, config.decode.device_group) == ((0,), (1,))
    colocated = with_default_groups(parse(StackConfig, ["--mode", "pd"]), (0, 1))
    assert colocated.decode.device_group == ()
    # One role's group given: the other role takes the other cores, not every core.
    given = with_default_groups(parse(StackConfig, ["--decode-device-group", "1"]), (0, 1))
    assert (given.prefill.device_group, given.decode.device_group) == ((0,), (1,))
    given = with_default_groups(parse(StackConfig, ["--prefill-device-group", "2"]), (0, 1, 2, 3))
    assert (given.prefill.device_group, given.decode.device_group) == ((2,), (0, 1, 3))
    # Nothing left for the other role: as given (it computes on every usable core).
    given = with_default_groups(parse(StackConfig, ["--prefill-device-group", "0,1"]), (0, 1))
    assert given.decode.device_group == ()


def test_a_pd_worker_computes_on_every_usable_core_and_disaggregated_ones_keep_their_groups() -> None:
    usable = (0, 1, 2, 3)

    def bind(args: list[str], role: Role) -> str:
        config = with_default_groups(parse(StackConfig, args), usable)
        options = config.prefill if role is Role.PREFILL else config.decode
        # As the child sees it: rendered to flags and parsed back.
        worker = parse(WorkerConfig, render(worker_config(config, role, options, 0, None)))
        return engine_environment(worker, usable)["VLLM_CPU_OMP_THREADS_BIND"]

    assert bind(["--mode", "pd"], Role.BOTH) == "0,1,2,3"
    assert bind(["--mode", "pd", "--decode-device-group", "1"], Role.BOTH) == "1"
    assert bind(["--mode", "1p1d"], Role.PREFILL) == "0,1"
    assert bind(["--mode", "1p1d"], Role.DECODE) == "2,3"
    assert bind(["--mode", "2p1d", "--prefill-device-group", "3"], Role.PREFILL) == "3"
    assert bind(["--mode", "2p1d", "--prefill-device-group", "3"], Role.DECODE) == "0,1,2"
    assert bind(["--mode", "1p1d", "--prefill-device-group", "0-3"], Role.DECODE) == "0,1,2,3"


def test_the_gateways_grpc_security_flags_reach_every_child(tmp_path: Path) -> None:
    security = GrpcSecurityFlags(grpc_token_file=tmp_path / "token", grpc_tls_ca_file=tmp_path / "ca.pem")
    config = parse(StackConfig, [])
    worker = worker_config(config, Role.DECODE, config.decode, 0, None, security)
    assert compose(GrpcSecurityFlags, (worker, GrpcSecurityFlags)) == security
    argv = render(worker)
    assert argv[argv.index("--grpc-token-file") + 1] == str(tmp_path / "token")
    assert "--grpc-token-file" not in render(worker_config(config, Role.DECODE, config.decode, 0, None))


def test_a_stack_token_is_random_and_readable_by_this_user_only(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = write_stack_token(tmp_path / "a"), write_stack_token(tmp_path / "b")
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert len(first.read_text()) >= 32 and first.read_text() != second.read_text()


def test_the_tool_call_parser_reaches_the_tokenizer() -> None:
    config = parse(StackConfig, ["--tool-call-parser", "hermes"])
    tokenizer = tokenizer_config(config)
    assert parse(TokenizerServerConfig, render(tokenizer)).tool_call_parser == "hermes"
    assert tokenizer_config(parse(StackConfig, [])).tool_call_parser is None


def test_max_logprobs_reaches_every_worker_and_their_engines() -> None:
    for value in ("-1", "0", "64"):
        config = parse(StackConfig, ["--max-logprobs", value])
        for role, flags in ((Role.PREFILL, config.prefill), (Role.DECODE, config.decode)):
            worker = worker_config(config, role, flags, 0, None)
            assert worker.max_logprobs == int(value)
            assert parse(WorkerConfig, render(worker)).max_logprobs == int(value)
    assert worker_config(parse(StackConfig, []), Role.BOTH, config.decode, 0, None).max_logprobs == 20


def test_the_chat_template_reaches_the_tokenizer() -> None:
    config = parse(StackConfig, ["--chat-template", "/t/hermes.jinja"])
    assert parse(TokenizerServerConfig, render(tokenizer_config(config))).chat_template == "/t/hermes.jinja"
    assert tokenizer_config(parse(StackConfig, [])).chat_template is None


def test_several_colocated_workers_split_the_cores_and_one_keeps_them_all() -> None:
    def groups(args: list[str], usable: tuple[int, ...]) -> list[tuple[int, ...]]:
        return colocated_groups(parse(StackConfig, args), usable)

    assert groups(["--mode", "2pd"], (0, 1)) == [(0,), (1,)]
    assert groups(["--mode", "2pd"], (3, 2, 1, 0)) == [(0, 1), (2, 3)]
    assert groups(["--mode", "3pd"], (0, 1, 2, 3)) == [(0,), (1,), (2,)]  # the 4th core unused
    # A decode group given: split among them.
    assert groups(["--mode", "2pd", "--decode-device-group", "2-5"], (0, 1, 2, 3, 4, 5)) == [(2, 3), (4, 5)]
    # One colocated worker: as given (none: every usable core), as before.
    assert groups(["--mode", "pd"], (0, 1)) == [()]
    # More workers than cores: no split, they share.
    assert groups(["--mode", "3pd"], (0, 1)) == [(), (), ()]
