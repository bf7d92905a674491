"""Deterministic OCI image pieces for tools/build_defs/oci.bzl (no registry, no daemon).

Subcommands:
  layer    files and directories (a JSON spec of destination -> source) -> one layer tar
  rootfs   a root file system directory (the debootstrapped base) -> one layer tar
  image    layers + settings -> an OCI image config and manifest
  archive  images -> one tar that is both an OCI image layout and a docker-archive, so
           `docker load`, `podman load` and `skopeo copy oci-archive:` all accept it

Every layer is an uncompressed tar with entries sorted by path, mtime fixed, numeric owners
(root unless said otherwise), no user or group names: the same inputs give the same bytes, so
the same digests. Layers stay uncompressed (digest == diff_id); `docker save`'s archives do
the same, and a registry push compresses them anyway.

Python bytecode: pip writes .pyc files that record their source's mtime, which the fixed
mtime would make stale (every start would recompile torch and vLLM in memory). Those are
rewritten as "unchecked hash-based" pycs (PEP 552): same code, a header that does not
depend on time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import stat
import struct
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MTIME = 0
COPY_BUFFER = 4 << 20
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# Inside a root file system: what the container runtime provides, and what only records the
# day the base was built.
ROOTFS_SKIP_CONTENTS = (
    "dev",
    "proc",
    "sys",
    "run",
    "tmp",
    "var/tmp",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
)
ROOTFS_SKIP_FILES = ("etc/machine-id", "etc/hostname", "etc/resolv.conf", "var/cache/ldconfig/aux-cache")


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class HashingWriter(io.RawIOBase):
    """A file that also hashes and counts what is written (tarfile writes through it)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]  # tarfile writes bytes
        self._handle.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


@dataclass(frozen=True)
class Entry:
    """One member of a layer: a regular file (src), a directory, or a symlink."""

    kind: str  # "file", "dir", "symlink", "empty"
    src: str = ""
    target: str = ""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


def normalized_mode(st_mode: int) -> int:
    # Only whether it is executable survives: umask-dependent bits would change digests.
    return 0o755 if st_mode & 0o111 else 0o644


def rewrite_pyc(path: Path, data: bytes) -> bytes:
    """A timestamp-based pyc as an unchecked hash-based one, when its source is beside it."""
    if len(data) < 16 or path.parent.name != "__pycache__":
        return data
    (flags,) = struct.unpack("<I", data[4:8])
    if flags != 0:
        return data
    source = path.parent.parent / (path.name.split(".", 1)[0] + ".py")
    if not source.is_file():
        return data
    source_hash = importlib.util.source_hash(source.read_bytes())
    return data[:4] + struct.pack("<I", 0b01) + source_hash + data[16:]


def write_layer(entries: dict[str, Entry], out: Path) -> dict[str, object]:
    """Writes entries (destination path without leading '/' -> Entry) sorted, parents
    first; returns the layer's descriptor."""
    with_parents = dict(entries)
    for dest in entries:
        parts = dest.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            with_parents.setdefault("/".join(parts[:i]), Entry("dir", mode=0o755))
    with out.open("wb") as handle:
        writer = HashingWriter(handle)
        with tarfile.open(fileobj=writer, mode="w", format=tarfile.GNU_FORMAT) as tar:
            tar.copybufsize = COPY_BUFFER  # type: ignore[attr-defined]  # used by addfile, untyped
            for dest in sorted(with_parents):
                add_entry(tar, dest, with_parents[dest])
    digest = "sha256:" + writer.sha256.hexdigest()
    return {"mediaType": LAYER_MEDIA_TYPE, "digest": digest, "size": writer.size, "diff_id": digest}


