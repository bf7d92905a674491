"""Tokenizer work off the event loop: a bounded pool of threads, each with its own tokenizer.

Tokenizing a long prompt or rendering a chat template takes milliseconds to seconds; on the
service's event loop that stalls every other request, the streaming detokenizers above all
(their per-token work stays on the loop: it is microseconds, and a thread hop would cost
more). HF's Rust tokenizer releases the GIL while it encodes, so threads do run in parallel.
Each thread copies the tokenizer once, on its first call (HF fast tokenizers are not safe to
share between threads). At most `max_concurrent` calls run at once; the rest wait, and a
caller that gives up while waiting costs nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from libs.config.cpus import usable_cpus
from libs.tokenization.tokenizer import Tokenizer

T = TypeVar("T")


def default_concurrency() -> int:
    """The CPUs this process may use: its cores, capped by its container's CPU quota (a pod
    without a cpuset sees the node's cores; libs/config/cpus.py)."""
    return usable_cpus()


class TokenizerThreads:
    def __init__(self, tokenizer: Tokenizer, max_concurrent: int = 0) -> None:
        self.max_concurrent = max_concurrent or default_concurrency()
        self._tokenizer = tokenizer
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="tokenizer")
        self._slots = asyncio.Semaphore(self.max_concurrent)

    async def run(self, work: Callable[[Tokenizer], T]) -> T:
        """`work(tokenizer)` on a pool thread, with that thread's own tokenizer."""
        async with self._slots:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, work)

    def _call(self, work: Callable[[Tokenizer], T]) -> T:
        tokenizer: Tokenizer | None = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            tokenizer = self._local.tokenizer = self._tokenizer.copy()
        return work(tokenizer)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
