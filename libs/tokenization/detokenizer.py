"""Streams text from token ids as they arrive, one chunk at a time.

Decoding each token on its own is wrong: byte-level BPE and byte-fallback
vocabularies split one character over several tokens, and SentencePiece
decoders drop a token's leading space when it starts the decoded text. So we
use the prefix-offset/read-offset technique of vLLM
(vllm/transformers_utils/detokenizer_utils.py, detokenize_incrementally) and
TGI (text_generation_server/models/model.py, Model.decode_token): decode a
window that starts a few tokens back, and emit only what the new tokens added.
vLLM does this inside its engine; Cleave runs the engine with
skip_tokenizer_init, so the tokenizer service has to do it.
"""

from collections.abc import Sequence

import structlog

from libs.tokenization.decoder import Decoder

log = structlog.get_logger(__name__)

# What decoders put where bytes do not (yet) form a whole UTF-8 character.
REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded before the first generated one, as vLLM does: enough
# context for a leading space or a character begun in the prompt to come out
# as the full decode would render it.
CONTEXT_WINDOW = 5


class IncrementalDetokenizer:
    """Turns a stream of token id chunks into text deltas.

    Joining every feed() result and the final flush() gives exactly
    decode(all ids) (with context_ids: the text those ids add after them).
    No delta ever contains a replacement character standing for an
    incomplete UTF-8 sequence; such text is held until it completes.

    One exception, by choice: with byte-fallback vocabularies (<0xNN>
    tokens), tokenizers' ByteFallback decoder replaces a whole run of byte
    tokens by U+FFFDs once the run turns invalid, including characters it
    had already completed. Waiting for each run to end would stall CJK and
    emoji output, so (like vLLM and TGI) complete characters go out at once;
    only for such invalid output does the stream differ from decode().
    Byte-level BPE (GPT-2 style, as SmolLM2) has no such case.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        *,
        skip_special_tokens: bool = True,
        context_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(context_ids[-CONTEXT_WINDOW:])
        self._context_len = len(self._ids)
        # Window [prefix_offset, read_offset) is already emitted; its decode is
        # the baseline the next window's decode is compared with.
        self._prefix_offset = 0
        self._read_offset = self._context_len
        self._prefix_text: str | None = None
        # Chars of the current window, past the baseline, already emitted
        # while the window still ended in an incomplete character.
        self._emitted_in_window = 0
        self._emitted: list[str] = []
        self._finished = False

    @property
    def num_tokens(self) -> int:
        """Generated tokens fed so far (context excluded)."""
        return len(self._ids) - self._context_len

    def feed(self, token_ids: Sequence[int]) -> str:
        """Adds generated token ids; returns the text they complete (maybe "")."""
        if self._finished:
            raise RuntimeError("feed() after flush()")
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window = self._decode(self._ids[self._prefix_offset :])
        added = window[len(self._prefix_text) :]
        # Trailing replacement chars may be the start of a character whose
        # remaining bytes are in tokens yet to come; what precedes them is
        # final, so emit it now rather than stall a whole chunk.
        stable = added.rstrip(REPLACEMENT_CHAR)
        delta = stable[self._emitted_in_window :]
        if stable and stable == added:
            # Window ends on a whole character: slide it forward, as vLLM does.
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self._prefix_text = None
            self._emitted_in_window = 0
        else:
            # Keep offsets so the next decode sees the held bytes again.
            self._emitted_in_window = max(self._emitted_in_window, len(stable))
        if delta:
            self._emitted.append(delta)
        return delta

    def flush(self) -> str:
        """Ends the stream and returns whatever text was still held back."""
        if self._finished:
            return ""
        self._finished = True
        full = self._decode(self._ids)
        if self._context_len:
            full = full[len(self._decode(self._ids[: self._context_len])) :]
        emitted = "".join(self._emitted)
        if not full.startswith(emitted):
            # Only when a decoder rewrites text it already produced (see the
            # class docstring). Sent text cannot be recalled: log, send the tail.
            log.warning(
                "detokenizer.diverged",
                emitted_chars=len(emitted),
                full_chars=len(full),
                num_tokens=self.num_tokens,
            )
        rest = full[len(emitted) :]
        if rest:
            self._emitted.append(rest)
        return rest

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
