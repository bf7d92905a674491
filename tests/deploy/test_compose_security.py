"""deploy/compose secure by default (docs/deploy.md, "Security"): the init step writes the
stack's secrets before anything starts; every gRPC service serves mTLS and requires the token,
with the material from the secrets volume; Redis requires its password and the kvstore has it
and its KV auth key; containers are read-only, without capabilities or privilege escalation;
drains fit the stop grace periods; probes use the plaintext health port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.compose_config import INIT_IMAGE, STACKS, cleave_services, long_running, resolved
from tests.deploy.service_flags import image_name, parse_command

SECRETS = Path("/etc/cleave/secrets")
HEALTH_PORT = 50090


def seconds(duration: str) -> float:
    """Compose's durations as docker-compose config writes them: 1m30s, 620s, 10m."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([hms])", duration))


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume:mode."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = f"{source}:{mode[0] if mode else 'rw'}"
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_the_init_step_writes_the_secrets_before_anything_starts(stack: str) -> None:
    config = resolved(stack)
    init = [n for n, s in config["services"].items() if image_name(s["image"]) == INIT_IMAGE]
    assert init == ["secrets"]
    secrets = config["services"]["secrets"]
    assert secrets["command"] == ["--out", str(SECRETS), "--no-ca-key"]
    assert mounts(secrets)[str(SECRETS)] == "secrets:rw"
    assert secrets["network_mode"] == "none" and secrets["restart"] == "no"

    def waits_for_secrets(name: str, seen: frozenset[str] = frozenset()) -> bool:
        depends = config["services"][name].get("depends_on") or {}
        if depends.get("secrets", {}).get("condition") == "service_completed_successfully":
            return True
        return any(waits_for_secrets(d, seen | {name}) for d in depends if d not in seen)

    for name in long_running(config):
        assert waits_for_secrets(name), f"{name} may start before the secrets exist"


@pytest.mark.parametrize("stack", STACKS)
def test_every_container_is_read_only_and_unprivileged(stack: str) -> None:
    for name, service in resolved(stack)["services"].items():
        assert service.get("read_only") is True, f"{name}: writable root file system"
        assert service.get("cap_drop") == ["ALL"], f"{name} keeps capabilities"
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        # Docker's default seccomp profile applies unless a service turns it off.
        assert not any("unconfined" in opt for opt in service.get("security_opt", [])), name
        assert not service.get("privileged") and "user" not in service, (
            f"{name}: runs as the image's uid 10001"
        )
        assert service.get("network_mode") in (None, "none"), f"{name}: shares a network namespace"
        # Writable scratch space and HOME (caches: vLLM, numba, Hugging Face) on a read-only
        # root; a tmpfs is root-owned unless told, and numba then refuses to start the kvstore.
        assert {"/tmp", "/home/cleave:uid=10001,gid=10001,mode=0700"} <= set(service.get("tmpfs", [])), name
        for volume in mounts(service).values():
            if volume.startswith("secrets:") and name != "secrets":
                assert volume == "secrets:ro", f"{name} may write the secrets"


@pytest.mark.parametrize("stack", STACKS)
def test_every_grpc_service_serves_and_calls_with_mtls_and_the_token(stack: str) -> None:
    config = resolved(stack)
    for name, service in cleave_services(config).items():
        parsed = parse_command(service["image"], service["command"])
        assert parsed.grpc_tls_cert_file == SECRETS / "tls.crt", name
        assert parsed.grpc_tls_key_file == SECRETS / "tls.key", name
        assert parsed.grpc_tls_ca_file == SECRETS / "ca.crt", (
            f"{name}: without a CA a server takes any client"
        )
        assert parsed.grpc_tls_server_name == "cleave", name
        assert parsed.grpc_token_file == SECRETS / "grpc-token", name
        assert mounts(service)[str(SECRETS)] == "secrets:ro", name
        if image_name(service["image"]) != "cleave-gateway":
            # The probe cannot speak mTLS: the health service alone, plaintext, on its own port.
            assert parsed.health_port == HEALTH_PORT, name
            assert service["healthcheck"]["test"][-1] == "grpc", name


@pytest.mark.parametrize("stack", STACKS)
def test_redis_requires_its_password_and_the_kvstore_has_it_and_the_kv_auth_key(stack: str) -> None:
    config = resolved(stack)
    redis = config["services"]["redis"]
    assert redis["command"][0] == str(SECRETS / "redis.conf")  # its ACL: the passwords
    assert "--protected-mode yes" in redis["command"]
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])
    kvstore = parse_command(config["services"]["kvstore"]["image"], config["services"]["kvstore"]["command"])
    assert kvstore.store.redis_url == "redis://redis:6379"  # no password on a command line
    assert kvstore.store.redis_password_file == SECRETS / "redis-password"
    assert kvstore.store.kv_auth_key_file == SECRETS / "kv-auth-key"


@pytest.mark.parametrize("stack", STACKS)
def test_drains_fit_the_stop_grace_periods(stack: str) -> None:
    config = resolved(stack)
    for name, service in cleave_services(config).items():
        parsed = parse_command(service["image"], service["command"])
        grace = seconds(service["stop_grace_period"])
        # The drain, then the engine's or the process's own stop, before Docker's SIGKILL.
        assert parsed.shutdown_grace_s + 5 <= grace, f"{name}: drains {parsed.shutdown_grace_s}s of {grace}s"
        if image_name(service["image"]) == "cleave-worker":
            assert parsed.shutdown_grace_s >= 30, f"{name}: too short for running requests to finish"
        if image_name(service["image"]) == "cleave-gateway":
            assert parsed.shutdown_grace_s >= parsed.request_timeout_s, f"{name}: cuts requests short"
