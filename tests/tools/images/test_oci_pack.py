"""The image packer: the same inputs give the same bytes, and what it writes is what
docker/podman load expect (a docker-archive manifest.json and an OCI layout)."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

PACKER = Path(__file__).resolve().parents[3] / "tools" / "build_defs" / "oci_pack.py"


def pack(*args: str) -> None:
    subprocess.run([sys.executable, str(PACKER), *args], check=True)


def make_tree(root: Path) -> Path:
    package = root / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "mod.py").write_text("VALUE = 1\n")
    # dfile: the pyc records a file name; both trees' must agree for equal bytes.
    py_compile.compile(
        str(package / "mod.py"),
        dfile="pkg/mod.py",
        invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
    )
    (package / "tool").write_text("#!/bin/sh\n")
    (package / "tool").chmod(0o775)
    (package / "link").symlink_to("mod.py")
    return package


def member_bytes(tar: tarfile.TarFile, name: str) -> bytes:
    file = tar.extractfile(name)
    assert file is not None, f"{name} is not a regular file in the archive"
    return file.read()


def layer(tmp_path: Path, name: str, source: Path) -> dict[str, Any]:
    spec = tmp_path / f"{name}.spec.json"
    spec.write_text(
        json.dumps(
            [
                {"dest": "/opt/app/pkg", "src": str(source)},
                {"dest": "/models", "uid": 10001, "gid": 10001, "mode": "750"},
            ]
        )
    )
    pack(
        "layer",
        "--spec",
        str(spec),
        "--out",
        str(tmp_path / f"{name}.tar"),
        "--descriptor",
        str(tmp_path / f"{name}.json"),
    )
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_layers_are_reproducible_and_normalized(tmp_path: Path) -> None:
    first = layer(tmp_path, "a", make_tree(tmp_path / "one"))
    source = make_tree(tmp_path / "two")
    # Different times and permission bits a umask leaves: the same layer.
    for path in source.rglob("*"):
        if not path.is_symlink():
            os.utime(path, (1e9, 1e9))
    (source / "mod.py").chmod(0o600)
    second = layer(tmp_path, "b", source)
    assert first["digest"] == second["digest"]
    assert first["digest"] == first["diff_id"]

    with tarfile.open(tmp_path / "a.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members) == sorted(members)
        assert {"opt", "opt/app", "opt/app/pkg"} <= set(members)  # parents come first
        assert all(m.mtime == 0 and m.uname == "" for m in members.values())
        assert members["opt/app/pkg/tool"].mode == 0o755
        assert members["opt/app/pkg/mod.py"].mode == 0o644
        assert members["opt/app/pkg/link"].issym() and members["opt/app/pkg/link"].linkname == "mod.py"
        assert (members["models"].uid, members["models"].mode) == (10001, 0o750)
        pyc = member_bytes(tar, f"opt/app/pkg/__pycache__/mod.{sys.implementation.cache_tag}.pyc")
    # An unchecked hash-based pyc of the same source: valid whatever the file times are.
    assert struct.unpack("<I", pyc[4:8])[0] == 0b01
    assert pyc[8:16] == importlib.util.source_hash(b"VALUE = 1\n")


def test_archive_is_both_a_docker_archive_and_an_oci_layout(tmp_path: Path) -> None:
    descriptor = layer(tmp_path, "a", make_tree(tmp_path / "one"))
    settings = tmp_path / "settings.json"
    settings.write_text(
        json.dumps({"config": {"User": "10001:10001", "Entrypoint": ["x"]}, "layer_names": ["a"]})
    )
    outputs = {name: str(tmp_path / name) for name in ("config", "manifest", "digest")}
    pack(
        "image", "--settings", str(settings), "--layer", str(tmp_path / "a.json"),
        "--config-out", outputs["config"], "--manifest-out", outputs["manifest"], "--digest-out", outputs["digest"],
    )  # fmt: skip
    pieces = ",".join([outputs["config"], outputs["manifest"], str(tmp_path / "a.tar")])
    for name in ("one.tar", "two.tar"):
        pack(
            "archive",
            "--image",
            f"cleave-x:latest={pieces}",
            "--image",
            f"cleave-y:latest={pieces}",
            "--out",
            str(tmp_path / name),
        )
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()

    with tarfile.open(tmp_path / "one.tar") as tar:
        docker = json.loads(member_bytes(tar, "manifest.json"))
        index = json.loads(member_bytes(tar, "index.json"))
        config_hex = docker[0]["Config"].rsplit("/", 1)[1]
        config = json.loads(member_bytes(tar, docker[0]["Config"]))
        names = tar.getnames()
    assert [d["RepoTags"] for d in docker] == [["cleave-x:latest"], ["cleave-y:latest"]]
    assert docker[0]["Layers"] == ["blobs/sha256/" + descriptor["digest"].split(":")[1]]
    assert names.count(docker[0]["Layers"][0]) == 1  # a layer shared by two images, stored once
    assert config["rootfs"]["diff_ids"] == [descriptor["diff_id"]]
    assert config["config"]["User"] == "10001:10001"
    assert f"image id (config digest) sha256:{config_hex}" in Path(outputs["digest"]).read_text()
    assert [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]] == [
        "cleave-x:latest",
        "cleave-y:latest",
    ]
    assert "oci-layout" in names
