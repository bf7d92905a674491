"""Fuzzing the tokenizer service over loopback gRPC with the real SmolLM2 tokenizer:
arbitrary messages (any field set or not, any value of its wire type, unknown enum numbers,
ids outside the vocabulary, empty and long lists) never end as UNKNOWN or INTERNAL, which
would mean an exception escaped as a bug of ours; a bad request is INVALID_ARGUMENT (or
FAILED_PRECONDITION), a stream's in-band error never says INTERNAL, and the service still
answers afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2 as pb
from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.tokenization import Tokenizer
from services.tokenizer.servicer import TokenizerServicer, binding
from tests.fuzz.calls import Caller
from tests.fuzz.events import outcome
from tests.fuzz.protos import messages, mostly
from tests.fuzz.servers import background_server

VOCAB = 49152  # SmolLM2's; ids at and past it are out of range on purpose
# A bad request may be refused only with these: the caller's fault, never ours.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}
TIMEOUT_S = 30
CALLER = Caller(REFUSALS, TIMEOUT_S)
call = CALLER.unary
check_refusal = CALLER.refused

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis/ folder written into the checkout
    derandomize=True,  # the same examples every run: a CI failure reproduces locally
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

token_ids = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB, 2**31 - 1, -(2**31)]))
token_lists = st.one_of(st.lists(st.integers(0, VOCAB - 1), max_size=40), st.lists(token_ids, max_size=40))
valid_roles = st.sampled_from(["system", "user", "assistant"])
# Mostly valid, so that most conversations get past the role check to the template.
roles = mostly(valid_roles, st.one_of(st.sampled_from(["tool", "developer", ""]), st.text(max_size=8)))
text_parts = st.builds(lambda text: pb.ContentPart(text=text), st.text(max_size=40))
OVERRIDES = {
    "cleave.tokenizer.v1.ChatMessage.role": roles,
    # Mostly text (what the gateway sends), sometimes empty or image parts.
    "cleave.tokenizer.v1.ChatMessage.content": st.lists(
        mostly(text_parts, messages(pb.ContentPart)), max_size=3
    ),
    "cleave.tokenizer.v1.RenderChatRequest.continue_final_message": st.sampled_from(
        [False, False, False, True]
    ),
    "cleave.tokenizer.v1.DetokenizeRequest.token_ids": token_lists,
    "cleave.tokenizer.v1.DetokenizeStart.prompt_tail_token_ids": token_lists,
    "cleave.tokenizer.v1.TokenBatch.token_ids": token_lists,
    "cleave.tokenizer.v1.DetokenizeStart.stop": st.lists(st.text(max_size=6), max_size=5),
}


@pytest.fixture(scope="module")
def stub(smollm2: Tokenizer) -> Iterator[tokenizer_pb2_grpc.TokenizerStub]:
    servicer = TokenizerServicer(smollm2, model="smollm2", max_model_len=2048)
    with background_server(lambda: [binding(servicer)]) as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)


def still_serving(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    assert stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT_S).vocab_size == VOCAB
    assert list(stub.Detokenize(pb.DetokenizeRequest(token_ids=[28]), timeout=TIMEOUT_S).text)


@FUZZ
@given(request=messages(pb.RenderChatRequest, OVERRIDES))
def test_render_chat(stub: tokenizer_pb2_grpc.TokenizerStub, request: pb.RenderChatRequest) -> None:
    response = call(stub.RenderChat, request)
    if response is not None:
        assert len(response.token_ids) > 0 or not request.messages
    still_serving(stub)


@FUZZ
@given(request=messages(pb.TokenizeRequest, OVERRIDES))
def test_tokenize(stub: tokenizer_pb2_grpc.TokenizerStub, request: pb.TokenizeRequest) -> None:
    response = call(stub.Tokenize, request)
    assert response is not None, "any text tokenizes"
    if request.return_token_strs:
        assert len(response.token_strs) == len(response.token_ids)


@FUZZ
@given(request=messages(pb.DetokenizeRequest, OVERRIDES))
def test_detokenize(stub: tokenizer_pb2_grpc.TokenizerStub, request: pb.DetokenizeRequest) -> None:
    response = call(stub.Detokenize, request)
    in_vocabulary = all(0 <= t < VOCAB for t in request.token_ids)
    assert (response is not None) == in_vocabulary, request.token_ids


stream_messages = st.lists(messages(pb.DetokenizeStreamRequest, OVERRIDES), max_size=8)


@FUZZ
@given(first=messages(pb.DetokenizeStart, OVERRIDES), rest=stream_messages, start_first=st.booleans())
def test_detokenize_stream(
    stub: tokenizer_pb2_grpc.TokenizerStub,
    first: pb.DetokenizeStart,
    rest: list[pb.DetokenizeStreamRequest],
    start_first: bool,
) -> None:
    sent = ([pb.DetokenizeStreamRequest(start=first)] if start_first else []) + rest
    try:
        responses = list(stub.DetokenizeStream(iter(sent), timeout=TIMEOUT_S))
    except grpc.RpcError as error:
        # Refused as a whole only for a bad opening, before any response.
        check_refusal(error, sent)
        return
    kinds = [r.WhichOneof("kind") for r in responses]
    outcome(f"streamed, ended with {kinds[-1] if kinds else 'nothing'}")
    assert kinds, "a started stream answers at least once (the implicit finish)"
    assert all(k == "delta" for k in kinds[:-1]), kinds
    assert kinds[-1] in ("delta", "complete", "error"), kinds
    if kinds[-1] == "error":
        assert responses[-1].error.code != common_pb2.ERROR_CODE_INTERNAL, responses[-1].error
    still_serving(stub)


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_huge_inputs_are_answered_or_refused(stub: tokenizer_pb2_grpc.TokenizerStub, size: int) -> None:
    # Below the 4 MiB-plus message limit: big, but legal on the wire.
    ids = [t % VOCAB for t in range(size // 4)]
    assert call(stub.Detokenize, pb.DetokenizeRequest(token_ids=ids)) is not None
    assert call(stub.Tokenize, pb.TokenizeRequest(text="fox " * (size // 4))) is not None
    message = pb.ChatMessage(role="user", content=[pb.ContentPart(text="a" * size)])
    call(stub.RenderChat, pb.RenderChatRequest(messages=[message]))
    still_serving(stub)
