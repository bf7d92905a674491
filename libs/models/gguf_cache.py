"""A cache of converted GGUF files: convert once, publish atomically, never trust half a folder.

Layout inside cache_dir, for a key ``gguf-v<format>-<sha256 prefix>``:

    <key>/                    a finished conversion (only ever created by a rename)
    <key>/cleave-conversion.json   written last, before the rename; proof the folder is complete
    .<key>.lock               fcntl lock serializing converters of the same file
    .<key>.partial-XXXX/      a conversion in progress, or the leftover of a crashed one
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from libs.models import gguf_convert

log = structlog.get_logger(__name__)

# Bump when the converter's output changes, so folders written by older code are not reused.
CONVERSION_FORMAT_VERSION = 1
MARKER_FILE = "cleave-conversion.json"
_PARTIAL_INFIX = ".partial-"


def file_sha256(path: Path) -> str:
    # The whole file, not a sample: measured ~0.07 s for the 98 MB SmolLM2 file (~1.4 GB/s),
    # cheap next to a conversion, and it keys the cache by content alone (a copy or a
    # touched file still hits; an edited file never does).
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def cache_key(sha256: str) -> str:
    return f"gguf-v{CONVERSION_FORMAT_VERSION}-{sha256[:16]}"


def is_complete(folder: Path) -> bool:
    """True only for a folder published by `ensure_converted` (it carries the marker file)."""
    return (folder / MARKER_FILE).is_file()


def ensure_converted(gguf_path: Path, cache_dir: Path, progress: bool) -> Path:
    """The cached HF folder for `gguf_path`, converting it first if no finished one exists.

    Safe against crashes (a partial conversion is never renamed into place) and against
    concurrent callers in other processes or threads (one converts, the others wait and reuse).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    sha256 = file_sha256(gguf_path)
    key = cache_key(sha256)
    final = cache_dir / key
    if is_complete(final):
        log.info("models.gguf_cache_hit", gguf=str(gguf_path), folder=str(final))
        return final

    with _exclusive_lock(cache_dir / f".{key}.lock", key):
        # Another process may have finished the conversion while we waited for the lock.
        if is_complete(final):
            log.info("models.gguf_cache_hit", gguf=str(gguf_path), folder=str(final))
            return final
        _remove_leftovers(cache_dir, key)
        _convert_and_publish(gguf_path, sha256, cache_dir, key, progress)
    return final


def _convert_and_publish(gguf_path: Path, sha256: str, cache_dir: Path, key: str, progress: bool) -> None:
    # The temp folder sits in cache_dir itself so the final rename stays on one filesystem
    # (and therefore atomic).
    partial = Path(tempfile.mkdtemp(prefix=f".{key}{_PARTIAL_INFIX}", dir=cache_dir))
    started = time.perf_counter()
    try:
        gguf_convert.convert_gguf_to_hf(gguf_path, partial, progress)
        _write_marker(partial, gguf_path, sha256, time.perf_counter() - started)
        _make_world_readable(partial)
        # Data before name: after a power cut the renamed folder must not hold empty files.
        _fsync_tree(partial)
        os.rename(partial, cache_dir / key)
        _fsync_path(cache_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("models.gguf_cache_stored", gguf=str(gguf_path), folder=str(cache_dir / key))


def _write_marker(folder: Path, gguf_path: Path, sha256: str, seconds: float) -> None:
    stat = gguf_path.stat()
    marker = {
        "format_version": CONVERSION_FORMAT_VERSION,
        "source_path": str(gguf_path),
        "source_size": stat.st_size,
        "source_sha256": sha256,
        "conversion_seconds": round(seconds, 2),
        "converted_at_unix": int(time.time()),
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _remove_leftovers(cache_dir: Path, key: str) -> None:
    """Delete what earlier, interrupted attempts left for `key`. Call only with the key's lock held.

    Under the lock nobody else can be writing a partial folder for this key, so any that exists
    is from a crash. A final-named folder without the marker was not made by us (or by a
    non-atomic tool) and is not trusted either.
    """
    for leftover in cache_dir.glob(f".{key}{_PARTIAL_INFIX}*"):
        log.info("models.gguf_cache_leftover_removed", folder=str(leftover))
        shutil.rmtree(leftover, ignore_errors=True)
    final = cache_dir / key
    if final.exists():
        log.info("models.gguf_cache_untrusted_removed", folder=str(final))
        shutil.rmtree(final)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path, key: str) -> Iterator[None]:
    # flock locks belong to the open file, so this also serializes threads of one process
    # that each call ensure_converted. The lock file itself stays: deleting it would race.
    with lock_path.open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("models.gguf_cache_waiting", key=key, lock=str(lock_path))
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _make_world_readable(folder: Path) -> None:
    # mkdtemp creates the folder 0700 and safetensors writes 0600 files; the cache is shared
    # with other users and containers that only need to read it.
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            _fsync_path(path)
    _fsync_path(folder)


def _fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