def add_entry(tar: tarfile.TarFile, dest: str, entry: Entry) -> None:
    info = tarfile.TarInfo(dest)
    info.mtime = MTIME
    info.uid, info.gid = entry.uid, entry.gid
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif entry.kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.target
        info.mode = 0o777
        tar.addfile(info)
    elif entry.kind == "empty":
        tar.addfile(info, io.BytesIO(b""))
    elif dest.endswith(".pyc"):
        data = rewrite_pyc(Path(entry.src), Path(entry.src).read_bytes())
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        info.size = os.path.getsize(entry.src)
        with open(entry.src, "rb") as handle:
            tar.addfile(info, handle)


def walk_source(src: Path, dest: str, entries: dict[str, Entry]) -> None:
    """A source file or a whole directory (pip's site directories come as one) under dest."""
    if not src.is_dir():
        entries[dest] = Entry("file", src=str(src), mode=normalized_mode(src.stat().st_mode))
        return
    entries[dest] = Entry("dir", mode=0o755)
    for root, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(root, src)
        base = dest if rel == "." else f"{dest}/{rel}"
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                entries[f"{base}/{name}"] = Entry("symlink", target=os.readlink(path))
            elif name in dirs:
                entries[f"{base}/{name}"] = Entry("dir", mode=0o755)
            else:
                entries[f"{base}/{name}"] = Entry(
                    "file", src=str(path), mode=normalized_mode(path.stat().st_mode)
                )


def cmd_layer(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.spec).read_text())
    entries: dict[str, Entry] = {}
    for item in spec:
        dest = item["dest"].strip("/")
        if "src" in item:
            walk_source(Path(item["src"]), dest, entries)
        elif "symlink" in item:
            entries[dest] = Entry("symlink", target=item["symlink"])
        elif item.get("empty"):
            entries[dest] = Entry("empty")
        else:
            entries[dest] = Entry(
                "dir", mode=int(item.get("mode", "755"), 8), uid=item.get("uid", 0), gid=item.get("gid", 0)
            )
    descriptor = write_layer(entries, Path(args.out))
    Path(args.descriptor).write_bytes(canonical_json(descriptor))


def rootfs_entries(root: Path) -> Iterator[tuple[str, Entry]]:
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(dirpath, root)
        if rel in ROOTFS_SKIP_CONTENTS:
            dirs[:] = []
            continue
        for name in dirs + files:
            path = Path(dirpath) / name
            dest = name if rel == "." else f"{rel}/{name}"
            if dest in ROOTFS_SKIP_FILES:
                continue
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                yield dest, Entry("symlink", target=os.readlink(path), uid=st.st_uid, gid=st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                yield dest, Entry("dir", mode=mode, uid=st.st_uid, gid=st.st_gid)
            elif stat.S_ISREG(st.st_mode):
                yield dest, Entry("file", src=str(path), mode=mode, uid=st.st_uid, gid=st.st_gid)
            # Device nodes, fifos and sockets: the runtime makes its own.


def cmd_rootfs(args: argparse.Namespace) -> None:
    descriptor = write_layer(dict(rootfs_entries(Path(args.dir))), Path(args.out))
    Path(args.descriptor).write_bytes(canonical_json(descriptor))


def cmd_image(args: argparse.Namespace) -> None:
    """Config and manifest blobs for layers given base first, from a JSON settings file."""
    settings = json.loads(Path(args.settings).read_text())
    layers = [json.loads(Path(d).read_text()) for d in args.layer]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": settings["config"],
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [
            {"created": "1970-01-01T00:00:00Z", "created_by": name} for name in settings["layer_names"]
        ],
    }
    config_blob = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": sha256_digest(config_blob),
            "size": len(config_blob),
        },
        "layers": [
            {"mediaType": layer["mediaType"], "digest": layer["digest"], "size": layer["size"]}
            for layer in layers
        ],
    }
    manifest_blob = canonical_json(manifest)
    Path(args.config_out).write_bytes(config_blob)
    Path(args.manifest_out).write_bytes(manifest_blob)
    Path(args.digest_out).write_text(
        f"image id (config digest) {sha256_digest(config_blob)}\nmanifest digest {sha256_digest(manifest_blob)}\n"
    )


