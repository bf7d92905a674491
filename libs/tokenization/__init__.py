"""Tokenization for Cleave: chat rendering, encoding, incremental detokenization, stop strings.

The engines run with token ids only (skip_tokenizer_init), so everything that
turns text into ids and ids back into streamed text lives here.
"""

from libs.tokenization.chat import CHAT_ROLES, ChatMessage
from libs.tokenization.detokenizer import IncrementalDetokenizer
from libs.tokenization.stop import StopResult, StopStringMatcher
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig

__all__ = [
    "CHAT_ROLES",
    "ChatMessage",
    "IncrementalDetokenizer",
    "StopResult",
    "StopStringMatcher",
    "Tokenizer",
    "TokenizerConfig",
]
