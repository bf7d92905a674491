"""The container commands of deploy/ against the services' own config parsers: a renamed or
removed flag, or a value a service refuses, fails the manifest tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from libs.config.flags import parse
from libs.encoder.server_config import parse_args as parse_encoder
from libs.gateway.config import parse_args as parse_gateway
from libs.kvstore.server_config import parse_args as parse_kvstore
from libs.planner.config import parse_args as parse_planner
from libs.tokenization.server_config import parse_args as parse_tokenizer
from libs.worker.config import WorkerConfig

# Image name (without tag) -> the parser of the binary that is its entrypoint.
PARSERS: dict[str, Callable[[Sequence[str]], Any]] = {
    "cleave-gateway": parse_gateway,
    "cleave-tokenizer": parse_tokenizer,
    "cleave-worker": lambda argv: parse(WorkerConfig, argv),
    "cleave-kvstore": parse_kvstore,
    "cleave-encoder": parse_encoder,
    "cleave-planner": parse_planner,
}


def image_name(image: str) -> str:
    """'cleave-worker:latest' -> 'cleave-worker'."""
    return image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image


def parse_command(image: str, argv: Sequence[str]) -> Any:
    """The config the image's service builds from `argv`; raises what the service would."""
    name = image_name(image)
    if name not in PARSERS:
        raise AssertionError(f"image {image!r} is not one of Cleave's ({sorted(PARSERS)})")
    try:
        return PARSERS[name](list(argv))
    except SystemExit as error:  # argparse: an unknown flag or a bad value
        raise AssertionError(f"{name} refuses its command {list(argv)} (exit {error.code})") from None


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