def sha256_digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def cmd_archive(args: argparse.Namespace) -> None:
    """Images given as `name:tag=config,manifest,layer_tar[,layer_tar...]`, one archive."""
    blobs: dict[str, str | bytes] = {}  # hex digest -> a path to copy, or the bytes
    index, docker_manifest = [], []
    for image in args.image:
        ref, paths = image.split("=", 1)
        config_path, manifest_path, *layer_paths = paths.split(",")
        config_blob, manifest_blob = Path(config_path).read_bytes(), Path(manifest_path).read_bytes()
        manifest = json.loads(manifest_blob)
        layer_hexes = [layer["digest"].split(":", 1)[1] for layer in manifest["layers"]]
        if len(layer_hexes) != len(layer_paths):
            sys.exit(f"{ref}: manifest names {len(layer_hexes)} layers, {len(layer_paths)} given")
        for hex_digest, path in zip(layer_hexes, layer_paths, strict=True):
            blobs[hex_digest] = path
        config_hex = sha256_digest(config_blob).split(":", 1)[1]
        manifest_hex = sha256_digest(manifest_blob).split(":", 1)[1]
        blobs[config_hex], blobs[manifest_hex] = config_blob, manifest_blob
        tag = ref.rsplit(":", 1)[1]
        index.append(
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": "sha256:" + manifest_hex,
                "size": len(manifest_blob),
                "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
            }
        )
        docker_manifest.append(
            {
                "Config": f"blobs/sha256/{config_hex}",
                "RepoTags": [ref],
                "Layers": [f"blobs/sha256/{h}" for h in layer_hexes],
            }
        )
    small = {
        "oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
        "index.json": canonical_json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": index}),
        "manifest.json": canonical_json(docker_manifest),
    }
    if args.out == "-":
        write_archive(sys.stdout.buffer, blobs, small)
    else:
        with open(args.out, "wb") as out:
            write_archive(out, blobs, small)


def write_archive(out: BinaryIO, blobs: dict[str, str | bytes], small: dict[str, bytes]) -> None:
    # A stream ("w|"): the archive can go straight into `docker load` without a copy on disk.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        add_entry(tar, "blobs", Entry("dir", mode=0o755))
        add_entry(tar, "blobs/sha256", Entry("dir", mode=0o755))
        for hex_digest in sorted(blobs):
            source = blobs[hex_digest]
            info = tarfile.TarInfo(f"blobs/sha256/{hex_digest}")
            info.mtime, info.mode = MTIME, 0o644
            if isinstance(source, bytes):
                info.size = len(source)
                tar.addfile(info, io.BytesIO(source))
            else:
                info.size = os.path.getsize(source)
                with open(source, "rb") as handle:
                    tar.addfile(info, handle)
        for name in sorted(small):
            info = tarfile.TarInfo(name)
            info.mtime, info.mode, info.size = MTIME, 0o644, len(small[name])
            tar.addfile(info, io.BytesIO(small[name]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    layer = sub.add_parser("layer")
    layer.add_argument("--spec", required=True)
    layer.add_argument("--out", required=True)
    layer.add_argument("--descriptor", required=True)
    rootfs = sub.add_parser("rootfs")
    rootfs.add_argument("--dir", required=True)
    rootfs.add_argument("--out", required=True)
    rootfs.add_argument("--descriptor", required=True)
    image = sub.add_parser("image")
    image.add_argument("--settings", required=True)
    image.add_argument("--layer", action="append", required=True, help="layer descriptor, base first")
    image.add_argument("--config-out", required=True)
    image.add_argument("--manifest-out", required=True)
    image.add_argument("--digest-out", required=True)
    archive = sub.add_parser("archive")
    archive.add_argument("--image", action="append", required=True)
    archive.add_argument("--out", required=True, help="a file, or - for stdout")
    args = parser.parse_args(argv)
    {"layer": cmd_layer, "rootfs": cmd_rootfs, "image": cmd_image, "archive": cmd_archive}[args.command](args)


if __name__ == "__main__":
    main()
