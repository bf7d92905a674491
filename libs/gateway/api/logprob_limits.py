"""vLLM's bound on logprobs per position, checked at the gateway with the workers' own bound.

vLLM's engine refuses a request whose sampled, top or prompt logprobs exceed its
`--max-logprobs` (`SamplingParams._validate_logprobs`; -1 = no cap, i.e. the vocabulary), and
reads a request's `-1` as the whole vocabulary. The gateway makes the same check with the
value the workers report (`WorkerInfo.max_logprobs`) before it builds the workers' contract:
a value past int32 would not even fit it (the HTTP fuzzer's `prompt_logprobs: 2**31`), and a
refused request costs no worker anything. It resolves `-1` to the vocabulary size here, so
every later stage (contract, responses) sees a plain count.
"""

from __future__ import annotations

from libs.config.groups import MAX_LOGPROBS_DEFAULT
from libs.gateway.api.openai_api import ChatCompletionRequest, CompletionRequest
from libs.gateway.common import errors

__all__ = ["MAX_LOGPROBS_DEFAULT", "apply_max_logprobs", "engine_max_logprobs"]


def engine_max_logprobs(reported: int | None, vocab_size: int) -> int:
    """The bound as a count: the workers' --max-logprobs (vLLM's default when a worker does
    not say), -1 meaning the vocabulary, as vLLM resolves it."""
    value = MAX_LOGPROBS_DEFAULT if reported is None else reported
    return vocab_size if value == -1 else value


def apply_max_logprobs(
    body: ChatCompletionRequest | CompletionRequest, max_logprobs: int, vocab_size: int
) -> None:
    """Resolves the request's `-1`s to `vocab_size` in place, then refuses counts above
    `max_logprobs` (already a count: `engine_max_logprobs`) with vLLM's messages and
    parameters, sampled logprobs first, as the engine checks them."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs == -1:
            body.top_logprobs = vocab_size
        sampled = body.top_logprobs if body.logprobs else None
    else:
        if body.logprobs == -1:
            body.logprobs = vocab_size
        sampled = body.logprobs
    if body.prompt_logprobs == -1:
        body.prompt_logprobs = vocab_size
    if sampled and sampled > max_logprobs:
        raise _engine_refusal("sample", sampled, max_logprobs, "logprobs")
    # echo asks for the prompt's logprobs at the sampled count: checked above already.
    prompt = body.prompt_logprobs
    if prompt and prompt > max_logprobs:
        raise _engine_refusal("prompt", prompt, max_logprobs, "prompt_logprobs")


def _engine_refusal(kind: str, requested: int, max_logprobs: int, param: str) -> errors.ApiError:
    # vLLM's VLLMValidationError as its server answers it: str(error) (the message, then the
    # parameter and value), type BadRequestError, code 400, param.
    return errors.ApiError(
        400,
        f"Requested {kind} logprobs of {requested}, which is greater than max allowed: {max_logprobs} "
        f"(parameter={param}, value={requested})",
        type_="BadRequestError",
        param=param,
        code=400,
    )
