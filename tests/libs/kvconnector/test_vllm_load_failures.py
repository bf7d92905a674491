"""Whatever goes wrong while the connector loads KV (the kvstore, a bad chunk, a tensor that
does not fit), vLLM is told which blocks were not written and the engine keeps running."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from vllm.lora.request import LoRARequest

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2
from libs.kvconnector import paged
from libs.kvconnector.client import KvStoreUnavailable
from libs.kvconnector.counters import CounterBox
from libs.kvconnector.plan import LoadSpec, LookupResult
from libs.kvconnector.vllm_connector import ConnectorSettings, KvStoreConnector
from libs.kvstore.chunks import tensor_crc32c

CHUNK = 4
BLOCK = 2
LAYERS, HEADS, DIM = 2, 1, 2
PREFIX_HASHES = [f"{i:064x}" for i in range(1, 4)]


def make_chunk(index: int, *, tokens: int = CHUNK, value: float = 1.0) -> kvstore_pb2.KvChunk:
    dense = torch.full((LAYERS, 2, tokens, HEADS, DIM), value, dtype=torch.float32)
    kv = paged.to_proto(dense, encode_mxint8=False)
    key = kvstore_pb2.ChunkKey(prefix_hash=PREFIX_HASHES[index], chunk_index=index, num_tokens=tokens)
    return kvstore_pb2.KvChunk(key=key, kv=kv, crc32c=tensor_crc32c(kv))


class FakeClient:
    """get() streams `chunks`, then raises `error` (if any)."""

    def __init__(self, chunks: Sequence[kvstore_pb2.KvChunk], error: Exception | None = None) -> None:
        self.chunks = list(chunks)
        self.error = error
        self.salts: list[str] = []
        self.adapters: list[tuple[str, str] | None] = []

    def get(self, request_id: str, keys: Sequence[kvstore_pb2.ChunkKey]) -> Iterator[kvstore_pb2.KvChunk]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    def lookup(
        self,
        request_id: str,
        token_ids: Sequence[int],
        cache_salt: str = "",
        lora: common_pb2.LoraAdapter | None = None,
    ) -> LookupResult:
        if self.error is not None:
            raise self.error
        self.salts.append(cache_salt)
        self.adapters.append((lora.name, lora.path) if lora is not None else None)
        return LookupResult(matched_tokens=0, keys=())


def connector(client: FakeClient) -> KvStoreConnector:
    """The connector's worker half without a vLLM engine behind it."""
    conn = KvStoreConnector.__new__(KvStoreConnector)
    conn._settings = ConnectorSettings(address="unused", chunk_tokens=CHUNK, save=False, encode_mxint8=False)
    conn._block_size = BLOCK
    conn._dtype = torch.float32
    conn._layers = [torch.zeros(8, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    conn._failed_blocks = set()
    conn._counters = CounterBox()
    conn._client = client  # type: ignore[assignment]
    conn._requests = {}
    conn._skip_lookups_until = 0.0
    return conn


def spec(num_chunks: int) -> LoadSpec:
    keys = tuple(make_chunk(i).key for i in range(num_chunks))
    return LoadSpec(
        "r", keys, first_token=0, start=0, end=num_chunks * CHUNK, block_ids=tuple(range(2 * num_chunks))
    )


@pytest.mark.parametrize(
    "error",
    [
        KvStoreUnavailable("kvstore Get failed: DEADLINE_EXCEEDED"),
        RuntimeError("stream broke"),
        MemoryError(),
    ],
    ids=["unavailable", "any-error", "memory"],
)
def test_an_error_after_the_first_chunk_fails_only_the_blocks_not_written(error: Exception) -> None:
    conn = connector(FakeClient([make_chunk(0)], error))
    conn._load(spec(3))
    assert conn.get_block_ids_with_load_errors() == {2, 3, 4, 5}
    assert conn.get_block_ids_with_load_errors() == set()  # reported once
    assert all(bool((layer[0:2] == 1.0).all()) for layer in conn._layers)
    stats = conn._counters.take()
    assert stats is not None and stats.data["load_failures"] == 1 and stats.data["tokens_loaded"] == CHUNK


def test_a_chunk_whose_tensor_does_not_fit_the_cache_fails_its_blocks() -> None:
    bad = make_chunk(0)
    bad.kv.shape[:] = [LAYERS + 1, 2, CHUNK, HEADS, DIM]  # reshape fails in from_proto
    conn = connector(FakeClient([bad]))
    conn._load(spec(2))
    assert conn.get_block_ids_with_load_errors() == {0, 1, 2, 3}


def request(cache_salt: str | None = None, lora_request: LoRARequest | None = None) -> Any:
    fields = {"request_id": "r", "prompt_token_ids": list(range(12)), "kv_transfer_params": None}
    return type("Request", (), {**fields, "cache_salt": cache_salt, "lora_request": lora_request})()


def test_a_lookup_that_raises_anything_is_no_hit_and_pauses_lookups() -> None:
    conn = connector(FakeClient([], ValueError("unexpected answer")))
    assert conn.get_num_new_matched_tokens(request(), 0) == (0, False)
    assert conn._skip_lookups_until > 0
    stats = conn._counters.take()
    assert stats is not None and stats.data["lookup_failures"] == 1


def test_the_requests_cache_salt_reaches_the_kvstore_lookup() -> None:
    client = FakeClient([])
    connector(client).get_num_new_matched_tokens(request("tenant-a"), 0)
    connector(client).get_num_new_matched_tokens(request(None), 0)
    assert client.salts == ["tenant-a", ""]


def test_the_requests_lora_adapter_reaches_the_kvstore_lookup() -> None:
    client = FakeClient([])
    adapter = LoRARequest(lora_name="sql", lora_int_id=3, lora_path="/adapters/sql")
    connector(client).get_num_new_matched_tokens(request(lora_request=adapter), 0)
    connector(client).get_num_new_matched_tokens(request(), 0)
    assert client.adapters == [("sql", "/adapters/sql"), None]


def test_a_save_whose_copy_fails_is_counted_and_the_step_goes_on() -> None:
    from libs.kvconnector.plan import SaveSpec
    from libs.kvconnector.vllm_connector import KvStoreConnectorMetadata

    conn = connector(FakeClient([]))
    key = make_chunk(0).key
    meta = KvStoreConnectorMetadata(
        saves=[SaveSpec("r", key, start=0, block_ids=(99, 100))]
    )  # no such blocks
    conn._saver = object()  # type: ignore[assignment]  # never reached
    conn.bind_connector_metadata(meta)
    conn.wait_for_save()
    stats = conn._counters.take()
    assert stats is not None and stats.data["save_failures"] == 1
