"""deploy/compose: every stack validates with docker-compose (`config -q`), and its resolved
form has what a Cleave stack needs: Cleave images tagged $CLEAVE_TAG, ports on 127.0.0.1 only,
health checks, restart policies, limits, CPU sets per worker, the model volume, and commands
every service accepts, whose addresses name the stack's own services."""

from __future__ import annotations

import pytest

from tests.deploy.compose_config import (
    ENCODE_STACKS,
    STACKS,
    TAG,
    VLM,
    cleave_services,
    compose,
    long_running,
    resolved,
    run_compose,
)
from tests.deploy.service_flags import host_port, image_name, parse_command


@pytest.mark.parametrize("stack", STACKS)
def test_validates(stack: str) -> None:
    compose(stack, "config", "-q")


@pytest.mark.parametrize("stack", STACKS)
def test_services_run_cleave_images_with_health_restart_and_limits(stack: str) -> None:
    config = resolved(stack)
    for name, service in config["services"].items():
        assert image_name(service["image"]).startswith("cleave-"), name
        assert service["image"].endswith(f":{TAG}"), f"{name}: the tag comes from $CLEAVE_TAG"
        assert service.get("mem_limit"), f"{name} has no memory limit"
    for name, service in long_running(config).items():
        assert service["image"].endswith(f":{TAG}"), f"{name}: the tag comes from $CLEAVE_TAG"
        assert service["healthcheck"]["test"], name
        assert service["restart"] == "unless-stopped", name
        assert service.get("mem_limit"), f"{name} has no memory limit"
        if image_name(service["image"]) == "cleave-worker":
            assert service.get("cpus"), f"{name} has no CPU limit"
        else:
            assert service.get("cpuset"), f"{name} has no CPU set"
        assert "container_name" not in service, f"{name}: a fixed name prevents --scale"


@pytest.mark.parametrize("stack", STACKS)
def test_only_the_gateway_publishes_a_port_and_only_on_loopback(stack: str) -> None:
    config = resolved(stack)
    published = {name: s["ports"] for name, s in config["services"].items() if s.get("ports")}
    assert list(published) == ["gateway"]
    for port in published["gateway"]:
        text = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}"
        assert text.startswith("127.0.0.1:"), f"published beyond loopback: {port}"


@pytest.mark.parametrize("stack", STACKS)
def test_model_volume_is_named_and_mounted_at_models(stack: str) -> None:
    config = resolved(stack)
    assert config["volumes"]["models"]["name"] == "cleave-models"
    for name, service in cleave_services(config).items():
        if image_name(service["image"]) in ("cleave-worker", "cleave-tokenizer", "cleave-encoder"):
            assert "models:/models:rw" in service["volumes"], name


@pytest.mark.parametrize("stack", STACKS)
def test_commands_are_flags_the_services_accept_and_addresses_name_the_stack(stack: str) -> None:
    config = resolved(stack)
    services = cleave_services(config)
    parsed = {name: parse_command(s["image"], s["command"]) for name, s in services.items()}
    # Every name the stack's DNS answers: service names and network aliases.
    names: dict[str, list[str]] = {}
    for name, service in config["services"].items():
        for alias in [name, *((service.get("networks") or {}).get("cleave") or {}).get("aliases", [])]:
            names.setdefault(alias, []).append(name)

    def check_address(address: str, image: str) -> None:
        host, port = host_port(address)
        assert host in names, f"{address}: no service answers {host!r}"
        for target in names[host]:
            assert image_name(services[target]["image"]) == image, f"{address} is not a {image}"
            assert parsed[target].port == port, f"{address}: {target} listens on {parsed[target].port}"

    gateway = parsed["gateway"]
    assert not gateway.launches_stack and gateway.worker_dns_refresh_s > 0
    check_address(gateway.tokenizer, "cleave-tokenizer")
    check_address(gateway.kvstore_address, "cleave-kvstore")
    for address in gateway.prefill_workers + gateway.decode_workers + gateway.pd_workers:
        check_address(address, "cleave-worker")
    for address in gateway.encoders:
        check_address(address, "cleave-encoder")
    assert bool(gateway.encoders) == (stack in ENCODE_STACKS)
    roles = {
        w.role.value
        for w in (parsed[n] for n in services if image_name(services[n]["image"]) == "cleave-worker")
    }
    assert roles == ({"both"} if stack.endswith("pd") else {"prefill", "decode"})
    for name, config_ in parsed.items():
        assert config_.host == "0.0.0.0", f"{name} must listen beyond the container's loopback"
        if hasattr(config_, "kvstore_address"):
            check_address(config_.kvstore_address, "cleave-kvstore")


