"""A deployment's secrets: the gRPC token, the mTLS CA and certificate, the Redis password and
the kvstore's KV auth key (material.py), written once into a folder and kept; for Kubernetes
also the kustomization that turns them into Secrets (kustomize.py); staged rotations.

    ./bazel run //tools/deploy_secrets -- --out ~/cleave-prod --kustomize deploy/k8s/overlays/1p1d \\
        --image-tag c-1a2b3c4d5e6f          # then: kubectl -n cleave apply -k ~/cleave-prod
    ./bazel run //tools/deploy_secrets -- --out ~/cleave-prod --rotate token begin   # then apply
    docker run ... cleave-secrets --out /etc/cleave/secrets --no-ca-key   # compose's init step

Paths are taken as given, relative ones from the directory `bazel run` was started in.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.deploy_secrets import kustomize
from tools.deploy_secrets.material import Options, RotationError, Secrets, Step

ROTATIONS = ("token", "redis-password", "ca")


def _path(text: str) -> Path:
    path = Path(text).expanduser()
    # `bazel run` starts a tool in its runfiles; a relative path means the caller's directory.
    return path if path.is_absolute() else Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=_path, required=True, help="the deployment's secrets folder")
    parser.add_argument("--days", type=int, default=365, help="validity of a new CA and certificate")
    parser.add_argument("--no-ca-key", action="store_true", help="do not keep the CA key (compose)")
    parser.add_argument(
        "--rotate", nargs=2, metavar=("WHAT", "STEP"), action="append", default=[],
        help=f"one rotation step: WHAT in {', '.join(ROTATIONS)}, STEP begin, switch or finish",
    )  # fmt: skip
    parser.add_argument("--renew-cert", action="store_true", help="a new certificate from the same CA")
    parser.add_argument("--rotate-kv-auth-key", action="store_true", help="a new KV auth key (one rollout)")
    parser.add_argument(
        "--kustomize", type=_path, help="a deploy/k8s/overlays folder: write the kustomization"
    )
    parser.add_argument(
        "--image-tag", help="with --kustomize: the images' tag (./bazel run //tools/images prints it)"
    )
    args = parser.parse_args(argv)
    if args.kustomize is not None and not args.image_tag:
        parser.error("--kustomize needs --image-tag (a content tag; never latest)")
    secrets = Secrets(args.out, Options(days=args.days, keep_ca_key=not args.no_ca_key))
    try:
        written = secrets.ensure()
        for what, step_text in args.rotate:
            if what not in ROTATIONS:
                parser.error(f"--rotate {what}: one of {', '.join(ROTATIONS)}")
            step = Step(step_text)
            {
                "token": secrets.rotate_token,
                "redis-password": secrets.rotate_redis_password,
                "ca": secrets.rotate_ca,
            }[what](step)
            print(
                f"deploy_secrets: {what} rotation: {step.value} done; roll every service out before the next step"
            )
        if args.renew_cert:
            secrets.renew_certificate()
            print("deploy_secrets: a new certificate from the same CA; roll every service out")
        if args.rotate_kv_auth_key:
            secrets.rotate_kv_auth_key()
            print(
                "deploy_secrets: a new KV auth key; chunks stored under the old one are dropped as they are read"
            )
    except (RotationError, ValueError) as error:
        print(f"deploy_secrets: {error}", file=sys.stderr)
        return 2
    if written:
        print(f"deploy_secrets: wrote {', '.join(written)} in {args.out}")
    if args.kustomize is not None:
        (args.out / "kustomization.yaml").write_text(
            kustomize.kustomization(args.out, args.kustomize, args.image_tag)
        )
        print(
            f"deploy_secrets: wrote {args.out / 'kustomization.yaml'} (overlay {args.kustomize.name}, tag {args.image_tag})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
