"""Engines' prefix caches as their KV events describe them: vLLM's block hashes (hashing.py)
and the set of blocks one engine holds (cached_blocks.py). No vLLM import: workers, gateways
and the mock engine all use it."""