@pytest.mark.parametrize("stack", ["1p1d", "2p1d", "1e1p1d"])
def test_decode_trusts_each_prefills_fixed_nixl_address(stack: str) -> None:
    config = resolved(stack)
    services = cleave_services(config)
    workers = {
        n: parse_command(s["image"], s["command"]) for n, s in services.items() if "worker" in s["image"]
    }
    prefill_hosts = set()
    for name, worker in workers.items():
        if worker.role.value == "prefill":
            # vLLM binds the NIXL side channel to --kv-host: the container's own, fixed address.
            assert worker.kv_host == services[name]["networks"]["cleave"]["ipv4_address"], name
            prefill_hosts.add(worker.kv_host)
    assert prefill_hosts
    for name, worker in workers.items():
        if worker.role.value == "decode":
            assert set(worker.kv_allowed_hosts) == prefill_hosts, name
            # Decode workers are scaled: nothing fixed about them.
            assert "ipv4_address" not in (services[name]["networks"]["cleave"] or {}), name


@pytest.mark.parametrize("stack", STACKS)
def test_worker_engines_are_pinned_by_device_group_not_by_a_cpuset(stack: str) -> None:
    # vLLM's NIXL connector pins its transfer thread to the highest core of each NUMA node;
    # inside a cpuset without that core the worker fails at start and restarts for ever.
    config = resolved(stack)
    for name, service in cleave_services(config).items():
        if image_name(service["image"]) == "cleave-worker":
            worker = parse_command(service["image"], service["command"])
            assert worker.device_group, f"{name}: no --device-group for its OpenMP threads"
            assert "cpuset" not in service, f"{name}: a cpuset can lack the core NIXL pins to"


def test_redis_runs_from_the_kvstore_image_and_the_kvstore_uses_it() -> None:
    config = resolved("1p1d")
    redis = config["services"]["redis"]
    assert image_name(redis["image"]) == "cleave-kvstore" and redis["entrypoint"] == ["redis-server"]
    kvstore = parse_command(config["services"]["kvstore"]["image"], config["services"]["kvstore"]["command"])
    assert kvstore.store.redis_url == "redis://redis:6379"


@pytest.mark.parametrize("stack", ENCODE_STACKS)
def test_encode_stacks_serve_one_vision_language_model_with_embeddings_on(stack: str) -> None:
    config = resolved(stack)
    services = cleave_services(config)
    parsed = {n: parse_command(s["image"], s["command"]) for n, s in services.items()}
    by_image: dict[str, list[str]] = {}
    for name, service in services.items():
        by_image.setdefault(image_name(service["image"]), []).append(name)
    assert len(by_image["cleave-encoder"]) == 1
    serving = by_image["cleave-tokenizer"] + by_image["cleave-encoder"] + by_image["cleave-worker"]
    # The tokenizer's template, the encoder's vision tower and the workers' language model
    # must be the same model's.
    assert {parsed[n].model for n in serving} == {VLM}
    encoder = parsed[by_image["cleave-encoder"][0]]
    for name in by_image["cleave-worker"]:
        assert parsed[name].enable_mm_embeds, f"{name} refuses the encoder's embeddings"
        assert parsed[name].dtype == encoder.dtype, f"{name}: embeddings in another dtype"
    # The gateway waits for the encoder (it does not health-check it afterwards).
    assert config["services"]["gateway"]["depends_on"]["encoder"]["condition"] == "service_healthy"


@pytest.mark.parametrize("stack", ENCODE_STACKS)
def test_encode_stacks_have_no_default_model(stack: str) -> None:
    # No vision-language model ships in the images: without one the stack does not start.
    result = run_compose(stack, "config", "-q", vlm=None)
    assert result.returncode != 0 and "set CLEAVE_VLM_MODEL" in result.stderr, result.stderr


@pytest.mark.parametrize("stack", ["pd", "1p1d", "2p1d"])
def test_text_stacks_have_no_encoder_and_need_no_vlm(stack: str) -> None:
    result = run_compose(stack, "config", "-q", vlm=None)
    assert result.returncode == 0, result.stderr
    assert "encoder" not in resolved(stack)["services"]
