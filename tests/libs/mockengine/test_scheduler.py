"""The mock's scheduling follows vLLM v1's: budgets, chunked prefill, FCFS, preemption,
n > 1, stop conditions and aborts (driven through the Simulator, no process)."""

from __future__ import annotations

from libs.mockengine.request import Status
from tests.libs.mockengine.helpers import add, finishes, run, simulator, tokens_by_request


def test_a_step_never_exceeds_the_token_budget_or_max_num_seqs() -> None:
    sim = simulator(max_num_seqs=3, max_num_batched_tokens=40)
    for i in range(6):
        add(sim, f"r{i}", range(100 + 10 * i, 120 + 10 * i), max_tokens=4)
    for _ in range(100):
        if not sim.has_work:
            break
        schedule = sim.scheduler.schedule()
        assert schedule.num_tokens <= 40
        assert len(sim.scheduler.running) <= 3
        assert len(schedule.chunks) <= 3
        for chunk in schedule.chunks:  # what Simulator.step does after scheduling
            chunk.request.num_computed_tokens += chunk.num_tokens
            if chunk.request.num_computed_tokens >= chunk.request.num_tokens:
                sim._sample(chunk.request)
    assert sim.requests_finished == 6


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    sim = simulator(max_num_batched_tokens=16, max_model_len=64)
    add(sim, "long", range(1, 51), max_tokens=2)  # 50 prompt tokens
    shapes = []
    while sim.has_work:
        step = sim.step()
        shapes.append((step.shape.prefill_tokens, [o.new_token_ids for o in step.outputs]))
    # 16 + 16 + 16 + 2: the first token comes with the fourth step, the second one step later.
    assert [s[0] for s in shapes] == [16, 16, 16, 2, 0]
    assert [len(s[1]) for s in shapes] == [0, 0, 0, 1, 1]


def test_long_prefill_token_threshold_caps_one_sequence_per_step() -> None:
    sim = simulator(max_num_batched_tokens=64, long_prefill_token_threshold=8)
    add(sim, "a", range(1, 21), max_tokens=1)
    add(sim, "b", range(30, 40), max_tokens=1)
    schedule = sim.scheduler.schedule()
    assert [(c.request.request_id, c.start, c.num_tokens) for c in schedule.chunks] == [
        ("a", 0, 8),
        ("b", 0, 8),
    ]


def test_waiting_requests_are_admitted_first_come_first_served() -> None:
    sim = simulator(max_num_seqs=1)
    for name in ("first", "second", "third"):
        add(sim, name, range(1, 5), max_tokens=2)
    order = [o.request_id for outputs in run(sim) for o in outputs if o.finish_reason]
    assert order == ["first", "second", "third"]


def test_running_sequences_are_scheduled_before_waiting_ones() -> None:
    sim = simulator(max_num_seqs=4, max_num_batched_tokens=20)
    add(sim, "old", range(1, 11), max_tokens=5)
    sim.step()  # "old" prefilled (10 tokens), now decoding
    add(sim, "new", range(50, 80), max_tokens=1)  # 30 tokens: more than the budget left
    schedule = sim.scheduler.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in schedule.chunks] == [("old", 1), ("new", 19)]


def test_preemption_frees_the_last_admitted_and_it_resumes_with_the_same_tokens() -> None:
    # 8 usable blocks of 16 tokens; three sequences that each grow to 40 tokens need 9.
    sim = simulator(num_kv_blocks=9, max_num_seqs=3, max_num_batched_tokens=64, max_model_len=64)
    prompts = {f"r{i}": list(range(10 * i + 1, 10 * i + 31)) for i in range(3)}
    for name, prompt in prompts.items():
        add(sim, name, prompt, max_tokens=10)
    steps = run(sim)
    assert sim.scheduler.num_preemptions >= 1
    # The same requests one at a time (no pressure) give the same tokens.
    alone = simulator(num_kv_blocks=9, max_num_seqs=1, max_model_len=64)
    for name, prompt in prompts.items():
        add(alone, name, prompt, max_tokens=10)
    assert tokens_by_request(steps) == tokens_by_request(run(alone))
    assert all(o.finish_reason == "length" for o in finishes(steps).values())
    assert sim.pool.num_free_blocks == 8


def test_the_last_admitted_running_sequence_is_the_one_preempted() -> None:
    sim = simulator(num_kv_blocks=5, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64)
    add(sim, "first", range(1, 32), max_tokens=20)  # 31 tokens: 2 blocks, then a third at 33
    add(sim, "second", range(40, 71), max_tokens=20)
    sim.step()
    assert [s.request_id for s in sim.scheduler.running] == ["first", "second"]
    while not sim.scheduler.num_preemptions:
        sim.step()
    assert [s.request_id for s in sim.scheduler.running] == ["first"]
    assert sim.scheduler.waiting[0].request_id == "second"
    assert sim.scheduler.waiting[0].status is Status.PREEMPTED
    assert sim.scheduler.waiting[0].num_computed_tokens == 0


def test_n_sequences_share_the_prompts_full_blocks() -> None:
    sim = simulator(max_num_batched_tokens=64)
    add(sim, "fan", range(1, 41), max_tokens=3, n=3, temperature=1.0, seed=7)  # 40 tokens: 2 full blocks
    sim.step()
    running = sim.scheduler.running
    assert len(running) == 3
    first_blocks = [tuple(b.block_id for b in s.blocks[:2]) for s in running]
    assert first_blocks[0] == first_blocks[1] == first_blocks[2]
    assert running[0].blocks[0].ref_cnt == 3
    assert running[0].blocks[2] is not running[1].blocks[2]  # the partial block is each one's own
    steps = [sim.step().outputs for _ in range(2)]
    tokens = tokens_by_request([*steps])
    assert len({tuple(t) for t in tokens.values()}) == 3  # random sampling: three different sequences
    assert sim.scheduler.prompt_tokens.local_cache_hit == 2 * 32


