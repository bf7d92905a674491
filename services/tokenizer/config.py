"""Command line -> frozen configuration for the tokenizer process (the only place flags are read)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.config.values import parse_port, parse_positive_int
from services.flags import add_model_flags, add_server_flags

# The same cache the workers use, so a GGUF converted by either is reused by both.


@dataclass(frozen=True)
class TokenizerProcessConfig:
    model: str
    served_model_name: str | None
    model_cache_dir: Path
    host: str
    port: int
    log_level: str
    log_json: bool
    # Only reported by GetInfo: the gateway checks prompt + max_tokens against it, and it
    # must match the workers' --max-model-len (the tokenizer itself has no length limit).
    max_model_len: int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Cleave tokenizer: chat templates, tokenize, streaming detokenize with stop strings."
    )
    add = parser.add_argument
    add_model_flags(parser, served_name_help="name GetInfo reports (default: the model's own)")
    add_server_flags(parser)
    add("--max-model-len", default="2048", help="context length reported by GetInfo")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> TokenizerProcessConfig:
    args = build_parser().parse_args(argv)
    return TokenizerProcessConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        model_cache_dir=args.model_cache_dir,
        host=args.host,
        port=parse_port("--port", args.port),
        log_level=args.log_level,
        log_json=args.log_json,
        max_model_len=parse_positive_int("--max-model-len", args.max_model_len),
    )
