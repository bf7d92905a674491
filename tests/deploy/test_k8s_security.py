"""deploy/k8s secure by default, over every rendered overlay (docs/deploy.md, "Security"): each
pod's and container's security context; gRPC with mTLS and the token from the deployment's
Secret; Redis with its password; probes on the plaintext health port with timeouts; drains that
fit the termination grace; and a deployment as tools/deploy_secrets writes it: the Secrets
generated from its files, every reference to them resolved, images at one content tag."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.k8s_render import OVERLAYS, containers, expanded_args, k8s_copy, kubectl, objects
from tests.deploy.service_flags import image_name, parse_command
from tools.deploy_secrets.main import main as deploy_secrets

SECRETS = Path("/etc/cleave/secrets")
HEALTH_PORT = 50090
GRPC_SERVICES = {"cleave-tokenizer", "cleave-worker", "cleave-kvstore", "cleave-encoder"}


def deployments(overlay: str) -> dict[str, dict[str, Any]]:
    return {name: obj for (kind, name), obj in objects(overlay).items() if kind == "Deployment"}


def volume_sources(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod.get("volumes", [])}


def mount_of(pod: dict[str, Any], container: dict[str, Any], path: Path) -> dict[str, Any]:
    """The volume mounted at `path` in `container` (its definition in the pod)."""
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(path))
    assert mount.get("readOnly") is True, f"{container['name']}: {path} is writable"
    return volume_sources(pod)[mount["name"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_non_root_read_only_without_privileges_or_api_token(overlay: str) -> None:
    for name, deployment in deployments(overlay).items():
        pod = deployment["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        # Only the planner calls the Kubernetes API (it scales the worker Deployments).
        assert pod["automountServiceAccountToken"] is (name == "planner"), f"{name}: service-account token"
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        assert not any("hostPath" in v for v in pod.get("volumes", [])), name
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert not security.get("privileged"), name
            writable = {m["mountPath"] for m in container.get("volumeMounts", []) if not m.get("readOnly")}
            assert "/tmp" in writable, f"{name}: no scratch space on a read-only root"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_grpc_service_uses_the_deployments_mtls_and_token(overlay: str) -> None:
    objs = objects(overlay)
    for name, deployment in deployments(overlay).items():
        pod = deployment["spec"]["template"]["spec"]
        container = containers(deployment)[0]
        image = image_name(container["image"])
        if "command" in container or image == "cleave-planner":
            continue  # Redis; the planner speaks HTTP only (gateways' /metrics, the Kubernetes API)
        parsed = parse_command(container["image"], expanded_args(container, objs))
        assert parsed.grpc_tls_cert_file == SECRETS / "tls.crt", name
        assert parsed.grpc_tls_key_file == SECRETS / "tls.key", name
        assert parsed.grpc_tls_ca_file == SECRETS / "ca.crt", (
            f"{name}: without a CA a server takes any client"
        )
        assert parsed.grpc_tls_server_name == "cleave", name
        assert parsed.grpc_token_file == SECRETS / "grpc-token", name
        assert mount_of(pod, container, SECRETS)["secret"]["secretName"] == "cleave-grpc", name
        if image in GRPC_SERVICES:
            # The kubelet's grpc probe speaks neither TLS nor the token: the health port does.
            assert parsed.health_port == HEALTH_PORT, name
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container[probe]["grpc"]["port"] == HEALTH_PORT, f"{name} {probe}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_probe_has_a_timeout_and_liveness_is_not_readiness(overlay: str) -> None:
    for name, deployment in deployments(overlay).items():
        container = containers(deployment)[0]
        for probe in ("readinessProbe", "livenessProbe"):
            # The kubelet's default is 1 s, below what a probe takes on a loaded CPU.
            assert container[probe]["timeoutSeconds"] >= 3, f"{name} {probe}"
        if name != "redis":
            assert container["startupProbe"]["timeoutSeconds"] >= 3, name
    gateway = containers(deployments(overlay)["gateway"])[0]
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"  # no I/O (api/health.py)
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_drains_fit_the_termination_grace(overlay: str) -> None:
    objs = objects(overlay)
    for name, deployment in deployments(overlay).items():
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        if "command" in container or image_name(container["image"]) == "cleave-planner":
            continue  # Redis and the planner hold no requests
        parsed = parse_command(container["image"], expanded_args(container, objs))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        waited = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
        assert waited + parsed.shutdown_grace_s + 5 <= grace, (
            f"{name}: {waited}+{parsed.shutdown_grace_s} s of {grace}"
        )
        if image_name(container["image"]) == "cleave-worker":
            assert parsed.shutdown_grace_s >= 30, f"{name}: too short for running requests to finish"
    gateway = parse_command("cleave-gateway", containers(objs[("Deployment", "gateway")])[0]["args"])
    assert gateway.shutdown_grace_s >= gateway.request_timeout_s
    assert (
        containers(objs[("Deployment", "gateway")])[0]["lifecycle"]["preStop"]["exec"]["command"][0]
        == "sleep"
    )


@pytest.mark.parametrize("overlay", ["1p1d"])
def test_redis_requires_its_password_and_the_kvstore_has_it(overlay: str) -> None:
    objs = objects(overlay)
    redis = objs[("Deployment", "redis")]
    container = containers(redis)[0]
    pod = redis["spec"]["template"]["spec"]
    assert container["args"][0] == "/etc/cleave/redis/redis.conf"
    assert container["args"][container["args"].index("--protected-mode") + 1] == "yes"
    assert mount_of(pod, container, Path("/etc/cleave/redis"))["secret"]["secretName"] == "cleave-redis"
    assert "REDISCLI_AUTH" in " ".join(container["readinessProbe"]["exec"]["command"])
    kvstore = objs[("Deployment", "kvstore")]
    kv_container = containers(kvstore)[0]
    parsed = parse_command("cleave-kvstore", kv_container["args"])
    assert parsed.store.redis_url == "redis://redis:6379"  # no password in a pod spec
    assert parsed.store.redis_password_file == Path("/etc/cleave/redis/redis-password")
    assert parsed.store.kv_auth_key_file == Path("/etc/cleave/kv-auth/kv-auth-key")
    kv_pod = kvstore["spec"]["template"]["spec"]
    assert mount_of(kv_pod, kv_container, Path("/etc/cleave/redis"))["secret"]["secretName"] == "cleave-redis"
    assert (
        mount_of(kv_pod, kv_container, Path("/etc/cleave/kv-auth"))["secret"]["secretName"]
        == "cleave-kv-auth"
    )


@pytest.mark.parametrize("overlay", ["1p1d", "1e1p1d"])
def test_a_deployment_folder_renders_with_its_secrets_and_one_content_tag(
    overlay: str, tmp_path: Path
) -> None:
    folder = tmp_path / "prod"
    tag = "c-0123456789ab"
    assert (
        deploy_secrets(
            ["--out", str(folder), "--kustomize", str(k8s_copy() / "overlays" / overlay), "--image-tag", tag]
        )
        == 0
    )
    result = subprocess.run(
        [kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    secrets = {doc["metadata"]["name"]: doc for doc in rendered if doc["kind"] == "Secret"}
    # Names suffixed with a hash of their content: a rotation rolls every pod using them.
    assert {name.rsplit("-", 1)[0] for name in secrets} == {"cleave-grpc", "cleave-redis", "cleave-kv-auth"}
    assert set(next(s for n, s in secrets.items() if n.startswith("cleave-grpc-"))["data"]) == {
        "grpc-token", "ca.crt", "tls.crt", "tls.key",
    }  # fmt: skip
    for doc in rendered:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (doc["metadata"]["name"], volume)
        for container in pod["containers"]:
            assert container["image"].endswith(f":{tag}"), container["image"]
