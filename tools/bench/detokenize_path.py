"""CPU per token of the gateway's detokenize path: the tokenizer's DetokenizeStream against the
gateway's in-process detokenizer (docs/benchmarks.md, issue 17).

./bazel run //tools/bench:detokenize_path -- --modes stream,local,local,stream,stream,local

The gateway's serving room, the tokenizer service's streaming detokenizer and decoder (SmolLM2's
tokenizer; libs/tokenization's code, behind the same libs/rpc wrapper services/tokenizer serves
it with) and a fake worker that streams one token per message run in this one process on
loopback; each mode serves the same
requests (a stop string that never matches, so every token goes through the stop matcher) and
reports the process's CPU time per token. The fake worker's sends and the pipeline count in
both modes; the difference is the detokenize path. Every mode must give the same text.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import grpc.aio

from cleave.common.v1 import common_pb2
from cleave.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from cleave.worker.v1 import worker_pb2, worker_pb2_grpc
from libs.config.groups import DEFAULT_CACHE_DIR
from libs.config.roles import Role
from libs.gateway.common.generation import GenerationSpec, SequenceEvent
from libs.gateway.fleet.pool import WorkerPool
from libs.gateway.fleet.routing import create_policy
from libs.gateway.serving.generate import Serving
from libs.gateway.serving.local_detokenize import load_decoder
from libs.models.resolve import resolve_model
from libs.rpc.channel import open_channel
from libs.rpc.methods import rpc_stream
from libs.rpc.server import GrpcServer, ServerConfig, ServiceBinding
from libs.tokenization import Tokenizer, TokenizerConfig
from libs.tokenization.detokenize_stream import detokenize_stream
from libs.tokenization.service_info import decoder_spec

TEXT = "The quick brown fox jumps over the lazy dog, again and again. " * 20


class _Tokenizer(tokenizer_pb2_grpc.TokenizerServicer):
    """The two calls of the tokenizer service the detokenize path makes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    @rpc_stream(service="tokenizer")
    def DetokenizeStream(
        self,
        request_iterator: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[tokenizer_pb2.DetokenizeStreamResponse, None]:
        return detokenize_stream(self._tokenizer, request_iterator, service="tokenizer")

    async def GetDecoder(
        self, request: tokenizer_pb2.GetDecoderRequest, context: grpc.aio.ServicerContext
    ) -> tokenizer_pb2.DecoderSpec:
        return decoder_spec(self._tokenizer)


class _Worker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, tokens: Sequence[int]) -> None:
        self._tokens = tokens

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        for i, token in enumerate(self._tokens):
            last = i == len(self._tokens) - 1
            finish = common_pb2.FINISH_REASON_LENGTH if last else common_pb2.FINISH_REASON_UNSPECIFIED
            yield worker_pb2.GenerateResponse(
                chunk=worker_pb2.TokenChunk(token_ids=[token], finish_reason=finish)
            )
        usage = common_pb2.Usage(prompt_tokens=5, completion_tokens=len(self._tokens))
        yield worker_pb2.GenerateResponse(complete=worker_pb2.GenerateComplete(usage=usage))

    async def GetStats(
        self, request: worker_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        return worker_pb2.WorkerStats()

    async def GetInfo(
        self, request: worker_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model="m", vocab_size=49152, max_model_len=2048, max_num_seqs=8)


async def measure(mode: str, tokenizer: Tokenizer, requests: int, concurrency: int, tokens: int) -> str:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)[:tokens]
    servers = []

    async def serve(service: ServiceBinding) -> str:
        server = GrpcServer(ServerConfig(), [service])
        await server.start()
        servers.append(server)
        return server.address

    tokenizer_service = ServiceBinding(
        "cleave.tokenizer.v1.Tokenizer",
        _Tokenizer(tokenizer),
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server,
    )
    tokenizer_address = await serve(tokenizer_service)
    worker = ServiceBinding(
        "cleave.worker.v1.Worker", _Worker(ids), worker_pb2_grpc.add_WorkerServicer_to_server
    )
    pool = WorkerPool({Role.BOTH: [await serve(worker)]})
    await pool.start()
    stub = tokenizer_pb2_grpc.TokenizerStub(open_channel(tokenizer_address))
    decoder = await load_decoder(stub) if mode == "local" else None
    policy = create_policy("round_robin")
    pipeline = Serving(pool, stub, policy, policy, decoder=decoder)
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with limit:
            sampling = common_pb2.SamplingParams(max_tokens=tokens + 1)
            spec = GenerationSpec(f"r{i}", "m", ids[:5], sampling, ["no such stop"])
            return "".join([e.text async for e in pipeline.generate(spec) if isinstance(e, SequenceEvent)])

    await one(-1)  # warm-up
    cpu, wall = time.process_time(), time.perf_counter()
    texts = await asyncio.gather(*(one(i) for i in range(requests)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    n = requests * len(ids)
    print(f"{mode}: {n} tokens, {cpu / n * 1e6:.1f} us CPU per token, {wall:.1f} s", flush=True)
    await pool.close()
    for server in servers:
        await server.stop()
    if len(set(texts)) != 1:
        raise RuntimeError(f"{mode}: requests gave different texts")
    return texts[0]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="detokenize_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="stream,local,local,stream,stream,local")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="per request")
    args = parser.parse_args(argv)
    model = resolve_model("smollm2", DEFAULT_CACHE_DIR / "models", progress=False)
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=model.path))
    texts = {
        asyncio.run(measure(mode, tokenizer, args.requests, args.concurrency, args.tokens))
        for mode in args.modes.split(",")
    }
    if len(texts) != 1:
        print("detokenize_path: the modes gave different texts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
