from __future__ import annotations

import pytest

from libs.config.errors import ConfigError
from services.gateway.config import parse_args
from services.gateway.main import worker_args


def test_defaults_launch_a_local_1p1d_stack() -> None:
    config = parse_args([])
    assert config.launches_stack
    assert config.mode.name == "1p1d"
    assert config.model == "smollm2"


def test_qaic_disagg_flags_parse() -> None:
    config = parse_args(
        ["--mode", "2p1d", "--prefill-device-group", "0..15", "--decode-device-group", "16..23",
         "--prefill-max-num-seqs", "4", "--decode-override-qaic-config", "aic_num_cores:8 mos:1",
         "--kv-cache-dtype", "mxint8", "--decode-speculative-config", '{"method": "ngram"}']
    )  # fmt: skip
    assert config.prefill.device_group == tuple(range(16))
    assert config.decode.device_group == tuple(range(16, 24))
    assert config.prefill.max_num_seqs == 4
    assert config.decode.override_qaic_config == (("aic_num_cores", "8"), ("mos", "1"))


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


def test_kvstore_flags_start_one_or_use_one() -> None:
    assert not parse_args([]).uses_kvstore
    started = parse_args(["--kvstore", "--kvstore-redis-url", "redis://127.0.0.1:6379"])
    assert started.uses_kvstore and started.kvstore_redis_url == "redis://127.0.0.1:6379"
    assert parse_args(["--kvstore-address", "127.0.0.1:7700"]).uses_kvstore
    with pytest.raises(ConfigError, match=r"--kvstore: .*not both"):
        parse_args(["--kvstore", "--kvstore-address", "127.0.0.1:7700"])


def test_local_workers_get_the_kvstore_address() -> None:
    config = parse_args(["--kvstore-address", "127.0.0.1:7700"])
    args = worker_args(config, "prefill", "/m", "m", config.prefill, "127.0.0.1:7700")
    assert args[args.index("--kvstore-address") + 1] == "127.0.0.1:7700"
    assert "--kvstore-address" not in worker_args(config, "prefill", "/m", "m", config.prefill)
