"""The tokenizer service's configuration (the only place its flags are declared)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.config.flags import parse
from libs.config.groups import GrpcSecurityFlags, LoggingFlags, ModelFlags, ServerFlags


@dataclass(frozen=True, kw_only=True)
class TokenizerServerConfig(ServerFlags, LoggingFlags, ModelFlags, GrpcSecurityFlags):
    """Cleave tokenizer: chat templates, tokenize, streaming detokenize with stop strings.

    `--max-model-len` is only reported by GetInfo: the gateway checks prompt + max_tokens
    against it, and it must match the workers' (the tokenizer itself has no length limit).
    """


def parse_args(argv: Sequence[str] | None = None) -> TokenizerServerConfig:
    return parse(TokenizerServerConfig, argv)
