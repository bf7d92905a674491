from __future__ import annotations

import pytest

from libs.worker.errors import InvalidRequest
from libs.worker.handoff import handoff_from_params, params_from_handoff

# What vLLM 0.32's NixlConnector put in a prefill output's kv_transfer_params (measured).
PREFILL_OUTPUT = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3, 4, 5]],
    "remote_engine_id": "6d5e5801",
    "remote_request_id": "req-1-be4c5e2e",
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 532,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 0,
}


def test_round_trip_keeps_what_decode_needs() -> None:
    handoff = handoff_from_params(PREFILL_OUTPUT, lease_expires_unix_ms=5, worker_address="127.0.0.1:9")
    params = params_from_handoff(handoff)
    for key, value in PREFILL_OUTPUT.items():
        if key != "remote_blocks_expiry_time":
            assert params[key] == value, key
    assert handoff.lease_expires_unix_ms == 5


def test_flat_block_list_is_one_group() -> None:
    handoff = handoff_from_params(
        {**PREFILL_OUTPUT, "remote_block_ids": [7, 8]}, lease_expires_unix_ms=0, worker_address=""
    )
    assert [list(g.ids) for g in handoff.block_ids] == [[7, 8]]


def test_missing_keys_and_unknown_transport_are_errors() -> None:
    with pytest.raises(ValueError, match="without \\['remote_host'\\]"):
        handoff_from_params(
            {k: v for k, v in PREFILL_OUTPUT.items() if k != "remote_host"},
            lease_expires_unix_ms=0,
            worker_address="",
        )
    handoff = handoff_from_params(PREFILL_OUTPUT, lease_expires_unix_ms=0, worker_address="")
    handoff.transport = "mooncake"
    with pytest.raises(InvalidRequest, match="unsupported KV transport 'mooncake'"):
        params_from_handoff(handoff)


def test_a_decode_workers_trusted_hosts_round_trip_and_refuse_ports() -> None:
    from libs.config.errors import ConfigError
    from libs.config.flags import parse, render
    from libs.worker.config import WorkerConfig

    config = parse(WorkerConfig, ["--model", "m", "--kv-allowed-hosts", "10.0.0.1, prefill-a,::1"])
    assert config.kv_allowed_hosts == ("10.0.0.1", "prefill-a", "::1")
    assert parse(WorkerConfig, render(config)) == config
    with pytest.raises(ConfigError, match="without ports"):
        parse(WorkerConfig, ["--model", "m", "--kv-allowed-hosts", "prefill-a:5600"])


def test_lease_checks_at_their_edges() -> None:
    from libs.worker.errors import InvalidRequest, KvTransferFailed
    from libs.worker.handoff import check_lease

    handoff = handoff_from_params(PREFILL_OUTPUT, lease_expires_unix_ms=10_000, worker_address="")
    check_lease(handoff, now_s=9.999)
    with pytest.raises(KvTransferFailed, match="expired"):
        check_lease(handoff, now_s=10.0)
    handoff.lease_expires_unix_ms = 0
    with pytest.raises(InvalidRequest, match="no lease"):
        check_lease(handoff, now_s=0.0)


def test_a_network_in_the_allowed_hosts_trusts_its_addresses_only() -> None:
    from libs.config.errors import ConfigError
    from libs.config.flags import parse, render
    from libs.worker.config import WorkerConfig
    from libs.worker.handoff import UntrustedPeer, check_peer, trusted_hosts

    config = parse(WorkerConfig, ["--model", "m", "--kv-allowed-hosts", "10.244.0.0/16,fd00::/8,prefill-a"])
    assert parse(WorkerConfig, render(config)) == config
    trusted = trusted_hosts(config.kv_host, config.kv_allowed_hosts)
    handoff = handoff_from_params(PREFILL_OUTPUT, lease_expires_unix_ms=0, worker_address="")
    for host in ("10.244.3.7", "fd00::5", "[fd00::5]", "prefill-a"):
        handoff.host = host
        check_peer(handoff, trusted)
    for host in ("10.245.0.1", "fe80::1", "prefill-b", "10.244.3.7.example"):
        handoff.host = host
        with pytest.raises(UntrustedPeer):
            check_peer(handoff, trusted)
    with pytest.raises(ConfigError, match="network"):
        parse(WorkerConfig, ["--model", "m", "--kv-allowed-hosts", "10.244.0.0/33"])
