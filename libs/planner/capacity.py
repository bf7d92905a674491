"""What one worker of each role sustains under the objectives: requests per second, predicted
from a mock profile's step-time formula (libs/mockengine/timing.py) and its scheduler limits.

With b = base_s, s = per_seq_s, p = per_prefill_token_s, x = per_context_token_s,
a = per_prefill_attention_s, M = max_num_batched_tokens, S = max_num_seqs, K = KV tokens,
prompt length L and output length O (their moments from the workload), q = the attainment:

- decode worker (disaggregated): B sequences decode together; a step takes
  t(B) = b + (s + x*C)*B with C = E[L] + E[O]/2 the mean context. Every request pays one
  token per step, so its ITL is t(B) (mean and p99 alike: no prompt shares its steps). The
  batch fluctuates (Poisson arrivals: B + z*sqrt(B) at the quantile); it must keep t within
  the ITL objective, fit S, and fit the KV cache (B*(E[L] + E[O]) <= K). Throughput is
  B / (t(B) * E[O]) requests/s.
- prefill worker: a prompt costs W = p*E[L] + a*E[L^2]/2 plus its share of each full step's
  fixed part (b per M tokens, s per chunk), so it saturates at 1/W. TTFT = the work queued
  ahead of it (M/G/1: Pollaczek-Khinchine's mean with an exponential tail, the prompt
  lengths' variance as the service's) + its own prompt (the longest) + the KV transfer +
  decode's first step; the highest rate whose TTFT quantile meets the objective.
- colocated worker: prompts and decodes share steps. Per second the engine spends
  lam*W on prompts and steps of b + (s + x*C)*B on decodes, so the mean step, which is a
  request's mean ITL, is t = b / (1 - lam*(W + (s + x*C)*E[O])) (B = lam*E[O]*t). With the
  ITL taken per request as its p99 gap, a step holding a prompt's chunk is a gap of its own:
  when such a step exceeds the objective, a request fails once it sees about 0.01*E[O] + 2 of
  them (Poisson, lam*E[O]*t expected), which bounds the rate too. TTFT: the chunks of a long
  prompt at the mixed step time.

These are first-order (means, one quantile factor); the planning mode checks its choice
in the discrete-event simulation (libs/planner/sim), and the control loop corrects with what
it observes. All times unscaled (the profile's seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from libs.mockengine.config import CoreConfig, ResolvedConfig, resolve
from libs.mockengine.timing import StepCoefficients
from libs.planner.slo import Slo
from libs.planner.workload import Lengths

# Capacity is planned below saturation: a queue that never drains has no steady TTFT.
MAX_UTILIZATION = 0.95


@dataclass(frozen=True)
class Engine:
    """A worker's step-time coefficients and scheduler limits."""

    coefficients: StepCoefficients
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int
    transfer_latency_s: float
    transfer_bytes_per_s: float
    kv_bytes_per_token: int

    @classmethod
    def of(cls, resolved: ResolvedConfig, cores: int | None = None) -> Engine:
        profile = resolved.profile
        return cls(
            coefficients=profile.coefficients_for(cores),
            max_num_seqs=resolved.max_num_seqs,
            max_num_batched_tokens=resolved.max_num_batched_tokens,
            kv_tokens=(resolved.num_kv_blocks - 1) * resolved.block_size,
            transfer_latency_s=profile.kv_transfer.latency_s,
            transfer_bytes_per_s=profile.kv_transfer.bandwidth_bytes_per_s,
            kv_bytes_per_token=profile.model.kv_bytes_per_token(),
        )

    @classmethod
    def from_profile(cls, profile: str, cores: int | None = None, **overrides: Any) -> Engine:
        return cls.of(resolve(CoreConfig(profile=profile, **overrides)), cores)

    def transfer_s(self, tokens: float) -> float:
        if self.transfer_bytes_per_s <= 0:
            return self.transfer_latency_s
        return self.transfer_latency_s + tokens * self.kv_bytes_per_token / self.transfer_bytes_per_s


@dataclass(frozen=True)
class Shape:
    """The workload's moments the model uses."""

    isl: float  # E[L]
    isl_sq: float  # E[L^2]
    isl_high: float  # the longest prompts (the upper end of the distribution)
    osl: float  # E[O]

    @classmethod
    def of(cls, isl: Lengths, osl: Lengths) -> Shape:
        return cls(isl.mean, isl.moment(2), float(isl.high), osl.mean)

    @classmethod
    def of_means(cls, isl: float, osl: float) -> Shape:
        return cls(isl, isl * isl, isl, osl)

    @property
    def context(self) -> float:
        return self.isl + self.osl / 2


@dataclass(frozen=True)
class Capacity:
    """Requests per second one worker of each role sustains within the objectives."""

    prefill: float
    decode: float
    colocated: float
    notes: tuple[str, ...] = ()


def _z(slo: Slo) -> float:
    return NormalDist().inv_cdf(slo.attainment)


def decode_batch(engine: Engine, shape: Shape, slo: Slo) -> float:
    """The mean decode batch a worker can run within the ITL objective, S and the KV cache."""
    c = engine.coefficients
    per_seq = c.per_seq_s + c.per_context_token_s * shape.context
    by_itl = (slo.itl_s - c.base_s) / per_seq if per_seq > 0 else math.inf
    by_kv = engine.kv_tokens / max(shape.isl + shape.osl, 1.0)
    ceiling = min(by_itl, float(engine.max_num_seqs), by_kv)
    if ceiling <= 0:
        return 0.0
    # The batch at the attainment quantile is about B + z*sqrt(B): the mean B that keeps it
    # under the ceiling.
    z = _z(slo)
    root = (-z + math.sqrt(z * z + 4 * ceiling)) / 2
    return max(root * root, 0.0)


