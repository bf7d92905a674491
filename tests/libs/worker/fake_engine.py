"""An in-memory Engine for the worker's logic tests: counts tokens up from the prompt's
last token, honours max_tokens / n / stop_token_ids, and records aborts and KV params."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from libs.kvlayout.layout import KvFacts
from libs.worker.engine import Adapter, EngineInfo, EngineStats, EngineStep, SequenceDelta, TokenLogprob
from libs.worker.kv_cache_feed import KvCacheFeed

INFO = EngineInfo(
    model="fake",
    vocab_size=1000,
    max_model_len=64,
    kv=KvFacts(
        model_fingerprint="f00d",
        block_size=16,
        kv_cache_dtype="bfloat16",
        num_layers=2,
        num_kv_heads=2,
        head_dim=32,
    ),
    num_kv_blocks=100,
    engine_id="fake-engine",
    engine_version="fake 0",
)


class FakeEngine:
    def __init__(
        self, info: EngineInfo = INFO, token_delay_s: float = 0.0, fail_kv_loads: bool = False
    ) -> None:
        # fail_kv_loads: requests with handed-over KV end as vLLM ends a failed KV load
        # under its "fail" policy: no tokens, finish reason "error".
        self.fail_kv_loads = fail_kv_loads
        self._info = info
        self.token_delay_s = token_delay_s
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.released: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[dict[str, Any]] = []
        self.loaded_adapters: list[Adapter] = []
        self._stats = EngineStats()
        self.dead = False  # a test sets it: the engine's process "died"
        self.kv_cache_feed: KvCacheFeed | None = None  # a test sets one

    @property
    def info(self) -> EngineInfo:
        return self._info

    async def load_lora(self, adapter: Adapter) -> None:
        self.loaded_adapters.append(adapter)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        cache_salt: str = "",
        image_embeddings: Sequence[Any] = (),
        images: Sequence[Any] = (),
        sequences: Sequence[tuple[int, Sequence[int]]] = (),
        lora: Adapter | None = None,
    ) -> AsyncIterator[EngineStep]:
        self.calls.append(
            {
                "request_id": request_id,
                "sequences": [(index, list(tokens)) for index, tokens in sequences],
                "sampling": sampling,
                "kv": kv_transfer_params,
                "cache_salt": cache_salt,
                "image_embeddings": list(image_embeddings),
                "images": list(images),
                "lora": lora,
            }
        )
        # As vLLM expands each image placeholder: here one token 0 per embedding row, appended.
        # Pixels (PIL images): 4 tokens each, the fake's "vision tower".
        expanded = (
            *prompt_token_ids,
            *(0 for e in image_embeddings for _ in range(len(e))),
            *(0 for _ in images for _ in range(4)),
        )
        self.running.add(request_id)
        external = (
            len(prompt_token_ids) if kv_transfer_params and kv_transfer_params.get("do_remote_prefill") else 0
        )
        self._stats.prompt_tokens_external += external
        self._stats.prompt_tokens_computed += len(prompt_token_ids) - external
        n = sampling.get("n", 1)
        if self.fail_kv_loads and external:
            yield EngineStep(
                sequences=tuple(SequenceDelta(i, (), (), "error", None) for i in range(n)),
                finished=True,
                num_prompt_tokens=len(prompt_token_ids),
                num_cached_tokens=0,
                kv_transfer_params=None,
            )
            self.running.discard(request_id)
            return
        stops = set(sampling.get("stop_token_ids", []))
        try:
            for position in range(sampling["max_tokens"]):
                await asyncio.sleep(self.token_delay_s)
                token = (prompt_token_ids[-1] + 1 + position) % self._info.vocab_size
                stopped = token in stops
                last = position == sampling["max_tokens"] - 1 or stopped
                reason = ("stop" if stopped else "length") if last else None
                logprobs = (TokenLogprob(token, -0.5, 1),) if sampling.get("logprobs") is not None else ()
                deltas = tuple(
                    SequenceDelta(i, (token,), logprobs, reason, token if stopped else None) for i in range(n)
                )
                params = None
                if last and kv_transfer_params and kv_transfer_params.get("do_remote_decode") and not stopped:
                    params = {
                        "remote_engine_id": self._info.engine_id,
                        "remote_host": "127.0.0.1",
                        "remote_port": 5600,
                        "remote_block_ids": [[1, 2]],
                        "remote_request_id": request_id + "-x",
                        "remote_num_tokens": len(prompt_token_ids),
                        "tp_size": 1,
                    }
                yield EngineStep(
                    sequences=deltas,
                    finished=last,
                    num_prompt_tokens=len(prompt_token_ids),
                    num_cached_tokens=external,
                    kv_transfer_params=params,
                    prompt_logprobs=_prompt_logprobs(prompt_token_ids, sampling) if position == 0 else None,
                    prompt_token_ids=expanded if position == 0 and (image_embeddings or images) else None,
                )
                if last:
                    self._stats.requests_finished += 1
                    return
        finally:
            self.running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        self.released.append((request_id, kv_transfer_params))

    def stats(self) -> EngineStats:
        self._stats.num_running = len(self.running)
        return self._stats

    async def shutdown(self) -> None:
        pass


def _prompt_logprobs(
    prompt_token_ids: Sequence[int], sampling: dict[str, Any]
) -> tuple[TokenLogprob | None, ...] | None:
    """As vLLM: none for the first prompt token; each other one at -1.0 * its position."""
    if sampling.get("prompt_logprobs") is None:
        return None
    return (
        None,
        *(
            TokenLogprob(token, -1.0 * position, position)
            for position, token in enumerate(prompt_token_ids[1:], 1)
        ),
    )
