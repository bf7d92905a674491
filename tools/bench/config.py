"""The benchmark's configuration: frozen dataclasses, validated once when built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Api = Literal["completions", "chat"]
WorkloadName = Literal["random", "prefix", "multiturn", "long-interference"]

APIS: tuple[Api, ...] = ("completions", "chat")
WORKLOADS: tuple[WorkloadName, ...] = ("random", "prefix", "multiturn", "long-interference")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


_POSITIVE_LENGTHS = (
    "input_len",
    "output_len",
    "num_prefixes",
    "prefix_len",
    "suffixes_per_prefix",
    "suffix_len",
    "turns",
    "long_input_len",
)


@dataclass(frozen=True)
class WorkloadConfig:
    """What prompts to send. Lengths are in (approximate) tokens."""

    name: WorkloadName = "random"
    # Every workload: user-message length and requested output length, each drawn uniformly
    # from [len * (1 - len_spread), len * (1 + len_spread)].
    input_len: int = 256
    output_len: int = 128
    len_spread: float = 0.0
    # prefix: num_prefixes shared prefixes, each followed by suffixes_per_prefix suffixes.
    num_prefixes: int = 4
    prefix_len: int = 512
    suffixes_per_prefix: int = 8
    suffix_len: int = 64
    # multiturn: sessions of `turns` user turns; each turn resends the conversation so far.
    turns: int = 4
    # long-interference: this fraction of requests carries a long_input_len prompt.
    long_fraction: float = 0.1
    long_input_len: int = 2000

    def __post_init__(self) -> None:
        _require(
            self.name in WORKLOADS, f"unknown workload {self.name!r}; choose from {', '.join(WORKLOADS)}"
        )
        for name in _POSITIVE_LENGTHS:
            _require(getattr(self, name) >= 1, f"{name} must be >= 1")
        _require(0 <= self.len_spread < 1, "len_spread must be in [0, 1)")
        _require(0 <= self.long_fraction <= 1, "long_fraction must be in [0, 1]")


@dataclass(frozen=True)
class Slos:
    """Service-level objectives for goodput, in milliseconds; None = not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"goodput SLO {name} must be > 0")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run: one endpoint, one workload, one arrival process."""

    url: str
    model: str
    api: Api = "completions"
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    seed: int = 0
    # Open loop: `rate` requests/s (math.inf = all at once), optionally capped at
    # `concurrency` in flight. Closed loop (rate None): `concurrency` requests always in flight.
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = 1
    # Stop starting requests after num_requests or duration_s, whichever comes first.
    num_requests: int | None = 100
    duration_s: float | None = None
    warmup_requests: int = 0
    temperature: float = 0.0
    # Extensions vLLM accepts (not the OpenAI API), sent only when asked for, to make the
    # output length exactly the requested max_tokens.
    min_tokens: bool = False
    ignore_eos: bool = False
    timeout_s: float = 600.0
    goodput: Slos = field(default_factory=Slos)
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token

    def __post_init__(self) -> None:
        _require(
            self.url.startswith(("http://", "https://")), f"url must start with http(s)://: {self.url!r}"
        )
        _require(bool(self.model), "model must not be empty")
        _require(self.api in APIS, f"unknown api {self.api!r}; choose from {', '.join(APIS)}")
        _require(self.rate is None or self.rate > 0, "rate must be > 0 (inf = all at once)")
        _require(self.rate is not None or self.concurrency is not None, "give a rate or a concurrency")
        _require(self.concurrency is None or self.concurrency >= 1, "concurrency must be >= 1")
        _require(math.isfinite(self.burstiness) and self.burstiness > 0, "burstiness must be > 0")
        _require(self.num_requests is None or self.num_requests >= 1, "num_requests must be >= 1")
        _require(self.duration_s is None or self.duration_s > 0, "duration_s must be > 0")
        _require(
            self.num_requests is not None or self.duration_s is not None, "give num_requests or duration_s"
        )
        _require(
            self.num_requests is not None or self.rate is None or math.isfinite(self.rate),
            "an infinite rate needs num_requests",
        )
        _require(self.warmup_requests >= 0, "warmup_requests must be >= 0")
        _require(self.timeout_s > 0, "timeout_s must be > 0")
        _require(0 <= self.temperature <= 2, "temperature must be in [0, 2]")

    @property
    def base_url(self) -> str:
        """The server root: accepts http://host:port, .../ and .../v1 alike."""
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url
