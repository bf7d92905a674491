"""Command-line flags every Cleave gRPC service shares (model choice, address, logging)."""

from __future__ import annotations

import argparse
from pathlib import Path

from libs.models.spec import DEFAULT_MODEL

DEFAULT_MODEL_CACHE = Path.home() / ".cache" / "cleave" / "models"


def add_model_flags(parser: argparse.ArgumentParser, *, served_name_help: str | None = None) -> None:
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="'smollm2', a local Hugging Face folder, or a .gguf file"
    )
    parser.add_argument("--served-model-name", default=None, help=served_name_help)
    parser.add_argument(
        "--model-cache-dir",
        type=Path,
        default=DEFAULT_MODEL_CACHE,
        help="where converted GGUF models are kept",
    )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="0", help="gRPC port (0 = any free port; the bound one is logged)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-json", action="store_true")
