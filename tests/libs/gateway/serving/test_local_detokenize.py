"""The gateway's in-process detokenizer: the tokenizer service's stream answers, without it."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.gateway.common import errors
from libs.gateway.serving.local_detokenize import LocalSequenceDetokenizer, load_decoder
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.tokenization.decoder import BackendDecoder

pytestmark = pytest.mark.anyio
TEXT = "Hello world, streaming text stops here. Grüße 東京"


@pytest.fixture(scope="module")
def rust() -> RustTokenizer:
    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT] * 3, trainer=trainer)
    return tokenizer


@pytest.fixture
def decoder(rust: RustTokenizer) -> BackendDecoder:
    return BackendDecoder.from_json(rust.to_str(), rust.get_vocab_size())


def detokenizer(decoder: BackendDecoder, stops: list[str]) -> LocalSequenceDetokenizer:
    return LocalSequenceDetokenizer(decoder, request_id="r", prompt_tail=[], stops=stops)


async def test_deltas_join_to_the_text_and_a_stop_string_ends_it(
    rust: RustTokenizer, decoder: BackendDecoder
) -> None:
    ids = rust.encode(TEXT).ids
    plain = detokenizer(decoder, [])
    texts = [(await plain.feed([t])).text for t in ids]
    texts.append((await plain.finish()).text)
    assert "".join(texts) == TEXT and plain.done

    stopping = detokenizer(decoder, ["stops"])
    shown, last = [], None
    for token in ids:
        last = await stopping.feed([token])
        shown.append(last.text)
        if last.complete:
            break
    assert last is not None and last.stopped and last.matched_stop == "stops"
    assert "".join(shown) == "Hello world, streaming text " and stopping.done


async def test_the_clients_bad_stop_string_is_a_400_at_the_first_token(decoder: BackendDecoder) -> None:
    refused = detokenizer(decoder, [""])
    with pytest.raises(errors.ApiError) as raised:
        await refused.feed([1])
    assert raised.value.status == 400 and refused.done


async def test_an_engine_token_outside_the_vocabulary_is_a_tokenizer_error(decoder: BackendDecoder) -> None:
    with pytest.raises(errors.ApiError) as raised:
        await detokenizer(decoder, []).feed([decoder.vocab_size])
    assert raised.value.status == 500 and raised.value.code == "tokenizer_error"


async def test_a_tokenizer_service_without_get_decoder_keeps_the_stream() -> None:
    server = GrpcServer(ServerConfig(), [])  # answers UNIMPLEMENTED to every tokenizer call
    await server.start()
    channel = open_channel(server.address)
    try:
        assert await load_decoder(tokenizer_pb2_grpc.TokenizerStub(channel), timeout_s=10) is None
    finally:
        await channel.close()
        await server.stop()
