"""The unary RPCs over real loopback gRPC with the real SmolLM2 tokenizer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from transformers import BatchEncoding, PreTrainedTokenizerBase

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.tokenization import Tokenizer
from services.tokenizer.servicer import INTERNAL_MESSAGE, TokenizerServicer, binding

pytestmark = pytest.mark.anyio

Stub = tokenizer_pb2_grpc.TokenizerStub

CONVERSATIONS = {
    "user_only": [("user", "What is the capital of France?")],
    "system_and_user": [("system", "You answer in one word."), ("user", "Capital of France?")],
    "multi_turn": [
        ("system", "Be brief."),
        ("user", "Hi! 👋"),
        ("assistant", "Hello. 你好"),
        ("user", "Count to three,\nplease."),
    ],
}


def chat(messages: list[tuple[str, str]]) -> list[pb.ChatMessage]:
    return [pb.ChatMessage(role=role, content=[pb.ContentPart(text=text)]) for role, text in messages]


async def render(stub: Stub, messages: list[pb.ChatMessage], **kwargs: Any) -> pb.RenderChatResponse:
    return await stub.RenderChat(pb.RenderChatRequest(messages=messages, **kwargs))


async def expect_invalid(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    assert "Traceback" not in details
    return details


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
async def test_render_chat_equals_transformers(
    stub: Stub, hf_reference: PreTrainedTokenizerBase, name: str, add_generation_prompt: bool
) -> None:
    messages = CONVERSATIONS[name]
    conversation = [{"role": role, "content": text} for role, text in messages]
    expected = hf_reference.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    response = await render(stub, chat(messages), add_generation_prompt=add_generation_prompt)
    assert response.prompt == expected
    # What vLLM's chat path feeds the engine: the rendered text without special tokens added.
    assert list(response.token_ids) == hf_reference.encode(expected, add_special_tokens=False)
    tokenized = hf_reference.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    assert isinstance(tokenized, BatchEncoding)  # return_dict=True; also narrows the type
    assert list(response.token_ids) == list(tokenized["input_ids"])
    assert response.num_images == 0


async def test_render_chat_starts_with_one_im_start(
    stub: Stub, hf_reference: PreTrainedTokenizerBase
) -> None:
    response = await render(stub, chat(CONVERSATIONS["user_only"]), add_generation_prompt=True)
    im_start = hf_reference.convert_tokens_to_ids("<|im_start|>")
    assert response.token_ids[0] == im_start and response.token_ids[1] != im_start
    assert response.prompt.endswith("<|im_start|>assistant\n")


async def test_render_chat_joins_text_parts_with_newlines(stub: Stub) -> None:
    parts = [pb.ContentPart(text="first"), pb.ContentPart(text="second")]
    joined = await render(stub, [pb.ChatMessage(role="user", content=parts)])
    single = await render(stub, chat([("user", "first\nsecond")]))
    assert joined.prompt == single.prompt and list(joined.token_ids) == list(single.token_ids)


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "at least one message"),
        # SmolLM2's template is text-only: image parts are a clear refusal, not a crash.
        ([pb.ChatMessage(role="user", content=[pb.ContentPart(image=b"")])], "cannot render image parts"),
        ([pb.ChatMessage(role="user", content=[pb.ContentPart()])], "messages[0].content[0] is empty"),
        (chat([("", "beep")]), "has no role"),
    ],
)
async def test_render_chat_rejects_bad_messages(
    stub: Stub, messages: list[pb.ChatMessage], needle: str
) -> None:
    details = await expect_invalid(render(stub, messages))
    assert needle in details


async def test_render_chat_continues_the_final_message(stub: Stub) -> None:
    messages = chat([("user", "Hi"), ("assistant", "Hel")])
    response = await render(stub, messages, continue_final_message=True)
    # vLLM's continue_final_message: the assistant turn stays open, ending in its text.
    assert response.prompt.endswith("<|im_start|>assistant\nHel")
    details = await expect_invalid(
        render(stub, messages, continue_final_message=True, add_generation_prompt=True)
    )
    assert "continue_final_message" in details


async def test_render_chat_custom_roles_extra_fields_and_template_kwargs(stub: Stub) -> None:
    # vLLM's chat utils pass any role and any message field to the template; ChatML renders
    # the role as written.
    custom = await render(stub, chat([("user", "Hi"), ("tool_result", "42")]))
    assert "<|im_start|>tool_result\n42<|im_end|>" in custom.prompt
    extra = pb.ChatMessage(role="user", content=[pb.ContentPart(text="Hi")], extra_json='{"name": "ann"}')
    assert (await render(stub, [extra])).prompt == (await render(stub, chat([("user", "Hi")]))).prompt
    kwargs = await render(stub, chat([("user", "Hi")]), chat_template_kwargs_json='{"some_flag": true}')
    assert kwargs.prompt == (await render(stub, chat([("user", "Hi")]))).prompt
    bad = await expect_invalid(
        render(stub, chat([("user", "Hi")]), chat_template_kwargs_json='{"tokenize": true}')
    )
    assert "tokenize" in bad
    special = await render(stub, chat([("user", "Hi")]), add_special_tokens=True)
    assert len(special.token_ids) >= len((await render(stub, chat([("user", "Hi")]))).token_ids)


@pytest.mark.parametrize("text", ["Hello world", "Emoji 😀 and 你好世界, tabs\tand\nnewlines", ""])
@pytest.mark.parametrize("add_special_tokens", [True, False])
async def test_tokenize_detokenize_round_trip(
    stub: Stub, hf_reference: PreTrainedTokenizerBase, text: str, add_special_tokens: bool
) -> None:
    request = pb.TokenizeRequest(text=text, add_special_tokens=add_special_tokens, return_token_strs=True)
    tokens = await stub.Tokenize(request)
    assert list(tokens.token_ids) == hf_reference.encode(text, add_special_tokens=add_special_tokens)
    assert len(tokens.token_strs) == len(tokens.token_ids)
    detok = await stub.Detokenize(pb.DetokenizeRequest(token_ids=tokens.token_ids))
    assert detok.text == text


async def test_token_strs_are_each_tokens_text(stub: Stub) -> None:
    tokens = await stub.Tokenize(pb.TokenizeRequest(text="The quick brown fox", return_token_strs=True))
    assert list(tokens.token_strs) == ["The", " quick", " brown", " fox"]
    plain = await stub.Tokenize(pb.TokenizeRequest(text="The quick brown fox"))
    assert list(plain.token_strs) == []


async def test_detokenize_skip_special_tokens(stub: Stub) -> None:
    rendered = await render(stub, chat([("user", "Hi")]))
    with_special = await stub.Detokenize(pb.DetokenizeRequest(token_ids=rendered.token_ids))
    without = await stub.Detokenize(
        pb.DetokenizeRequest(token_ids=rendered.token_ids, skip_special_tokens=True)
    )
    assert with_special.text == rendered.prompt
    assert "<|im_start|>" not in without.text and "Hi" in without.text


@pytest.mark.parametrize("bad_id", [-1, 49152, 2**31 - 1])
async def test_detokenize_rejects_ids_outside_the_vocabulary(stub: Stub, bad_id: int) -> None:
    details = await expect_invalid(stub.Detokenize(pb.DetokenizeRequest(token_ids=[42, bad_id])))
    assert f"token_ids[1] = {bad_id}" in details and "0..49151" in details


async def test_get_info(stub: Stub, hf_reference: PreTrainedTokenizerBase) -> None:
    info = await stub.GetInfo(pb.GetInfoRequest())
    assert info.model == "smollm2"
    assert info.vocab_size == len(hf_reference) == 49152
    assert list(info.eos_token_ids) == [hf_reference.eos_token_id]
    assert info.HasField("bos_token_id") and info.bos_token_id == hf_reference.bos_token_id
    assert info.max_model_len == 2048  # conftest's MAX_MODEL_LEN
    assert info.has_chat_template


async def test_request_metadata_is_accepted(stub: Stub) -> None:
    metadata = common_pb2.RequestMetadata(request_id="req-1", model="smollm2")
    tokens = await stub.Tokenize(pb.TokenizeRequest(metadata=metadata, text="Hi"))
    assert list(tokens.token_ids)


@asynccontextmanager
async def serving(servicer: TokenizerServicer) -> AsyncIterator[Stub]:
    server = GrpcServer(ServerConfig(shutdown_grace_s=1.0), [binding(servicer)])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            yield tokenizer_pb2_grpc.TokenizerStub(channel)
    finally:
        await server.stop()


async def test_render_chat_without_a_template_is_failed_precondition(
    hf_reference: PreTrainedTokenizerBase,
) -> None:
    base = Tokenizer(hf_reference, eos_token_ids=[2], chat_template=None, source="test")
    async with serving(TokenizerServicer(base, model="base", max_model_len=2048)) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await render(stub, chat([("user", "Hi")]))
        info = await stub.GetInfo(pb.GetInfoRequest())
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no chat template" in (raised.value.details() or "")
    assert not info.has_chat_template


async def test_unexpected_errors_reach_the_client_without_details(
    smollm2: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> list[int]:
        raise RuntimeError("secret internals")

    # On the class: each of the service's threads works with its own copy of the tokenizer.
    monkeypatch.setattr(Tokenizer, "encode", broken)
    async with serving(TokenizerServicer(smollm2, model="smollm2", max_model_len=2048)) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Tokenize(pb.TokenizeRequest(text="Hi"))
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == INTERNAL_MESSAGE


async def test_a_long_tokenization_does_not_stall_a_detokenize_stream(
    smollm2: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "long" prompt whose encoding lasts until the test releases it: the stream must be
    # served meanwhile (on the event loop the service would hang here until the timeout).
    long_started, release = threading.Event(), threading.Event()
    encode = Tokenizer.encode

    def slow_encode(self: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
        if text == "long":
            long_started.set()
            release.wait(timeout=30)
        return encode(self, text, add_special_tokens)

    monkeypatch.setattr(Tokenizer, "encode", slow_encode)
    servicer = TokenizerServicer(smollm2, model="smollm2", max_model_len=2048, max_concurrent_tokenizations=2)
    async with serving(servicer) as stub:
        long_call = asyncio.ensure_future(stub.Tokenize(pb.TokenizeRequest(text="long")))
        assert await asyncio.to_thread(long_started.wait, 30)

        async def requests() -> AsyncIterator[pb.DetokenizeStreamRequest]:
            yield pb.DetokenizeStreamRequest(start=pb.DetokenizeStart())
            yield pb.DetokenizeStreamRequest(tokens=pb.TokenBatch(token_ids=encode(smollm2, "Hi there")))
            yield pb.DetokenizeStreamRequest(finish=True)

        replies = [reply async for reply in stub.DetokenizeStream(requests())]
        streamed_while_tokenizing = not release.is_set() and not long_call.done()
        release.set()
        assert list((await long_call).token_ids) == encode(smollm2, "long")
    servicer.close()
    assert streamed_while_tokenizing
    assert "".join(r.delta.text for r in replies) + replies[-1].complete.text == "Hi there"
