"""deploy/k8s: every overlay renders with kustomize (`kubectl kustomize`), every object validates
against the Kubernetes OpenAPI schemas offline (kubernetes-validate, strict: unknown fields
fail), and the objects have what a Cleave deployment needs: Cleave images, native gRPC probes,
headless worker Services the gateway's addresses name, PodDisruptionBudgets, resource
requests, nothing published outside the cluster, and container args every service accepts."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.k8s_render import (
    ENCODE_OVERLAYS,
    EXAMPLE_POD_IP,
    GRPC_IMAGES,
    KUBERNETES_VERSION,
    OVERLAYS,
    containers,
    expanded_args,
    objects,
    raw_objects,
    render,
)
from tests.deploy.service_flags import host_port, image_name, parse_command


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    for obj in render(overlay):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_base_and_workers_validate_as_written() -> None:
    # Without kubectl the overlays are not rendered; the objects they are made of still are checked.
    for obj in raw_objects():
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_validator_refuses_an_unknown_field() -> None:
    deployment = next(o for o in raw_objects() if o["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_cleave_images_with_probes_and_resources(overlay: str) -> None:
    for (kind, name), obj in objects(overlay).items():
        if kind != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        assert not pod.get("hostNetwork"), name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in containers(obj):
            image = image_name(container["image"])
            assert image.startswith("cleave-"), f"{name}: {container['image']}"
            assert container["readinessProbe"] and container["livenessProbe"], name
            assert (
                container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
            ), name
            assert container["resources"]["limits"]["memory"], name
            assert not any("hostPort" in p for p in container.get("ports", [])), f"{name} uses a hostPort"
            if image in GRPC_IMAGES and "command" not in container:  # Redis overrides the command
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert "grpc" in container[probe], f"{name}: {probe} is not the gRPC health service"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_stay_inside_the_cluster(overlay: str) -> None:
    for (kind, name), obj in objects(overlay).items():
        if kind == "Service":
            assert obj["spec"].get("type", "ClusterIP") == "ClusterIP", (
                f"{name} is published outside the cluster"
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_args_are_flags_the_services_accept_and_addresses_name_the_services(overlay: str) -> None:
    objs = objects(overlay)
    parsed: dict[str, Any] = {}
    for (kind, name), obj in objs.items():
        if kind == "Deployment":
            container = containers(obj)[0]
            if "command" not in container:
                parsed[name] = parse_command(container["image"], expanded_args(container, objs))

    def service_port(address: str, image: str, *, headless: bool) -> None:
        host, port = host_port(address)
        service = objs.get(("Service", host))
        assert service is not None, f"{address}: no Service {host!r}"
        assert (service["spec"].get("clusterIP") == "None") == headless, (
            f"{host}: headless should be {headless}"
        )
        target = objs[("Deployment", host)]
        assert service["spec"]["selector"].items() <= target["spec"]["template"]["metadata"]["labels"].items()
        assert image_name(containers(target)[0]["image"]) == image, address
        assert any(p["port"] == port for p in service["spec"]["ports"]), address
        assert parsed[host].port == port, f"{address}: the pods listen on {parsed[host].port}"

    gateway = parsed["gateway"]
    assert not gateway.launches_stack and gateway.worker_dns_refresh_s > 0
    # More than one gateway by default: the API is no single point of failure.
    assert objs[("Deployment", "gateway")]["spec"]["replicas"] >= 2
    # Headless: every tokenizer replica's address, which the gateway's channel balances over.
    service_port(gateway.tokenizer, "cleave-tokenizer", headless=True)
    service_port(gateway.kvstore_address, "cleave-kvstore", headless=False)
    workers = gateway.prefill_workers + gateway.decode_workers + gateway.pd_workers
    # Headless: the name resolves to every ready pod, so scaling needs no gateway change.
    for address in workers:
        service_port(address, "cleave-worker", headless=True)
    assert {host_port(a)[0] for a in workers} == ({"pd"} if overlay.endswith("pd") else {"prefill", "decode"})
    # Headless like the workers: gRPC's resolver finds a restarted encoder pod's new IP.
    for address in gateway.encoders:
        service_port(address, "cleave-encoder", headless=True)
    assert bool(gateway.encoders) == (overlay in ENCODE_OVERLAYS)
    for name, config in parsed.items():
        assert config.host == "0.0.0.0", f"{name} must listen on the pod's address"


@pytest.mark.parametrize("overlay", ["1p1d", "2p1d", "1e1p1d"])
def test_prefill_advertises_its_pod_ip_and_decode_trusts_the_prefill_service(overlay: str) -> None:
    objs = objects(overlay)
    prefill = parse_command(
        "cleave-worker", expanded_args(containers(objs[("Deployment", "prefill")])[0], objs)
    )
    decode = parse_command(
        "cleave-worker", expanded_args(containers(objs[("Deployment", "decode")])[0], objs)
    )
    assert prefill.kv_host == EXAMPLE_POD_IP and prefill.kv_port
    # No address range: decode trusts what the prefill workers' headless Service resolves to,
    # the ready prefill pods, whatever network plugin gives them their addresses.
    assert decode.kv_allowed_dns == ("prefill",) and not decode.kv_allowed_hosts
    service = objs[("Service", "prefill")]["spec"]
    assert service["clusterIP"] == "None"
    labels = objs[("Deployment", "prefill")]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in containers(objs[("Deployment", "prefill")])[0]["ports"]}
    assert ports["nixl"] == prefill.kv_port


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_worker_and_the_gateway_have_a_disruption_budget(overlay: str) -> None:
    objs = objects(overlay)
    budgets = {name: obj for (kind, name), obj in objs.items() if kind == "PodDisruptionBudget"}
    for (kind, name), obj in objs.items():
        if kind == "Deployment" and (
            name == "gateway" or image_name(containers(obj)[0]["image"]) == "cleave-worker"
        ):
            assert name in budgets, f"{name} has no PodDisruptionBudget"
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_topologies_differ_in_their_workers_only() -> None:
    replicas = {
        overlay: {
            name: obj["spec"]["replicas"]
            for (kind, name), obj in objects(overlay).items()
            if kind == "Deployment"
        }
        for overlay in OVERLAYS
    }
    shared = {"gateway": 2, "tokenizer": 1, "kvstore": 1, "redis": 1}
    assert replicas["pd"] == {**shared, "pd": 1}
    assert replicas["1p1d"] == {**shared, "prefill": 1, "decode": 1}
    assert replicas["2p1d"] == {**shared, "prefill": 2, "decode": 1}
    assert replicas["1e1pd"] == {**shared, "encoder": 1, "pd": 1}
    assert replicas["1e1p1d"] == {**shared, "encoder": 1, "prefill": 1, "decode": 1}


@pytest.mark.parametrize("overlay", ENCODE_OVERLAYS)
def test_encode_overlays_serve_one_vision_language_model_with_embeddings_on(overlay: str) -> None:
    objs = objects(overlay)
    parsed = {
        name: parse_command(containers(obj)[0]["image"], expanded_args(containers(obj)[0], objs))
        for (kind, name), obj in objs.items()
        if kind == "Deployment"
        and "command" not in containers(obj)[0]
        and name != "gateway"
        and name != "kvstore"
    }
    vlm = objs[("ConfigMap", "cleave-vlm")]["data"]["model"]
    # The tokenizer's template, the encoder's vision tower and the workers' language model
    # must be the same model's.
    assert {config.model for config in parsed.values()} == {vlm}
    workers = [
        n for n in parsed if image_name(containers(objs[("Deployment", n)])[0]["image"]) == "cleave-worker"
    ]
    assert workers
    for name in workers:
        assert parsed[name].enable_mm_embeds, f"{name} refuses the encoder's embeddings"
        assert parsed[name].dtype == parsed["encoder"].dtype, f"{name}: embeddings in another dtype"


@pytest.mark.parametrize("overlay", ["pd", "1p1d", "2p1d"])
def test_text_overlays_have_no_encoder(overlay: str) -> None:
    objs = objects(overlay)
    assert ("Deployment", "encoder") not in objs and ("ConfigMap", "cleave-vlm") not in objs
