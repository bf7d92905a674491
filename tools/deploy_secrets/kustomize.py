"""The deployment's kustomization: one of deploy/k8s/overlays, its Secrets generated from the
folder's files (kustomize's secretGenerator, names suffixed with a hash of their content, so a
rotation rolls every pod that mounts them), its images at one content tag.

Written for every kustomize from 2.0.3 (Debian's kubectl 1.20) on: `bases` and `images`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tools.deploy_secrets import material

IMAGES = ("cleave-gateway", "cleave-tokenizer", "cleave-worker", "cleave-kvstore", "cleave-encoder")
# The Secrets the manifests mount (deploy/k8s/base), and the files each holds.
SECRETS = {
    "cleave-grpc": material.GRPC_FILES,
    "cleave-redis": material.REDIS_FILES,
    "cleave-kv-auth": material.KV_AUTH_FILES,
}


def kustomization(folder: Path, overlay: Path, image_tag: str) -> str:
    base = os.path.relpath(overlay.resolve(), folder.resolve())
    lines = [
        f"# Written by ./bazel run //tools/deploy_secrets (overlay {overlay.name}); `kubectl apply -k` this folder.",
        "# The key files here are this deployment's secrets: keep the folder out of version control.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "bases:",
        f"  - {base}",
        "secretGenerator:",
    ]
    for name, files in SECRETS.items():
        lines += [f"  - name: {name}", "    type: Opaque", "    files:"]
        lines += [f"      - {file}" for file in files]
    lines.append("images:")
    for image in IMAGES:
        lines += [f"  - name: {image}", f"    newTag: {image_tag}"]
    return "\n".join(lines) + "\n"
