"""deploy/k8s rendered with kustomize (`kubectl kustomize`), for the Kubernetes tests: the
overlays' objects, their containers, and args as the kubelet expands them."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import tool

K8S_DIR = Path(__file__).parent.parent.parent / "deploy" / "k8s"
OVERLAYS = ["pd", "1p1d", "2p1d", "1e1pd", "1e1p1d", "1p1d-planner"]
# An encoder Deployment, workers with --enable-mm-embeds, the cleave-vlm ConfigMap's model.
ENCODE_OVERLAYS = ["1e1pd", "1e1p1d"]
# The oldest Kubernetes the manifests are for: policy/v1 PDBs (1.21), gRPC probes (GA in 1.27).
KUBERNETES_VERSION = "1.27.0"
# What the downward API gives a pod (status.podIP) when the test expands $(POD_IP).
EXAMPLE_POD_IP = "10.244.1.7"
GRPC_IMAGES = {"cleave-tokenizer", "cleave-worker", "cleave-kvstore", "cleave-encoder"}


def kubectl() -> str:
    return tool("kubectl", "kubernetes-client", "overlays not rendered (base and workers still validated)")


@functools.cache
def k8s_copy() -> Path:
    """The tree as plain files: kustomize does not read a runfiles tree's symlinked files."""
    copy = Path(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))) / "k8s"
    shutil.copytree(K8S_DIR, copy)  # follows the symlinks
    return copy


@functools.cache
def render_text(overlay: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(k8s_copy() / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=600,  # seconds on an idle machine; CI machines can be very loaded
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay}: {result.stderr}"
    return result.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's objects (parsed afresh: tests may not share mutable objects)."""
    return [doc for doc in yaml.safe_load_all(render_text(overlay)) if doc]


def raw_objects() -> list[dict[str, Any]]:
    """Every object of the base and the workers as written (no overlay applied)."""
    files = sorted((K8S_DIR / "base").glob("*.yaml")) + sorted((K8S_DIR / "workers").glob("*/*.yaml"))
    docs = [doc for f in files if f.name != "kustomization.yaml" for doc in yaml.safe_load_all(f.read_text())]
    return [doc for doc in docs if doc]


def objects(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in render(overlay)}


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def expanded_args(container: dict[str, Any], objs: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The args as the kubelet passes them: $(VAR) replaced from the container's env."""
    values: dict[str, str] = {}
    for env in container.get("env", []):
        source = env.get("valueFrom", {})
        if "value" in env:
            values[env["name"]] = env["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "status.podIP":
            values[env["name"]] = EXAMPLE_POD_IP
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            values[env["name"]] = objs[("ConfigMap", ref["name"])]["data"][ref["key"]]
    missing = [m for arg in container["args"] for m in re.findall(r"\$\((\w+)\)", arg) if m not in values]
    assert not missing, f"{container['name']}: args use undefined variables {missing}"
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg) for arg in container["args"]]