def decode_capacity(engine: Engine, shape: Shape, slo: Slo) -> float:
    batch = decode_batch(engine, shape, slo)
    if batch <= 0:
        return 0.0
    c = engine.coefficients
    step = c.base_s + (c.per_seq_s + c.per_context_token_s * shape.context) * batch
    return batch / (step * shape.osl)


def prompt_work(engine: Engine, shape: Shape) -> float:
    """Seconds of engine time one prompt costs when steps are full."""
    c = engine.coefficients
    share = shape.isl / engine.max_num_batched_tokens  # of full steps' fixed part
    return (
        c.per_prefill_token_s * shape.isl
        + c.per_prefill_attention_s * shape.isl_sq / 2
        + c.base_s * share
        + c.per_seq_s * max(share, 1.0)
    )


def _prefill_ttft(engine: Engine, shape: Shape, slo: Slo, rate: float) -> float:
    c = engine.coefficients
    work = prompt_work(engine, shape)
    rho = rate * work
    if rho >= 1:
        return math.inf
    high = shape.isl_high
    own = c.base_s + c.per_seq_s + c.per_prefill_token_s * high + c.per_prefill_attention_s * high * high / 2
    # M/G/1 waiting (Pollaczek-Khinchine mean, exponential tail beyond P(wait) = rho): the
    # work queued ahead of a prompt, however the engine batches it.
    cv2 = max(shape.isl_sq / (shape.isl * shape.isl) - 1.0, 0.0)
    mean_wait = rho * (1 + cv2) * work / (2 * (1 - rho))
    tail = 1.0 - slo.attainment
    wait = mean_wait / rho * math.log(rho / tail) if rho > tail else 0.0
    first_decode_step = c.base_s + c.per_seq_s
    return wait + own + engine.transfer_s(high) + first_decode_step


def _solve(ok: Callable[[float], bool], high: float) -> float:
    """The largest rate in (0, high] with ok(rate), by bisection (0 if none)."""
    low, top = 0.0, high
    if not ok(top * 1e-6):
        return 0.0
    for _ in range(60):
        mid = (low + top) / 2
        if ok(mid):
            low = mid
        else:
            top = mid
    return low


def prefill_capacity(engine: Engine, shape: Shape, slo: Slo) -> float:
    mu = 1.0 / prompt_work(engine, shape)
    return _solve(lambda rate: _prefill_ttft(engine, shape, slo, rate) <= slo.ttft_s, MAX_UTILIZATION * mu)


def _colocated_step(engine: Engine, shape: Shape, rate: float) -> float:
    """The mean step (a request's mean ITL) of a colocated worker at `rate`."""
    c = engine.coefficients
    per_seq = c.per_seq_s + c.per_context_token_s * shape.context
    busy = rate * (prompt_work(engine, shape) + per_seq * shape.osl)
    return c.base_s / (1 - busy) if busy < 1 else math.inf


def _colocated_ok(engine: Engine, shape: Shape, slo: Slo, rate: float) -> bool:
    c = engine.coefficients
    step = _colocated_step(engine, shape, rate)
    if step > slo.itl_s:
        return False
    batch = rate * shape.osl * step
    if batch + _z(slo) * math.sqrt(batch) > min(
        engine.max_num_seqs, engine.kv_tokens / (shape.isl + shape.osl)
    ):
        return False
    per_seq = c.per_seq_s + c.per_context_token_s * shape.context
    budget = max(engine.max_num_batched_tokens - batch, 1.0)
    chunk = min(shape.isl_high, budget)
    mixed = step + c.per_prefill_token_s * chunk + c.per_prefill_attention_s * chunk * chunk / 2 + per_seq
    if slo.itl_stat == "p99" and mixed > slo.itl_s:
        # A request fails once it sees about 0.01 * gaps + 2 such steps; at most 1 - q may.
        seen = rate * shape.osl * step
        allowed = 0.01 * shape.osl + 2
        if _poisson_tail(seen, math.ceil(allowed)) > 1 - slo.attainment:
            return False
    chunks = math.ceil(shape.isl_high / budget)
    ttft = step + chunks * mixed + _z(slo) * step
    return ttft <= slo.ttft_s


def _poisson_tail(mean: float, k: int) -> float:
    """P(N >= k) for N ~ Poisson(mean)."""
    term = math.exp(-mean)
    below = 0.0
    for n in range(k):
        below += term
        term *= mean / (n + 1)
    return max(1.0 - below, 0.0)


def colocated_capacity(engine: Engine, shape: Shape, slo: Slo) -> float:
    c = engine.coefficients
    per_seq = c.per_seq_s + c.per_context_token_s * shape.context
    saturation = 1.0 / (prompt_work(engine, shape) + per_seq * shape.osl)
    return _solve(lambda rate: _colocated_ok(engine, shape, slo, rate), MAX_UTILIZATION * saturation)


def capacity(engine: Engine, shape: Shape, slo: Slo) -> Capacity:
    return Capacity(
        prefill=prefill_capacity(engine, shape, slo),
        decode=decode_capacity(engine, shape, slo),
        colocated=colocated_capacity(engine, shape, slo),
    )
