"""DetokenizeStream over real loopback gRPC with the real SmolLM2 tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from transformers import PreTrainedTokenizerBase

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc

pytestmark = pytest.mark.anyio

Stub = tokenizer_pb2_grpc.TokenizerStub
Request = pb.DetokenizeStreamRequest
Response = pb.DetokenizeStreamResponse

# Emoji and CJK are several byte-level tokens each, so batch borders fall inside characters.
MULTIBYTE = "Hi 😀 你好世界 🎉 done. Ünïcödé ✓"
ANSWER = "The answer is 42.\nSTOP here and more text after it"


def start(**kwargs: Any) -> Request:
    return Request(start=pb.DetokenizeStart(**kwargs))


def tokens(ids: Sequence[int]) -> Request:
    return Request(tokens=pb.TokenBatch(token_ids=ids))


def batches(ids: Sequence[int], size: int) -> list[Request]:
    return [tokens(ids[i : i + size]) for i in range(0, len(ids), size)]


async def run_stream(
    stub: Stub, requests: Sequence[Request], metadata: tuple[tuple[str, str], ...] = ()
) -> tuple[list[Response], grpc.StatusCode]:
    """Sends `requests` in lockstep, as the gateway does: each message after `start` waits for
    its answer, and nothing more is sent once the stream has ended.

    Writing after the server has ended the call races in grpcio's asyncio client: a write that
    fails then overwrites the server's status with INTERNAL (grpc/grpc#36066), which made this
    suite flaky when it sent input after a stop string.
    """
    answers: asyncio.Queue[bool] = asyncio.Queue()  # per response: does the stream go on?

    async def send() -> AsyncIterator[Request]:
        for index, request in enumerate(requests):
            yield request
            if index == 0 and request.WhichOneof("kind") == "start":
                continue  # a good `start` has no answer of its own
            if not await answers.get():
                await call.code()  # the call is over: half-closing now sends nothing
                return

    call = stub.DetokenizeStream(send(), metadata=metadata)
    responses: list[Response] = []
    try:
        async for response in call:
            responses.append(response)
            answers.put_nowait(response.WhichOneof("kind") == "delta")
    except grpc.aio.AioRpcError:
        pass  # the status is returned; callers check it
    finally:
        answers.put_nowait(False)
    return responses, await call.code()


def kinds(responses: Sequence[Response]) -> list[str]:
    return [str(r.WhichOneof("kind")) for r in responses]


def deltas(responses: Sequence[Response]) -> list[pb.TextDelta]:
    return [r.delta for r in responses if r.WhichOneof("kind") == "delta"]


def complete(responses: Sequence[Response]) -> pb.DetokenizeComplete:
    """The stream's last message, which must be its only `complete`."""
    assert kinds(responses).count("complete") == 1 and kinds(responses)[-1] == "complete"
    return responses[-1].complete


def text_of(responses: Sequence[Response]) -> str:
    """All text of a stream: its deltas, then what `complete` carries."""
    return "".join(d.text for d in deltas(responses)) + complete(responses).text


