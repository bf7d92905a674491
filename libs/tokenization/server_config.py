"""The tokenizer service's configuration (the only place its flags are declared)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.config.codecs import NON_NEGATIVE_INT
from libs.config.flags import flag, parse
from libs.config.groups import (
    ChatTemplateFlags,
    GrpcSecurityFlags,
    GrpcServingFlags,
    LoggingFlags,
    ModelFlags,
    ServerFlags,
    ToolParserFlags,
)


@dataclass(frozen=True, kw_only=True)
class TokenizerServerConfig(
    ServerFlags,
    GrpcServingFlags,
    LoggingFlags,
    ModelFlags,
    GrpcSecurityFlags,
    ToolParserFlags,
    ChatTemplateFlags,
):
    """Cleave tokenizer: chat templates, tokenize, streaming detokenize with stop strings.

    `--max-model-len` is only reported by GetInfo: the gateway checks prompt + max_tokens
    against it, and it must match the workers' (the tokenizer itself has no length limit).
    """

    max_concurrent_tokenizations: int = flag(
        0,
        codec=NON_NEGATIVE_INT,
        help="tokenize/template calls run at once on worker threads (0 = the usable cores)",
    )


def parse_args(argv: Sequence[str] | None = None) -> TokenizerServerConfig:
    return parse(TokenizerServerConfig, argv)
