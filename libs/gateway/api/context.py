"""What the HTTP edge works with: the serving room's entry point, the fleet's facts and health,
the tokenizer and encoder services, and the server flags that set requests' defaults."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cleave.tokenizer.v1 import tokenizer_pb2_grpc
from libs.encoder.limits import ImageLimits
from libs.gateway.api.adapters import Adapters
from libs.gateway.api.logprob_limits import apply_max_logprobs, engine_max_logprobs
from libs.gateway.api.openai_api import INT32_MAX, ChatCompletionRequest, CompletionRequest
from libs.gateway.common.generation import Event, GenerationSpec
from libs.gateway.fleet.facts import FactsSource, ModelFacts
from libs.gateway.fleet.pool import Endpoint
from libs.tokenization.decoder import Decoder


class Generator(Protocol):
    """The serving room's entry point (serving/generate.py), or a scripted one in tests."""

    def check(self, spec: GenerationSpec) -> None: ...

    def generate(self, spec: GenerationSpec) -> AsyncIterator[Event]: ...


class ServiceHealth(Protocol):
    """A service's last known health, without a call (fleet/health_watch.py's WatchedHealth)."""

    def status(self) -> dict[str, Any]: ...


class Workers(Protocol):
    """The fleet's workers as health and /version see them (fleet/pool.py)."""

    @property
    def endpoints(self) -> Sequence[Endpoint]: ...


@dataclass(frozen=True)
class ApiOptions:
    """Server flags that set a request's defaults or what the edge serves (vLLM's names)."""

    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    force_include_usage: bool = False  # --enable-force-include-usage
    return_tokens_as_token_ids: bool = False  # --return-tokens-as-token-ids: the requests' default
    enable_auto_tool_choice: bool = False  # --enable-auto-tool-choice (tools.py)
    # How image files are read when the workers' engines encode images themselves.
    image_limits: ImageLimits = field(default_factory=ImageLimits)


@dataclass(frozen=True)
class ApiContext:
    serving: Generator
    facts: FactsSource
    workers: Workers
    tokenizer: tokenizer_pb2_grpc.TokenizerStub
    # What /health and /ready say of the tokenizer: its health watch, no call per probe.
    tokenizer_health: ServiceHealth
    options: ApiOptions = field(default_factory=ApiOptions)
    # The vision encoder (modes xEyPD / xEyPzD); None: the workers encode images if their
    # model takes them (facts.takes_images), else image parts are 400s.
    encoder: Any = None  # an EncoderStub (or images.py's round robin of them)
    # The tokenizer's decoder when it handed it out: logprobs' token texts decoded here.
    decoder: Decoder | None = None
    # The LoRA adapters clients may name as `model` (--lora-modules, /v1/load_lora_adapter).
    adapters: Adapters = field(default_factory=Adapters)

    @property
    def model(self) -> ModelFacts:
        return self.facts.current

    def worker_images(self) -> ImageLimits | None:
        """No encoder and a vision-language model: image files go to the workers, read with
        these limits (the engine runs the vision tower). None: the encoder's job, or 400s."""
        if self.encoder is None and self.model.takes_images:
            return self.options.image_limits
        return None

    def check_logprobs(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        """The workers' --max-logprobs, before anything builds their contract."""
        facts = self.model
        vocab_size = facts.vocab_size or INT32_MAX
        apply_max_logprobs(body, engine_max_logprobs(facts.max_logprobs, vocab_size), vocab_size)
