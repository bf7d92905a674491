"""Entry point of the Cleave tokenizer service.

./bazel run //services/tokenizer -- --model smollm2 --port 50050
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from libs.models.errors import ModelConversionError
from libs.models.resolve import resolve_model
from libs.models.spec import fitted_context_length
from libs.observability.logging import configure_logging
from libs.rpc.security import RpcSecurity, load_security
from libs.rpc.server import GrpcServer, ServerConfig, serve_until_signal
from libs.tokenization import Tokenizer
from libs.tokenization import TokenizerConfig as TokenizerFiles
from libs.tokenization.chat_template import load_chat_template
from libs.tokenization.server_config import TokenizerServerConfig, parse_args
from libs.tokenization.tools import ToolCallParser
from services.tokenizer.servicer import TokenizerServicer, binding

log = structlog.get_logger("cleave.tokenizer")


def load_servicer(process: TokenizerServerConfig) -> TokenizerServicer:
    """Everything that can fail on a bad --model, done before any port is bound (a tokenizer
    loads in seconds; only a first GGUF conversion takes longer)."""
    resolved = resolve_model(
        process.model, process.model_cache_dir, progress=True, allow_download=process.allow_model_download
    )
    tokenizer = Tokenizer.from_config(
        TokenizerFiles(path=resolved.path, chat_template=load_chat_template(process.chat_template))
    )
    return TokenizerServicer(
        tokenizer,
        model=process.served_model_name or resolved.served_name,
        # As the workers do: the model's own length unless a shorter one is asked for; 0 =
        # unknown (the gateway checks lengths against the workers' value, not this one).
        max_model_len=fitted_context_length(process.max_model_len, resolved.path) or 0,
        max_concurrent_tokenizations=process.max_concurrent_tokenizations,
        tool_parser=_tool_parser(process.tool_call_parser),
    )


def _tool_parser(name: str | None) -> ToolCallParser | None:
    if name is None:
        return None
    # vLLM is imported only for a parser (seconds); an unknown name is a ValueError (exit 2).
    from libs.tokenization.vllm_tool_parsing import VllmToolCallParser

    return VllmToolCallParser(name)


async def run(process: TokenizerServerConfig, servicer: TokenizerServicer, security: RpcSecurity) -> None:
    server_config = ServerConfig.of(process, security, replicated=True)
    server = GrpcServer(server_config, [binding(servicer)])
    await serve_until_signal(server)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        process = parse_args(argv)
        configure_logging(level=process.effective_log_level, json=process.log_json, service="tokenizer")
        security = load_security(process, os.environ)  # --grpc-*: TLS files, the token
        servicer = load_servicer(process)
    # ConfigError, ModelNotFoundError and tokenizer load failures are all ValueErrors;
    # FileNotFoundError: a resolved folder without tokenizer files.
    except (ValueError, FileNotFoundError, ModelConversionError) as error:
        # One line, even when a library's message spans several.
        print(f"cleave tokenizer: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    asyncio.run(run(process, servicer, security))
    return 0


if __name__ == "__main__":
    sys.exit(main())
