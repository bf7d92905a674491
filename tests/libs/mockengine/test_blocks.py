"""The block pool and the KV cache manager behave as vLLM's: prefix hits, cache_salt and LoRA
separation, LRU eviction of freed cached blocks, and the KV events they publish."""

from __future__ import annotations

import pytest

from libs.kvevents.hashing import BlockHasher, LoraIdentity
from libs.mockengine.blocks import BlockPool
from libs.mockengine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from libs.mockengine.kv_manager import KvCacheManager
from libs.mockengine.protocol import SamplingSpec
from libs.mockengine.request import SimRequest
from libs.mockengine.tokens import context_hash
from tests.libs.mockengine.helpers import add, run, simulator

BS = 4


def manager(num_blocks: int = 9) -> KvCacheManager:
    return KvCacheManager(BlockPool(num_blocks), BlockHasher(BS), max_model_len=64)


def request(
    prompt: list[int], *, salt: str = "", lora: LoraIdentity | None = None, name: str = "r"
) -> SimRequest:
    return SimRequest(
        request_id=name,
        index=0,
        prompt_token_ids=prompt,
        sampling=SamplingSpec(),
        sampling_key=0,
        context_hash=context_hash(prompt),
        cache_salt=salt,
        lora=lora,
    )


def admit(kv: KvCacheManager, req: SimRequest) -> int:
    """What the scheduler does at admission; returns the hit's length in tokens."""
    kv.update_hashes(req)
    hit = kv.computed_blocks(req)
    num_hit = len(hit) * BS
    assert kv.allocate_slots(req, req.num_tokens - num_hit, new_computed_blocks=hit)
    req.num_computed_tokens = req.num_tokens
    return num_hit


def test_the_null_block_is_never_handed_out_and_usage_excludes_it() -> None:
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4
    blocks = pool.allocate(4)
    assert 0 not in [b.block_id for b in blocks]
    assert pool.usage == 1.0
    with pytest.raises(ValueError):
        pool.allocate(1)


def test_a_repeated_prompt_hits_its_full_blocks_but_never_its_last_token() -> None:
    kv = manager()
    first = request(list(range(1, 13)))  # 12 tokens: 3 full blocks
    assert admit(kv, first) == 0
    kv.free(first)
    again = request(list(range(1, 13)), name="again")
    assert admit(kv, again) == 8  # the last block is recomputed for the last token's logits
    longer = request([*range(1, 13), 99], name="longer")
    assert admit(kv, longer) == 12


def test_a_hit_stops_at_the_first_differing_block() -> None:
    kv = manager()
    admit(kv, request(list(range(1, 13))))
    other = request([1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13], name="other")
    assert admit(kv, other) == 4


def test_cache_salt_separates_prefixes() -> None:
    kv = manager(20)
    admit(kv, request(list(range(1, 13)), salt="alice", name="a"))
    assert admit(kv, request([*range(1, 13), 0], salt="bob", name="b")) == 0
    assert admit(kv, request([*range(1, 13), 0], salt="", name="c")) == 0
    assert admit(kv, request([*range(1, 13), 0], salt="alice", name="d")) == 12


def test_lora_separates_prefixes() -> None:
    kv = manager(20)
    adapter = LoraIdentity("sql", "/adapters/sql", 1)
    admit(kv, request(list(range(1, 13)), lora=adapter, name="a"))
    assert admit(kv, request([*range(1, 13), 0], name="b")) == 0
    assert admit(kv, request([*range(1, 13), 0], lora=adapter, name="c")) == 12


def test_freed_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    kv = manager(7)  # 6 usable blocks
    old = request(list(range(1, 9)), name="old")  # blocks A1 A2
    new = request(list(range(101, 109)), name="new")  # blocks B1 B2
    admit(kv, old)
    admit(kv, new)
    kv.free(old)
    kv.free(new)
    kv.pool.take_events()
    # 2 never-used blocks first, then old's (its tail first), then new's.
    filler = request(list(range(201, 213)), name="filler")  # 3 blocks: the 2 free + old's tail
    admit(kv, filler)
    removed = [h for e in kv.pool.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == [old.block_hashes[1]]
    still_cached = [h for h in (*old.block_hashes, *new.block_hashes) if kv.pool.cached_block(h)]
    assert still_cached == [old.block_hashes[0], *new.block_hashes]
    # One more block: old's first block goes next, new's stay.
    admit(kv, request(list(range(301, 304)), name="one"))
    removed = [h for e in kv.pool.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == [old.block_hashes[0]]


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    pool = BlockPool(5)
    a, b = pool.allocate(2)
    a.block_hash = b"cached"
    pool._cached[b"cached"] = {a.block_id: a}
    pool.free([a, b])
    order = pool.free_queue.block_ids()
    assert order[0] == b.block_id and order[-1] == a.block_id


def test_a_hit_on_a_free_block_takes_it_out_of_the_free_queue() -> None:
    kv = manager()
    first = request(list(range(1, 9)))
    admit(kv, first)
    first_blocks = list(first.blocks)
    kv.free(first)
    free_before = kv.pool.num_free_blocks
    second = request([*range(1, 9), 9], name="second")
    assert admit(kv, second) == 8
    assert second.blocks[:2] == first_blocks
    assert [b.ref_cnt for b in second.blocks] == [1, 1, 1]
    assert kv.pool.num_free_blocks == free_before - 3  # 2 hit blocks left the queue, 1 new
    assert not {b.block_id for b in second.blocks} & set(kv.pool.free_queue.block_ids())


def test_block_stored_events_describe_the_new_blocks_as_vllm_does() -> None:
    kv = manager()
    req = request(list(range(1, 11)), salt="s")  # 2 full blocks + 2 tokens
    admit(kv, req)
    events = kv.pool.take_events()
    assert events == [
        BlockStored(
            block_hashes=req.block_hashes[:2],
            parent_block_hash=None,
            token_ids=list(range(1, 9)),
            block_size=BS,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[("s",), None],
        )
    ]
    # The sequence grows to a third full block: one more event, chained to the second.
    req.all_token_ids += [11, 12]
    req.output_token_ids += [11, 12]
    kv.update_hashes(req)
    assert kv.allocate_slots(req, 2)
    (event,) = kv.pool.take_events()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [req.block_hashes[2]]
    assert event.parent_block_hash == req.block_hashes[1]
    assert event.token_ids == [9, 10, 11, 12]


def test_lora_events_carry_its_name_and_id() -> None:
    kv = manager()
    admit(kv, request(list(range(1, 6)), lora=LoraIdentity("sql", "/p", 3)))
    (event,) = kv.pool.take_events()
    assert isinstance(event, BlockStored)
    assert (event.lora_id, event.lora_name, event.extra_keys) == (3, "sql", [("sql",)])


def test_reset_clears_the_cache_only_when_nothing_is_held() -> None:
    kv = manager()
    req = request(list(range(1, 10)))
    admit(kv, req)
    assert kv.pool.reset_prefix_cache() is False
    kv.free(req)
    kv.pool.take_events()
    assert kv.pool.reset_prefix_cache() is True
    assert kv.pool.take_events() == [AllBlocksCleared()]
    assert admit(kv, request(list(range(1, 10)), name="again")) == 0


def test_events_come_with_the_step_that_caused_them() -> None:
    sim = simulator()
    add(sim, "r", range(1, 40), max_tokens=1)
    step = sim.step()
    assert [type(e) for e in step.kv_events] == [BlockStored]
    assert len(step.kv_events[0].block_hashes) == 2  # 39 tokens: 2 full blocks of 16
    run(sim)
    assert sim.step().kv_events == []