def encode(hf: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
async def test_multibyte_split_across_batches_equals_full_decode(
    stub: Stub, hf_reference: PreTrainedTokenizerBase, size: int
) -> None:
    ids = encode(hf_reference, MULTIBYTE)
    requests = [start(), *batches(ids, size), Request(finish=True)]
    responses, code = await run_stream(stub, requests)
    assert code == grpc.StatusCode.OK
    # Exactly one response per message after `start`: a delta per batch, `complete` for finish.
    assert kinds(responses) == ["delta"] * (len(requests) - 2) + ["complete"]
    assert text_of(responses) == hf_reference.decode(ids) == MULTIBYTE
    assert all("\ufffd" not in d.text for d in deltas(responses))
    counts = [d.num_tokens for d in deltas(responses)]
    assert counts == [min(len(ids), size * (i + 1)) for i in range(len(counts))]
    assert not complete(responses).stopped and complete(responses).num_tokens == len(ids)


async def test_prompt_tail_gives_the_decode_of_the_whole_sequence(
    stub: Stub, hf_reference: PreTrainedTokenizerBase
) -> None:
    tail = encode(hf_reference, "<|im_start|>assistant\n")
    generated = encode(hf_reference, " Hello there")
    responses, _ = await run_stream(
        stub, [start(prompt_tail_token_ids=tail), tokens(generated), Request(finish=True)]
    )
    full = hf_reference.decode(tail + generated)
    assert text_of(responses) == full[len(hf_reference.decode(tail)) :] == " Hello there"
    assert complete(responses).num_tokens == len(generated)  # the tail is not counted


@pytest.mark.parametrize("split", [4, 5, 6])  # inside "is 42." (tokens 2..6)
@pytest.mark.parametrize("include_stop", [False, True])
async def test_stop_string_spanning_two_batches_ends_the_stream(
    stub: Stub, hf_reference: PreTrainedTokenizerBase, split: int, include_stop: bool
) -> None:
    ids = encode(hf_reference, ANSWER)
    stop = "is 42."
    requests = [
        start(stop=["never", stop], include_stop_str_in_output=include_stop),
        tokens(ids[:split]),
        tokens(ids[split:]),
        Request(finish=True),  # never sent: the stream has ended
    ]
    responses, code = await run_stream(stub, requests)
    assert code == grpc.StatusCode.OK
    # The first batch's delta holds back "is " (it might start the stop); the second batch
    # is answered by `complete`, which carries the text up to the stop, and the stream ends.
    assert kinds(responses) == ["delta", "complete"]
    assert deltas(responses)[0].text == "The answer "
    assert text_of(responses) == ("The answer is 42." if include_stop else "The answer ")
    done = complete(responses)
    assert done.stopped and done.matched_stop == stop
    # Stopped at the token that completed the stop ('.', the 7th): later ones are not counted.
    assert done.num_tokens == 7


async def test_partial_stop_is_held_then_released_at_finish(
    stub: Stub, hf_reference: PreTrainedTokenizerBase
) -> None:
    ids = encode(hf_reference, "Paris is nice. END")
    responses, _ = await run_stream(stub, [start(stop=[" ENDING"]), *batches(ids, 1), Request(finish=True)])
    # " END" could still become " ENDING", so only `finish` releases it.
    assert "".join(d.text for d in deltas(responses)) == "Paris is nice."
    done = complete(responses)
    assert (done.text, done.stopped, done.num_tokens) == (" END", False, len(ids))


async def test_half_close_without_finish_flushes_and_completes(
    stub: Stub, hf_reference: PreTrainedTokenizerBase
) -> None:
    ids = encode(hf_reference, "Ends mid word ST")
    responses, code = await run_stream(stub, [start(stop=["STOP"]), tokens(ids)])
    assert code == grpc.StatusCode.OK
    assert kinds(responses) == ["delta", "complete"]
    assert text_of(responses) == "Ends mid word ST"
    assert complete(responses).text == "ST" and not complete(responses).stopped


async def test_skip_special_tokens_drops_eos(stub: Stub, hf_reference: PreTrainedTokenizerBase) -> None:
    ids = [*encode(hf_reference, "Bye."), hf_reference.eos_token_id]
    kept, _ = await run_stream(stub, [start(), tokens(ids), Request(finish=True)])
    skipped, _ = await run_stream(stub, [start(skip_special_tokens=True), tokens(ids), Request(finish=True)])
    assert text_of(kept) == "Bye.<|im_end|>"
    assert text_of(skipped) == "Bye."
    assert deltas(skipped)[-1].num_tokens == complete(skipped).num_tokens == len(ids)


@pytest.mark.parametrize(
    "requests", [[], [tokens([1, 2])], [Request(finish=True)]], ids=["empty", "tokens", "finish"]
)
async def test_missing_start_is_invalid_argument(stub: Stub, requests: list[Request]) -> None:
    responses, code = await run_stream(stub, requests)
    assert responses == [] and code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("first", "needle"),
    [
        (start(stop=[""]), "start.stop"),
        (start(prompt_tail_token_ids=[5, 99999]), "start.prompt_tail_token_ids[1] = 99999"),
    ],
)
async def test_bad_start_is_invalid_argument(stub: Stub, first: Request, needle: str) -> None:
    call = stub.DetokenizeStream(iter([first]))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in call:
            pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (raised.value.details() or "")


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (tokens([5, 49152]), "tokens.token_ids[1] = 49152"),
        (tokens([-3]), "tokens.token_ids[0] = -3"),
        (start(), "got start"),
        (Request(), "got an empty message"),
    ],
)
async def test_bad_message_mid_stream_ends_with_an_error(
    stub: Stub, hf_reference: PreTrainedTokenizerBase, bad: Request, needle: str
) -> None:
    ids = encode(hf_reference, "Fine so far")
    responses, code = await run_stream(stub, [start(), tokens(ids), bad, tokens(ids), Request(finish=True)])
    assert code == grpc.StatusCode.OK
    assert deltas(responses)[0].text == "Fine so far"
    last = responses[-1]
    assert last.WhichOneof("kind") == "error"
    assert last.error.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT
    assert needle in last.error.message and "Traceback" not in last.error.message
    assert kinds(responses) == ["delta", "error"]


@pytest.mark.parametrize(
    ("metadata", "first", "expected"),
    [
        ((("x-request-id", "from-header"),), start(), "from-header"),
        ((), start(metadata=common_pb2.RequestMetadata(request_id="from-message")), "from-message"),
    ],
)
async def test_request_id_reaches_the_stream_log(
    stub: Stub, metadata: tuple[tuple[str, str], ...], first: Request, expected: str
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        await run_stream(stub, [first, tokens([42]), Request(finish=True)], metadata)
    done = [entry for entry in logs if entry["event"] == "detokenize stream done"]
    assert [entry.get("request_id") for entry in done] == [expected]