def test_greedy_n_sequences_are_equal() -> None:
    sim = simulator()
    add(sim, "g", range(1, 10), max_tokens=5, n=2)
    tokens = tokens_by_request(run(sim))
    assert tokens[("g", 0)] == tokens[("g", 1)]


def test_max_tokens_ends_with_length() -> None:
    sim = simulator()
    add(sim, "r", range(1, 10), max_tokens=7)
    steps = run(sim)
    assert len(tokens_by_request(steps)[("r", 0)]) == 7
    assert finishes(steps)[("r", 0)].finish_reason == "length"


def test_a_stop_token_ends_the_sequence_and_is_reported() -> None:
    probe = simulator()
    add(probe, "r", range(1, 10), max_tokens=10)
    natural = tokens_by_request(run(probe))[("r", 0)]
    stop = natural[4]
    sim = simulator()
    add(sim, "r", range(1, 10), max_tokens=10, stop_token_ids=[stop])
    steps = run(sim)
    assert tokens_by_request(steps)[("r", 0)] == natural[: natural.index(stop) + 1]
    finish = finishes(steps)[("r", 0)]
    assert (finish.finish_reason, finish.stop_reason) == ("stop", stop)


def test_min_tokens_holds_back_stop_tokens_and_eos() -> None:
    probe = simulator()
    add(probe, "r", range(1, 10), max_tokens=10)
    natural = tokens_by_request(run(probe))[("r", 0)]
    sim = simulator(eos_probability=1.0)  # EOS at every position it is allowed
    add(sim, "r", range(1, 10), max_tokens=10, min_tokens=3, stop_token_ids=[natural[0]])
    tokens = tokens_by_request(run(sim))[("r", 0)]
    assert natural[0] not in tokens[:3]
    assert 2 not in tokens[:3]  # SmolLM2's EOS
    assert len(tokens) == 4 and tokens[3] == 2  # the first position allowed to stop: EOS


def test_eos_stops_unless_ignored() -> None:
    sim = simulator(eos_probability=1.0)
    add(sim, "stops", range(1, 10), max_tokens=5)
    add(sim, "ignores", range(1, 10), max_tokens=5, ignore_eos=True)
    steps = run(sim)
    tokens = tokens_by_request(steps)
    assert tokens[("stops", 0)] == [2]
    assert finishes(steps)[("stops", 0)].finish_reason == "stop"
    assert finishes(steps)[("stops", 0)].stop_reason is None  # EOS is not a stop token
    assert len(tokens[("ignores", 0)]) == 5


def test_abort_frees_the_blocks_at_once_and_reports_abort() -> None:
    sim = simulator()
    add(sim, "r", range(1, 40), max_tokens=20, n=2)
    sim.step()
    assert sim.pool.num_free_blocks < 32
    outputs = sim.abort(["r"])
    assert sorted((o.index, o.finish_reason) for o in outputs) == [(0, "abort"), (1, "abort")]
    assert sim.pool.num_free_blocks == 32
    assert not sim.scheduler.running and not sim.has_work
    assert sim.abort(["r", "unknown"]) == []


def test_the_context_length_ends_a_sequence() -> None:
    sim = simulator(max_model_len=32)
    add(sim, "r", range(1, 31), max_tokens=100)
    steps = run(sim)
    assert len(tokens_by_request(steps)[("r", 0)]) == 2
    assert finishes(steps)[("r", 0)].finish_reason == "length"


def test_a_handed_over_prompt_waits_for_its_pull_then_computes_only_its_last_token() -> None:
    sim = simulator()
    params = {
        "do_remote_prefill": True,
        "remote_host": "h",
        "remote_port": 1,
        "remote_engine_id": "p",
        "remote_request_id": "x",
    }
    add(sim, "d", range(1, 41), max_tokens=2, kv_transfer_params=params)
    step = sim.step()
    (order,) = step.pulls
    assert (order.num_blocks, order.num_bytes) == (3, 3 * sim.resolved.kv_bytes_per_block)
    (sequence,) = sim.scheduler.waiting
    assert sequence.status is Status.WAITING_FOR_REMOTE_KV and len(sequence.blocks) == 3
    assert not sim.has_work and step.shape.num_seqs == 0  # nothing to do until the KV arrives
    sim.pull_succeeded(order, seconds=0.01)
    step = sim.step()
    assert (step.shape.num_seqs, step.shape.prefill_tokens) == (1, 1)  # the last prompt token
    assert [o.new_token_ids for o in step.outputs] != [[]]
    assert sim.scheduler.prompt_tokens.external == 40 and sim.scheduler.prompt_tokens.computed == 0


def test_a_failed_pull_ends_the_sequence_with_error_and_frees_its_blocks() -> None:
    sim = simulator()
    params = {"do_remote_prefill": True}
    add(sim, "d", range(1, 41), max_tokens=2, kv_transfer_params=params)
    (order,) = sim.step().pulls
    failed = sim.pull_failed(order, "refused")
    assert failed is not None and failed.finish_reason == "error" and "refused" in (failed.error or "")
    assert sim.pool.num_free_blocks == 32 and not sim.scheduler.waiting
