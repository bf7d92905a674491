"""Tokenization for Cleave: chat rendering, encoding, incremental detokenization, stop strings.

The engines run with token ids only (skip_tokenizer_init), so everything that
turns text into ids and ids back into streamed text lives here.

Chat rendering and the tokenizer load transformers (seconds to import); they are imported
on first use, so the gateway, which only detokenizes (decoder.py, session.py), does not pay
for them.
"""

from typing import TYPE_CHECKING, Any

from libs.tokenization.detokenizer import IncrementalDetokenizer
from libs.tokenization.stop import StopResult, StopStringMatcher

if TYPE_CHECKING:
    from libs.tokenization.chat import CHAT_ROLES, ChatMessage
    from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig

_LAZY = {
    "CHAT_ROLES": "libs.tokenization.chat",
    "ChatMessage": "libs.tokenization.chat",
    "Tokenizer": "libs.tokenization.tokenizer",
    "TokenizerConfig": "libs.tokenization.tokenizer",
}

__all__ = [
    "CHAT_ROLES",
    "ChatMessage",
    "IncrementalDetokenizer",
    "StopResult",
    "StopStringMatcher",
    "Tokenizer",
    "TokenizerConfig",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
