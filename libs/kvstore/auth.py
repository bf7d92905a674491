"""Authenticated chunks: an HMAC-SHA256 tag under a key shared by every kvstore of a fleet.

Redis and a disk directory are storage that others may write to (anyone who reaches the
Redis port can SET a value). Without a key, a planted value that is well-formed KV for the
right prefix would be served to every worker as that prefix's attention state. With a key
(`--kv-auth-key-file`), every blob carries a tag over the chunk's cache key (prefix hash and
layout fingerprint) and its bytes; a blob read from disk or Redis whose tag does not verify
is treated as unreadable: deleted and counted, never served.

The key is read once from a file (never taken on a command line, never logged: this class
does not show it in its repr, and error messages name only the file).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from cleave.kvstore.v1 import kvstore_pb2

TAG_BYTES = hashlib.sha256().digest_size
MIN_KEY_BYTES = 16


class ChunkSealer:
    """Computes and checks the tags of one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a kvstore auth key needs at least {MIN_KEY_BYTES} bytes")
        self._key = key

    @classmethod
    def from_file(cls, path: Path) -> ChunkSealer:
        """The key in `path` (surrounding whitespace, such as a trailing newline, ignored)."""
        try:
            key = path.read_bytes().strip()
        except OSError as error:
            raise ValueError(f"--kv-auth-key-file {path}: cannot read it ({error.strerror})") from None
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"--kv-auth-key-file {path}: the key must be at least {MIN_KEY_BYTES} bytes")
        return cls(key)

    def tag(self, key: kvstore_pb2.ChunkKey, payload: bytes) -> bytes:
        message = b"%s/%s\0" % (key.layout_fingerprint.encode(), key.prefix_hash.encode())
        mac = hmac.new(self._key, message, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def verify(self, key: kvstore_pb2.ChunkKey, payload: bytes, tag: bytes) -> bool:
        return hmac.compare_digest(self.tag(key, payload), tag)

    def __repr__(self) -> str:
        return "ChunkSealer(<key hidden>)"
