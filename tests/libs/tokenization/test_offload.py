"""Tokenizer work on a bounded pool of threads, each with its own tokenizer copy."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from libs.tokenization.offload import TokenizerThreads, default_concurrency

pytestmark = pytest.mark.anyio


class CopyCountingTokenizer:
    """Tokenizer.copy() is all the pool needs; every copy is a new object."""

    def __init__(self, copies: list[CopyCountingTokenizer] | None = None) -> None:
        self.copies = copies if copies is not None else []

    def copy(self) -> CopyCountingTokenizer:
        clone = CopyCountingTokenizer(self.copies)
        self.copies.append(clone)
        return clone


async def test_work_runs_off_the_loop_thread_with_a_copy_per_thread() -> None:
    original: Any = CopyCountingTokenizer()
    threads = TokenizerThreads(original, max_concurrent=2)
    loop_thread = threading.get_ident()
    seen = await asyncio.gather(*(threads.run(lambda t: (threading.get_ident(), t)) for _ in range(20)))
    threads.close()
    assert all(ident != loop_thread for ident, _ in seen)
    assert all(tokenizer is not original for _, tokenizer in seen)
    # One copy per thread, reused by every later call on that thread.
    by_thread = {ident: {id(t) for i, t in seen if i == ident} for ident, _ in seen}
    assert all(len(ids) == 1 for ids in by_thread.values())
    assert len(original.copies) == len(by_thread) <= 2


async def test_at_most_max_concurrent_calls_run_at_once() -> None:
    threads = TokenizerThreads(CopyCountingTokenizer(), max_concurrent=2)  # type: ignore[arg-type]
    lock, release, two_in = threading.Lock(), threading.Event(), threading.Event()
    running = peak = 0

    def work(_tokenizer: object) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 2:
                two_in.set()
        release.wait(timeout=30)
        with lock:
            running -= 1
        return 1

    calls = [asyncio.ensure_future(threads.run(work)) for _ in range(5)]
    assert await asyncio.to_thread(two_in.wait, 30)  # two are in; the other three wait for a slot
    release.set()
    assert await asyncio.gather(*calls) == [1] * 5
    threads.close()
    assert peak == 2


def test_the_default_is_the_usable_cores() -> None:
    assert default_concurrency() >= 1
    assert TokenizerThreads(CopyCountingTokenizer(), 0).max_concurrent == default_concurrency()  # type: ignore[arg-type]
