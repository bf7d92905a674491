"""The comparison's workloads as tools/bench configurations.

Every workload uses the chat API, greedy sampling and `ignore_eos`, so each request produces
exactly its max_tokens on every system; the same seed gives every system the same prompts in
the same order. Defaults are sized for a 2-core CPU machine (the whole four-system comparison
in about 25 minutes); every size is a flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tools.bench.config import BenchConfig, WorkloadConfig

WORKLOADS = ("short-chat", "long-interference", "prefix")

DESCRIPTIONS = {
    "short-chat": "short chat prompts at a fixed concurrency (closed loop)",
    "long-interference": (
        "short chat requests arriving at a Poisson rate, some carrying a long prompt that must be"
        " prefilled while the others decode; the number to watch is p99 ITL"
    ),
    "prefix": "requests sharing a few long prefixes (prefix caching), fixed concurrency",
}


@dataclass(frozen=True)
class CompareSizes:
    output_len: int = 64
    short_input_len: int = 40
    short_requests: int = 40
    short_concurrency: int = 4
    long_requests: int = 40
    long_rate: float = 0.5
    long_fraction: float = 0.15
    # Words ~ tokens; with SmolLM2's chat template (~30 tokens) and 64 output tokens a 1,900-word
    # prompt stays inside max-model-len 2048.
    long_input_len: int = 1900
    prefix_requests: int = 32
    prefix_concurrency: int = 4
    num_prefixes: int = 4
    prefix_len: int = 512
    warmup_requests: int = 2
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("short_requests", "long_requests", "prefix_requests", "short_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 < self.long_fraction < 1:
            raise ValueError("long_fraction must be in (0, 1)")
        if self.long_rate <= 0:
            raise ValueError("long_rate must be > 0")

    def num_requests(self, workload: str) -> int:
        return {
            "short-chat": self.short_requests,
            "long-interference": self.long_requests,
            "prefix": self.prefix_requests,
        }[workload]


def bench_config(workload: str, sizes: CompareSizes, url: str, model: str) -> BenchConfig:
    """The tools/bench run of `workload` against `url`."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    base = BenchConfig(
        url=url,
        model=model,
        api="chat",
        seed=sizes.seed,
        warmup_requests=sizes.warmup_requests,
        temperature=0.0,
        ignore_eos=True,
        timeout_s=sizes.timeout_s,
        num_requests=sizes.num_requests(workload),
    )
    if workload == "short-chat":
        return replace(
            base,
            workload=WorkloadConfig(
                name="random", input_len=sizes.short_input_len, output_len=sizes.output_len
            ),
            concurrency=sizes.short_concurrency,
        )
    if workload == "long-interference":
        return replace(
            base,
            workload=WorkloadConfig(
                name="long-interference",
                input_len=sizes.short_input_len,
                output_len=sizes.output_len,
                long_fraction=sizes.long_fraction,
                long_input_len=sizes.long_input_len,
            ),
            rate=sizes.long_rate,
            concurrency=None,  # open loop: long prompts arrive whatever is decoding
        )
    return replace(  # prefix
        base,
        workload=WorkloadConfig(
            name="prefix",
            num_prefixes=sizes.num_prefixes,
            prefix_len=sizes.prefix_len,
            suffixes_per_prefix=math.ceil(sizes.prefix_requests / sizes.num_prefixes),
            suffix_len=sizes.short_input_len,
            output_len=sizes.output_len,
        ),
        concurrency=sizes.prefix_concurrency,
    )
