"""The systems' command lines and environments: what each one starts, and that they are equal
where the comparison promises equal settings."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from libs.gateway.config import parse_args as parse_gateway_args
from libs.stack.local import colocated_groups
from libs.stack.process import ProcessSpec
from tools.bench.reference_server import build_parser as reference_parser
from tools.bench.systems.catalog import (
    KV_CACHE_GIB,
    REFERENCE_ITL_MS,
    REFERENCE_TTFT_MS,
    SYSTEMS,
    VARIANT_SYSTEMS,
    ServingSettings,
    SystemPlan,
    core_list,
    plan_system,
    split_cores,
)
from tools.vllm_disagg_proxy.main import parse_args as parse_proxy_args

MODEL = Path("/models/smollm2")


def settings(**fields: object) -> ServingSettings:
    values: dict[str, object] = {"model_path": MODEL, "python": "/usr/bin/python3", "cores": (0, 1)}
    values.update(fields)
    return ServingSettings(**values)  # type: ignore[arg-type]


def plan(name: str, **fields: object) -> SystemPlan:
    return plan_system(name, settings(**fields), itertools.count(9000).__next__)


def flag(spec: ProcessSpec, name: str) -> str:
    argv = list(spec.argv)
    assert argv.count(name) == 1, f"{name} appears {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


def module_args(spec: ProcessSpec, module: str) -> list[str]:
    """The arguments after `python -m module`."""
    assert list(spec.argv[:3]) == ["/usr/bin/python3", "-m", module]
    return list(spec.argv[3:])


def test_core_lists_are_compact_ranges() -> None:
    assert core_list((0, 1)) == "0-1"
    assert core_list((3,)) == "3"
    assert core_list((4, 0, 2, 3)) == "0,2-4"
    assert core_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert split_cores((0, 1)) == ((0,), (1,))
    assert split_cores((3, 2, 1, 0)) == ((0, 1), (2, 3))
    with pytest.raises(ValueError, match="at least 2 cores"):
        split_cores((0,))


def test_vllm_is_one_server_on_every_core() -> None:
    p = plan("vllm")
    (server,) = p.processes
    assert module_args(server, "vllm.entrypoints.openai.api_server")[:2] == ["--model", str(MODEL)]
    assert flag(server, "--served-model-name") == "smollm2"
    assert p.base_url == f"http://127.0.0.1:{flag(server, '--port')}"
    assert server.health_url == f"{p.base_url}/health"
    assert {"--enforce-eager", "--enable-prefix-caching"} <= set(server.argv)
    assert flag(server, "--generation-config") == "vllm" and flag(server, "--seed") == "0"
    assert "--kv-transfer-config" not in server.argv
    assert server.env["VLLM_CPU_KVCACHE_SPACE"] == str(KV_CACHE_GIB) == "1"
    assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert p.metrics_urls == {"server": f"{p.base_url}/metrics"}
    assert [probe.name for probe in p.probes] == ["vllm:request_prefill_time_seconds"]


def test_vllm_pd_is_producer_and_consumer_on_their_own_cores_behind_the_proxy() -> None:
    p = plan("vllm-pd")
    prefill, decode, proxy = p.processes
    configs = [json.loads(flag(s, "--kv-transfer-config")) for s in (prefill, decode)]
    assert configs == [
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu"},
        {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cpu"},
    ]
    assert (prefill.env["VLLM_CPU_OMP_THREADS_BIND"], decode.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    side_channels = {s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in (prefill, decode)}
    http_ports = {flag(s, "--port") for s in (prefill, decode, proxy)}
    assert len(side_channels) == 2 and not side_channels & http_ports
    for server in (prefill, decode):
        assert server.env["PYTHONHASHSEED"] == "0"
        assert server.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert server.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    config, args = parse_proxy_args(module_args(proxy, "tools.vllm_disagg_proxy.main"))
    assert config.prefill_urls == (f"http://127.0.0.1:{flag(prefill, '--port')}",)
    assert config.decode_urls == (f"http://127.0.0.1:{flag(decode, '--port')}",)
    assert p.base_url == f"http://127.0.0.1:{args.port}" and proxy.health_url == f"{p.base_url}/health"
    assert {probe.key: (probe.source, probe.name) for probe in p.probes} == {
        "prefill_stage_ms": ("proxy", "vllm_disagg_proxy_prefill_seconds"),
        "engine_prefill_ms": ("prefill", "vllm:request_prefill_time_seconds"),
        "kv_transfer_ms": ("decode", "vllm:nixl_xfer_time_seconds"),
    }
    assert set(p.metrics_urls) == {"proxy", "prefill", "decode"}


def test_vllm_pd_can_use_cleaves_connector_to_isolate_nixl_polling() -> None:
    p = plan("vllm-pd", vllm_pd_progress_delay_us=1000)
    for server, role in zip(p.processes[:2], ("kv_producer", "kv_consumer"), strict=True):
        config = json.loads(flag(server, "--kv-transfer-config"))
        assert config["kv_role"] == role
        assert config["kv_connector_module_path"] == "libs.worker.vllm_nixl_connector"
        assert config["kv_connector_extra_config"] == {"nixl_progress_delay_us": 1000}


@pytest.mark.parametrize(
    ("name", "mode", "prefill_group", "decode_group", "kvstore"),
    [
        ("cleave-pd", "pd", (), (0, 1), False),
        ("cleave-1p1d", "1p1d", (0,), (1,), False),
        ("cleave-1p1d-kvstore", "1p1d", (0,), (1,), True),
        ("cleave-1p1d-conditional", "1p1d", (0,), (1,), False),
    ],
)
def test_cleave_systems_are_gateway_command_lines_cleave_accepts(
    name: str, mode: str, prefill_group: tuple[int, ...], decode_group: tuple[int, ...], kvstore: bool
) -> None:
    p = plan(name, dtype="float32", max_model_len=1024, max_num_seqs=6)
    (gateway,) = p.processes
    config = parse_gateway_args(module_args(gateway, "services.gateway.main"))
    assert config.mode.name == mode
    assert config.launches_stack
    assert (config.kvstore, config.kvstore_address) == (kvstore, None)
    assert (config.prefill.device_group, config.decode.device_group) == (prefill_group, decode_group)
    assert (config.dtype, config.max_model_len) == ("float32", 1024)
    assert config.prefill.max_num_seqs == config.decode.max_num_seqs == 6
    assert (config.model, config.served_model_name) == (str(MODEL), "smollm2")
    assert p.base_url == f"http://127.0.0.1:{config.port}" and gateway.health_url == f"{p.base_url}/ready"
    assert p.metrics_urls == {"gateway": f"{p.base_url}/metrics"}


@pytest.mark.parametrize("name", ["cleave-1p1d", "cleave-1p1d-kvstore"])
def test_only_cleave_1p1d_probes_the_gateways_prefill_stage_and_kv_pulls(name: str) -> None:
    probes = {p.key: (p.source, p.name, dict(p.labels)) for p in plan(name).probes}
    assert probes == {
        "prefill_stage_ms": ("gateway", "cleave_gateway_stage_seconds", {"stage": "prefill"}),
        "kv_transfer_ms": ("gateway", "cleave_gateway_worker_kv_pull_seconds", {}),
    }
    assert "kv_transfer_ms" not in plan(name).stage_notes
    pd = plan("cleave-pd")
    assert pd.probes == () and pd.stage_notes["prefill_stage_ms"].startswith("n/a")


def test_every_system_gets_the_same_serving_settings() -> None:
    seen = {}
    for name in SYSTEMS:
        for spec in plan(name, dtype="float32", max_model_len=1536, max_num_seqs=5).processes:
            if "--dtype" not in spec.argv:
                continue  # the proxy
            seqs = [flag(spec, f) for f in ("--max-num-seqs", "--decode-max-num-seqs") if f in spec.argv]
            seen[spec.name] = (
                flag(spec, "--dtype"),
                flag(spec, "--max-model-len"),
                seqs[0],
                flag(spec, "--model"),
            )
    assert set(seen) == {
        "vllm", "vllm-pd-prefill", "vllm-pd-decode", "cleave-pd", "cleave-1p1d", "cleave-1p1d-kvstore",
        "cleave-1p1d-conditional",
    }  # fmt: skip
    assert set(seen.values()) == {("float32", "1536", "5", str(MODEL))}


def test_ports_are_distinct_and_bad_requests_are_refused() -> None:
    ports = itertools.count(9000).__next__
    plans = [plan_system(name, settings(), ports) for name in SYSTEMS]
    urls = [p.base_url for p in plans]
    assert len(set(urls)) == len(urls)
    with pytest.raises(ValueError, match="unknown system"):
        plan("sglang")
    with pytest.raises(ValueError, match="at least 2 cores"):
        plan("cleave-1p1d", cores=(0,))
    assert plan("vllm", cores=(0,)).processes[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    with pytest.raises(ValueError, match="twice"):
        settings(cores=(1, 1))


def test_reference_is_the_fixed_latency_server_and_not_run_by_default() -> None:
    p = plan("reference")
    (server,) = p.processes
    args = reference_parser().parse_args(module_args(server, "tools.bench.reference_server"))
    assert (args.ttft_ms, args.itl_ms) == (REFERENCE_TTFT_MS, REFERENCE_ITL_MS) == (200, 50)
    assert args.model == "smollm2" and p.base_url == f"http://127.0.0.1:{args.port}"
    assert server.health_url == f"{p.base_url}/health" and p.probes == ()
    assert "reference" not in SYSTEMS and not p.is_cleave


def test_only_the_conditional_system_runs_conditional_disaggregation() -> None:
    for name in SYSTEMS:
        for spec in plan(name).processes:
            if "services.gateway.main" in spec.argv:
                config = parse_gateway_args(module_args(spec, "services.gateway.main"))
                expected = "conditional" if name == "cleave-1p1d-conditional" else "always"
                assert config.disagg_policy == expected, name


def test_only_the_per_request_variant_opens_a_generate_call_per_request() -> None:
    for name in (*SYSTEMS, *VARIANT_SYSTEMS):
        for spec in plan(name).processes:
            if "services.gateway.main" in spec.argv:
                config = parse_gateway_args(module_args(spec, "services.gateway.main"))
                expected = "per-request" if name == "cleave-pd-per-request" else "shared"
                assert config.worker_streams == expected, name
    assert "cleave-pd-per-request" not in SYSTEMS  # an A/B variant, not run by default


def test_every_mock_system_runs_its_workers_on_the_mock_engine_without_a_start_up_wait() -> None:
    from tools.bench.systems.catalog import MOCK_SYSTEMS

    for name in MOCK_SYSTEMS:
        argv = plan_system(name, ServingSettings(model_path=Path("/m")), lambda: 1234).processes[0].argv
        flags = dict(zip(argv[3::2], argv[4::2], strict=False))
        assert flags.get("--engine") == "mock" and flags.get("--mock-startup-s") == "0.0", (name, argv)


def test_cleave_2pd_runs_two_colocated_workers_one_per_half_of_the_cores() -> None:
    (gateway,) = plan("cleave-2pd", cores=(0, 1, 2, 3)).processes
    config = parse_gateway_args(module_args(gateway, "services.gateway.main"))
    assert config.mode.colocated == 2 and not config.mode.prefill and not config.mode.decode
    assert colocated_groups(config, (0, 1, 2, 3)) == [(0, 1), (2, 3)]
    assert "cleave-2pd" not in SYSTEMS and "cleave-2pd" in VARIANT_SYSTEMS
    assert "colocated workers on cores 0-1, 2-3" in plan("cleave-2pd", cores=(0, 1, 2, 3)).description
