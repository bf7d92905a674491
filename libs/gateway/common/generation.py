"""What the request path takes and gives: a request's generation spec (token ids, sampling,
stops, deadline, images), the per-sequence events it streams and the final usage figures;
and the spec's vocabulary check, made before any worker is called."""

from __future__ import annotations

from dataclasses import dataclass, field

from cleave.common.v1 import common_pb2
from libs.gateway.common import errors
from libs.gateway.common.deadline import NO_DEADLINE, Deadline


@dataclass(frozen=True)
class GenerationSpec:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    sampling: common_pb2.SamplingParams
    stops: list[str]
    # Fixed when the request arrived (libs/gateway/common/deadline.py); Pipeline.run sets it.
    deadline: Deadline = NO_DEADLINE
    cache_salt: str = ""  # the client's; workers and the kvstore key cached KV by it
    prompt_tokens_details: bool = False  # usage reports cached prompt tokens (responses.usage)
    include_stop_str_in_output: bool = False  # vLLM's: keep the stop string or token's text
    # The encoder's embeddings, one per image placeholder of the prompt (libs/gateway/api/images.py).
    image_embeddings: tuple[common_pb2.Tensor, ...] = ()
    # Without an encoder: the image files themselves, one per placeholder, for a worker whose
    # engine encodes them (a vision-language model in mode pd or XpYd).
    images: tuple[bytes, ...] = ()
    # The LoRA adapter the client named as `model` (None: the base model): applied by every
    # worker the request reaches, and part of every cache key of its KV.
    lora: common_pb2.LoraAdapter | None = None

    @property
    def served_as(self) -> str:
        """The `model` responses name: the adapter's, as vLLM's server answers, else the model's."""
        return self.lora.name if self.lora is not None else self.model

    @property
    def has_images(self) -> bool:
        return bool(self.image_embeddings or self.images)

    def metadata(self) -> common_pb2.RequestMetadata:
        """What every worker call of this request carries."""
        return common_pb2.RequestMetadata(
            request_id=self.request_id, model=self.model, cache_salt=self.cache_salt, lora=self.lora
        )


@dataclass
class SequenceEvent:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or stop string that ended it
    # The prompt's logprobs (as Finished.prompt_logprobs), on each sequence's first event when
    # the spec asked for them: a stream's echo sends them with its first chunk, as vLLM's.
    prompt_logprobs: list[common_pb2.TokenLogprob] | None = None


@dataclass
class Finished:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    # One per prompt token when the spec asked for them (the first is an empty entry: none).
    prompt_logprobs: list[common_pb2.TokenLogprob] | None = None


# What the serving room streams for a request: sequence events, then one Finished.
Event = SequenceEvent | Finished


def check_vocabulary(spec: GenerationSpec, vocab_size: int) -> None:
    """Token ids the client chose (a prompt of ids, logit_bias keys, stop token ids) must be
    in the workers' vocabulary; refused here before any worker spends time on them."""
    fields = [
        ("prompt", spec.prompt_token_ids),
        ("logit_bias", sorted(spec.sampling.logit_bias)),
        ("stop_token_ids", list(spec.sampling.stop_token_ids)),
        ("allowed_token_ids", list(spec.sampling.allowed_token_ids)),
    ]
    prompt = spec.prompt_token_ids
    if prompt and (min(prompt) < 0 or max(prompt) >= vocab_size):
        # vLLM's message (Renderer.validate_token_ids): the lowest id if negative, else the highest.
        worst = min(prompt) if min(prompt) < 0 else max(prompt)
        raise errors.invalid(f"Token id {worst} is out of vocabulary", "prompt")
    for param, ids in fields[1:]:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
            raise errors.invalid(
                f"{param} has {len(bad)} token id(s) outside the vocabulary [0, {vocab_size}): {shown}", param
            )
