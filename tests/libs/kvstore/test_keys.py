"""Chunk keys: LMCache's blake3 prefix chain, stable across processes, layout-scoped."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import blake3
import pytest

from cleave.common.v1 import common_pb2
from libs.kvstore.identity import InvalidKey, check_key, layout_fingerprint
from libs.kvstore.keys import ChunkKeyer, engine_key, salt_root
from tests.libs.kvstore.helpers import CHUNK_TOKENS, LAYOUT, prompt, with_layout

FP = layout_fingerprint(LAYOUT, CHUNK_TOKENS)


def reference_chain(tokens: list[int], chunk_tokens: int, salt: str = "") -> list[str]:
    """The documented scheme, written out independently of LMCache: blake3 over the
    previous digest (initially blake3 of an 8-byte zero and one uint32 zero, or with a salt
    blake3 of "cleave-cache-salt\0" and the salt) and the chunk's token ids as big-endian
    uint32."""
    prefix = blake3.blake3((0).to_bytes(8, "big") + struct.pack(">I", 0)).digest()
    if salt:
        prefix = blake3.blake3(b"cleave-cache-salt\0" + salt.encode()).digest()
    digests = []
    for start in range(0, len(tokens), chunk_tokens):
        chunk = tokens[start : start + chunk_tokens]
        prefix = blake3.blake3(prefix + struct.pack(f">{len(chunk)}I", *chunk)).digest()
        digests.append(prefix.hex())
    return digests


def test_keys_follow_the_blake3_prefix_chain_including_the_partial_tail() -> None:
    tokens = prompt(1, 3 * CHUNK_TOKENS + 5)
    keys = ChunkKeyer(CHUNK_TOKENS).keys(tokens, FP)
    assert [k.prefix_hash for k in keys] == reference_chain(tokens, CHUNK_TOKENS)
    assert [(k.chunk_index, k.num_tokens) for k in keys] == [(0, 16), (1, 16), (2, 16), (3, 5)]
    assert {k.layout_fingerprint for k in keys} == {FP}


def test_a_cache_salt_gives_every_chunk_other_keys() -> None:
    tokens = prompt(1, 2 * CHUNK_TOKENS + 5)
    keyer = ChunkKeyer(CHUNK_TOKENS)
    plain, salted, other = (keyer.keys(tokens, FP, salt) for salt in ("", "tenant-a", "tenant-b"))
    assert [k.prefix_hash for k in salted] == reference_chain(tokens, CHUNK_TOKENS, "tenant-a")
    for a, b in ((plain, salted), (salted, other), (plain, other)):
        assert all(x.prefix_hash != y.prefix_hash for x, y in zip(a, b, strict=True))
    assert keyer.keys(tokens, FP, "tenant-a") == salted
    # A salt on a prompt shorter than one chunk seeds its only (partial) chunk too.
    assert keyer.keys(tokens[:5], FP, "tenant-a")[0].prefix_hash != keyer.keys(tokens[:5], FP)[0].prefix_hash


def test_shared_prefix_shares_keys_until_the_first_differing_chunk() -> None:
    keyer = ChunkKeyer(CHUNK_TOKENS)
    a = prompt(2, 40)
    b = a[:20] + [t + 1 for t in a[20:]]  # differs from token 20 on: inside chunk 1
    keys_a, keys_b = keyer.keys(a, FP), keyer.keys(b, FP)
    assert keys_a[0] == keys_b[0]
    assert keys_a[1].prefix_hash != keys_b[1].prefix_hash
    # A later chunk depends on everything before it, not only on its own tokens.
    c = [a[0] + 1, *a[1:]]
    assert all(x.prefix_hash != y.prefix_hash for x, y in zip(keyer.keys(c, FP), keys_a, strict=True))


def test_partial_chunk_key_differs_from_the_full_chunk_it_begins() -> None:
    keyer = ChunkKeyer(CHUNK_TOKENS)
    tokens = prompt(3, CHUNK_TOKENS)
    assert keyer.keys(tokens[:10], FP)[0].prefix_hash != keyer.keys(tokens, FP)[0].prefix_hash


@pytest.mark.parametrize("bad", [[-1], [2**32]])
def test_token_ids_outside_uint32_are_refused(bad: list[int]) -> None:
    with pytest.raises(InvalidKey):
        ChunkKeyer(CHUNK_TOKENS).keys([1, *bad], FP)


def test_keys_agree_across_processes_with_different_hash_seeds() -> None:
    tokens = prompt(4, 70)
    script = (
        "import json, sys\n"
        "from cleave.common.v1 import common_pb2\n"
        "from libs.kvstore.identity import layout_fingerprint\n"
        "from libs.kvstore.keys import ChunkKeyer, engine_key\n"
        "layout = common_pb2.KvLayout(model_fingerprint='m', kv_dtype=common_pb2.DTYPE_BFLOAT16,"
        " num_layers=30, num_kv_heads=3, head_dim=64)\n"
        "keys = ChunkKeyer(16).keys(json.loads(sys.argv[1]), layout_fingerprint(layout, 16))\n"
        "print(json.dumps([engine_key(k).to_string() for k in keys]))\n"
    )
    env_base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "LMCACHE_LOG_LEVEL": "ERROR",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, json.dumps(tokens)],
            env={**env_base, "PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for seed in ("1", "2")
    ]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err.decode()[-2000:]
        outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
    layout = common_pb2.KvLayout(
        model_fingerprint="m", kv_dtype=common_pb2.DTYPE_BFLOAT16, num_layers=30, num_kv_heads=3, head_dim=64
    )
    here = [engine_key(k).to_string() for k in ChunkKeyer(16).keys(tokens, layout_fingerprint(layout, 16))]
    assert outputs[0] == outputs[1] == here
    assert len(here) == 5


def test_fingerprint_changes_with_every_layout_field_but_block_size() -> None:
    base = layout_fingerprint(LAYOUT, CHUNK_TOKENS)
    changed = [
        with_layout(model_fingerprint="other-model"),
        with_layout(kv_dtype=common_pb2.DTYPE_FLOAT16),
        with_layout(num_layers=3),
        with_layout(num_kv_heads=1),
        with_layout(head_dim=16),
    ]
    prints = {layout_fingerprint(layout, CHUNK_TOKENS) for layout in changed}
    assert base not in prints and len(prints) == len(changed)
    assert layout_fingerprint(LAYOUT, 2 * CHUNK_TOKENS) != base
    # Paging does not change a dense chunk, so engines with other block sizes share chunks.
    assert layout_fingerprint(with_layout(block_size=128), CHUNK_TOKENS) == base


@pytest.mark.parametrize(
    "change",
    [
        {"model_fingerprint": ""},
        {"kv_dtype": common_pb2.DTYPE_UNSPECIFIED},
        {"num_layers": 0},
        {"head_dim": -1},
    ],
)
def test_incomplete_layouts_have_no_fingerprint(change: dict[str, object]) -> None:
    with pytest.raises(InvalidKey):
        layout_fingerprint(with_layout(**change), CHUNK_TOKENS)


def test_engine_keys_are_namespaced_and_refuse_malformed_keys() -> None:
    key = ChunkKeyer(CHUNK_TOKENS).keys(prompt(5, 4), FP)[0]
    assert engine_key(key).to_string().startswith(f"cleave-{FP}@")
    for bad in (
        key.__class__(prefix_hash=key.prefix_hash[:-1], layout_fingerprint=FP),
        key.__class__(prefix_hash=key.prefix_hash.upper(), layout_fingerprint=FP),
        key.__class__(prefix_hash=key.prefix_hash, layout_fingerprint="x@y"),
    ):
        with pytest.raises(InvalidKey):
            check_key(bad)


def test_a_lora_adapter_keys_its_chunks_apart_from_the_base_model_and_other_adapters() -> None:
    tokens = prompt(3, CHUNK_TOKENS + 5)
    keyer = ChunkKeyer(CHUNK_TOKENS)
    sql = common_pb2.LoraAdapter(name="sql", path="/adapters/sql")
    sql_moved = common_pb2.LoraAdapter(name="sql", path="/adapters/sql-v2")
    chat = common_pb2.LoraAdapter(name="chat", path="/adapters/sql")
    chains = {
        label: [k.prefix_hash for k in keyer.keys(tokens, FP, salt, lora)]
        for label, salt, lora in (
            ("base", "", None),
            ("sql", "", sql),
            ("sql, new path", "", sql_moved),
            ("chat, same path", "", chat),
            ("sql, salted", "tenant-a", sql),
            ("salted", "tenant-a", None),
        )
    }
    for a in chains:
        for b in chains:
            if a != b:
                assert all(x != y for x, y in zip(chains[a], chains[b], strict=True)), (a, b)
    assert [k.prefix_hash for k in keyer.keys(tokens, FP, "", sql)] == chains["sql"]
    # No salt can spell a salt and an adapter: the parts are length-prefixed in their own domain.
    assert salt_root("x", common_pb2.LoraAdapter(name="y", path="z")) != salt_root(
        "", common_pb2.LoraAdapter(name="xy", path="z")
    )
