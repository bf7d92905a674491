"""One stream of several prompts' generations, as vLLM's completions stream a prompt list.

vLLM runs every prompt of a streamed `/v1/completions` request at once and interleaves their
chunks in one SSE stream, choice index = prompt number x n + sequence index, with the usage
summed at the end. `merged` gives the pipeline's own signature (spec -> events) so the stream
is built by the one SSE writer (streaming.py). The first failure ends the whole stream; a
client that leaves cancels every prompt's generation (the finally below).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from libs.gateway.api.responses import Generate
from libs.gateway.common.generation import Finished, GenerationSpec, SequenceEvent

_DONE = object()


def choice_prompt_tokens(specs: Sequence[GenerationSpec]) -> tuple[int, ...]:
    """Each choice's prompt length, by the stream's choice index (prompt x n + index)."""
    return tuple(len(spec.prompt_token_ids) for spec in specs for _ in range(spec.sampling.n or 1))


def merged(generate: Generate, specs: Sequence[GenerationSpec]) -> Generate:
    """A generate function that ignores its spec and streams all of `specs` together."""

    async def run(_spec: GenerationSpec) -> AsyncIterator[SequenceEvent | Finished]:
        queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

        async def pump(offset: int, spec: GenerationSpec) -> None:
            try:
                async for event in generate(spec):
                    await queue.put((offset, event))
                await queue.put((offset, _DONE))
            except Exception as error:  # handed to the consumer, which raises it
                await queue.put((offset, error))

        tasks = [
            asyncio.create_task(pump(number * (spec.sampling.n or 1), spec))
            for number, spec in enumerate(specs)
        ]
        ends: list[Finished] = []
        try:
            running = len(tasks)
            while running:
                offset, item = await queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                elif isinstance(item, Finished):
                    ends.append(item)
                elif isinstance(item, SequenceEvent):
                    yield dataclasses.replace(item, index=offset + item.index)
            yield Finished(
                prompt_tokens=sum(end.prompt_tokens for end in ends),
                completion_tokens=sum(end.completion_tokens for end in ends),
                cached_prompt_tokens=sum(end.cached_prompt_tokens for end in ends),
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return run
