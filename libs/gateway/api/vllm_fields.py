"""The one table of vLLM request fields Cleave does not implement, and the policy for fields
nobody knows.

vLLM's OpenAI server (its CompletionRequest / ChatCompletionRequest, an `OpenAIBaseModel`)
accepts any extra field and ignores it with a log line. Cleave does the same: a field that is
neither a declared field of the request model (openai_api.py: implemented) nor in this table
is logged as a warning with the request id and ignored. A field in `REFUSED` that is set to
anything but a neutral value is a 400 "not supported" naming it, so a client never believes a
parameter took effect when it did not. `IGNORED` fields are accepted without effect, each
for the reason given (mostly: vLLM itself ignores them on these endpoints).

tests/libs/gateway/test_vllm_fields.py checks every field of the installed vLLM's request
models is declared by Cleave's model or listed here, so a vLLM upgrade that adds a field fails
until someone decides what Cleave does with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from libs.gateway.common import errors

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Refusal:
    feature: str  # what the client asked for, in the 400's message
    why: str  # why Cleave does not do it (docs; not sent)
    neutral: tuple[Any, ...] = (None,)  # values that ask for nothing: accepted


_NO_PD_TRANSFER = "Cleave moves KV itself (typed KvHandoff); a client's connector parameters would bypass it"

REFUSED: Mapping[str, Refusal] = {
    "prompt_embeds": Refusal(
        "prompt_embeds", "engines take token ids only (the contract carries no embeddings)"
    ),
    "kv_transfer_params": Refusal("kv_transfer_params", _NO_PD_TRANSFER),
    "ec_transfer_params": Refusal("ec_transfer_params", _NO_PD_TRANSFER),
    "logprob_token_ids": Refusal("logprob_token_ids", "the contract carries top-k logprobs only"),
    "repetition_detection": Refusal("repetition_detection", "not carried by the contract yet"),
    "thinking_token_budget": Refusal(
        "thinking_token_budget", "needs a reasoning parser; Cleave serves none", (None, -1)
    ),
    "watermarking": Refusal("watermarking", "not carried by the contract", (None, False)),
    "media_io_kwargs": Refusal("media_io_kwargs", "multimodal input is not served"),
    "mm_processor_kwargs": Refusal("mm_processor_kwargs", "multimodal input is not served"),
    "chat_template": Refusal(
        "a chat template in the request (chat_template)",
        "vLLM also refuses it unless started with --trust-request-chat-template: a request's "
        "template runs server-side Jinja",
    ),
    "truncation_side": Refusal(
        "truncation_side other than left",
        "truncate_prompt_tokens keeps the last tokens (vLLM's default, the tokenizer's side)",
        (None, "left"),
    ),
}

IGNORED: Mapping[str, str] = {
    "session_id": "vLLM's affinity hint for its router; Cleave routes by prefix instead",
    "mm_payload": "render endpoints only (vLLM ignores it on generation endpoints)",
    "return_mm_kwargs": "render endpoints only (vLLM ignores it on generation endpoints)",
    "return_token_offsets": "render endpoints only (vLLM ignores it on generation endpoints)",
    "routed_experts_prompt_start": "no routed-expert data is returned (vLLM returns it only with "
    "--enable-return-routed-experts)",
    "stream_interval": "chunking only: Cleave streams each engine step's tokens (vLLM's default interval, 1)",
    "spaces_between_special_tokens": "the tokenizer is a fast one, whose decoding does not use it "
    "(vLLM's FastIncrementalDetokenizer ignores it too)",
    "include_reasoning": "no reasoning parser is served: there is no reasoning to include",
    "guided_decoding_backend": "removed from vLLM's single-request API; the engine's backend is used",
}


def check_refused(extra: Mapping[str, Any] | None) -> None:
    """A 400 for the first refused field the request sets to a non-neutral value."""
    for name, value in (extra or {}).items():
        refusal = REFUSED.get(name)
        if refusal is not None and value not in refusal.neutral:
            raise errors.unsupported(refusal.feature, name)


def warn_unknown(extra: Mapping[str, Any] | None, request_id: str) -> None:
    """Logs fields neither Cleave nor this table knows (vLLM's policy: ignored, logged)."""
    unknown = sorted(set(extra or {}) - set(REFUSED) - set(IGNORED))
    if unknown:
        log.warning("request fields ignored (unknown)", fields=unknown, request_id=request_id)
