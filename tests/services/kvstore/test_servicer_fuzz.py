"""Fuzzing the kvstore's gRPC API over loopback on a real KvStore (memory + disk tiers):
arbitrary Put streams (random keys, layouts, tensors, checksums, and some well-formed chunks),
Get/Lookup with random keys never end as UNKNOWN, INTERNAL or
UNAVAILABLE (the workers' connector would take that as the store failing); the store still
answers, and a prompt stored before the fuzzing is still found whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cleave.common.v1 import common_pb2
from cleave.kvstore.v1 import kvstore_pb2 as pb
from cleave.kvstore.v1 import kvstore_pb2_grpc
from libs.kvstore.config import KvStoreConfig
from libs.kvstore.store import KvStore
from services.kvstore.servicer import KvStoreServicer, binding
from tests.fuzz.calls import Caller
from tests.fuzz.events import outcome
from tests.fuzz.protos import messages, mostly
from tests.fuzz.servers import background_server
from tests.libs.kvstore.helpers import BLOB_ALLOCATION, CHUNK_TOKENS, LAYOUT, make_chunk, prompt, put_prompt

REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
TIMEOUT_S = 30
CALLER = Caller(REFUSALS, TIMEOUT_S)
call = CALLER.unary
check_refusal = CALLER.refused
KNOWN_PROMPT = prompt(7, 4 * CHUNK_TOKENS)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis/ folder written into the checkout
    derandomize=True,  # the same examples every run: a CI failure reproduces locally
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

layouts = st.one_of(st.just(LAYOUT), st.just(common_pb2.KvLayout()), messages(common_pb2.KvLayout))
well_formed_chunks = st.builds(
    lambda hash_, index, tokens: make_chunk(
        pb.ChunkKey(prefix_hash=hash_, layout_fingerprint="", chunk_index=index, num_tokens=tokens)
    ),
    st.text("0123456789abcdef", min_size=1, max_size=64),
    st.integers(0, 8),
    st.integers(1, CHUNK_TOKENS),
)
OVERRIDES = {
    "cleave.kvstore.v1.PutRequest.layout": layouts,
    "cleave.kvstore.v1.LookupRequest.layout": layouts,
    "cleave.kvstore.v1.PutRequest.chunk": mostly(well_formed_chunks, messages(pb.KvChunk), percent=40),
    "cleave.kvstore.v1.LookupRequest.token_ids": st.one_of(
        st.lists(st.integers(0, 49151), max_size=5 * CHUNK_TOKENS), st.just(KNOWN_PROMPT)
    ),
}


class Store:
    def __init__(self, store: KvStore, stub: kvstore_pb2_grpc.KvStoreStub) -> None:
        self.store, self.stub = store, stub


@pytest.fixture(scope="module")
def kvstore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    config = KvStoreConfig(
        cpu_bytes=64 * BLOB_ALLOCATION,
        disk_dir=Path(tmp_path_factory.mktemp("kv")) / "disk",
        disk_bytes=1 << 20,
        chunk_tokens=CHUNK_TOKENS,
    )
    store = KvStore(config, registry=CollectorRegistry())
    put_prompt(store, KNOWN_PROMPT)
    servicer = KvStoreServicer(store)
    try:
        with background_server(lambda: [binding(servicer)]) as channel:
            yield Store(store, kvstore_pb2_grpc.KvStoreStub(channel))
    finally:
        store.close()


def still_serving(kvstore: Store) -> None:
    assert kvstore.stub.GetStats(pb.GetStatsRequest(), timeout=TIMEOUT_S).tiers
    found = kvstore.stub.Lookup(pb.LookupRequest(token_ids=KNOWN_PROMPT, layout=LAYOUT), timeout=TIMEOUT_S)
    assert found.matched_tokens == len(KNOWN_PROMPT), "a stored prompt was lost"


@FUZZ
@given(
    requests=st.lists(messages(pb.PutRequest, OVERRIDES), max_size=10),
    valid_prompt=st.one_of(st.none(), st.integers(0, 2**32)),
)
def test_put(kvstore: Store, requests: list[pb.PutRequest], valid_prompt: int | None) -> None:
    if valid_prompt is not None:  # chunks of a new prompt, mixed in: some Puts really store
        keys = kvstore.store.chunk_keys(prompt(valid_prompt, 2 * CHUNK_TOKENS), LAYOUT)
        requests = [*requests, *(pb.PutRequest(layout=LAYOUT, chunk=make_chunk(key)) for key in keys)]
    try:
        response = kvstore.stub.Put(iter(requests), timeout=TIMEOUT_S)
    except grpc.RpcError as error:
        check_refusal(error, requests)
    else:
        outcome("answered, some stored" if response.stored else "answered, none stored")
        assert response.stored + response.skipped_existing + response.rejected == len(requests)
    still_serving(kvstore)


@FUZZ
@given(request=messages(pb.GetRequest, OVERRIDES), known=st.integers(0, 4))
def test_get(kvstore: Store, request: pb.GetRequest, known: int) -> None:
    # The first `known` keys of a stored prompt first, so that some Gets stream chunks.
    keys = [*kvstore.store.chunk_keys(KNOWN_PROMPT, LAYOUT)[:known], *request.keys]
    del request.keys[:]
    request.keys.extend(keys)
    try:
        responses = list(kvstore.stub.Get(request, timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        check_refusal(error, request)
    else:
        outcome(f"streamed {min(len(responses), 2)}+ chunks")
        assert len(responses) <= len(request.keys)
    still_serving(kvstore)


@FUZZ
@given(request=messages(pb.LookupRequest, OVERRIDES))
def test_lookup(kvstore: Store, request: pb.LookupRequest) -> None:
    response = call(kvstore.stub.Lookup, request)
    if response is not None:
        assert 0 <= response.matched_tokens <= len(request.token_ids)
    still_serving(kvstore)
