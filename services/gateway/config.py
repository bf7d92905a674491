"""The gateway's configuration (the only place its flags are declared). Flag names follow
qaic_disagg's launch commands (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libs.config.codecs import ADDRESSES, PORT, choice
from libs.config.errors import ConfigError
from libs.config.flags import flag, parse
from libs.config.groups import ServerFlags
from libs.gateway.routing import POLICIES
from libs.stack.config import StackConfig


@dataclass(frozen=True, kw_only=True)
class GatewayConfig(ServerFlags, StackConfig):
    """Cleave gateway: one OpenAI-compatible endpoint over prefill/decode workers."""

    port: int = flag(8000, codec=PORT, help="HTTP port of the OpenAI API (0 = any free port)")
    # Addresses of running services; when no worker address is given the gateway starts a
    # local stack of child processes instead (StackConfig's flags).
    tokenizer: str | None = flag(None, help="address of a running tokenizer service")
    prefill_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running prefill workers")
    decode_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running decode workers")
    pd_workers: tuple[str, ...] = flag((), codec=ADDRESSES, help="addresses of running colocated workers")
    routing: str = flag("least_load", codec=choice(sorted(POLICIES)), help="routing policy")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.launches_stack and not self.tokenizer:
            raise ConfigError(
                "--tokenizer", None, "the tokenizer service's address when worker addresses are given"
            )

    @property
    def launches_stack(self) -> bool:
        return not (self.prefill_workers or self.decode_workers or self.pd_workers)


def parse_args(argv: Sequence[str] | None = None) -> GatewayConfig:
    return parse(GatewayConfig, argv)
