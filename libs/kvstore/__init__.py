"""The kvstore's logic: KV chunks in CPU memory, on local disk and in Redis, on LMCache.

``libs.kvstore.store.KvStore`` is the whole API; services/kvstore is a thin gRPC shell
around it. This package file imports nothing, so that clients can use the LMCache-free
modules (identity.py, chunks.py, config.py) without paying LMCache's and torch's import.
"""
