"""The planning mode: given a workload and a profile, the fleet to run before anything runs.

1. The capacity model (capacity.py) gives each role's requests/s per worker; the workload's
   rate divided by it (at `utilization`) sizes a disaggregated fleet (XpYd) and an all-
   colocated one (Npd).
2. Each is checked in the discrete-event simulation (sim/), on the mock engine's scheduler
   with the same profile, and corrected there: while the objectives are missed, one worker
   is added to the role that misses (ITL: decode; TTFT: the busier of prefill and decode);
   then each role gives up workers while they are still met. This is what the model cannot
   know (queueing at the attainment quantile, batching), at the price of a few runs.
3. Disaggregate only when it needs fewer workers than colocating (a tie is `pd`: one kind of
   worker, no KV transfer). The conditional-disaggregation threshold is the longest prompt a
   decode worker can compute itself, at its planned batch, within the ITL objective
   (--local-prefill-max-tokens): below it, a handoff buys nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.config.roles import Role
from libs.planner.capacity import Capacity, Engine, Shape, capacity, decode_batch
from libs.planner.sim.run import SimOptions, SimResult, simulate
from libs.planner.slo import Slo, attainment
from libs.planner.state import Counts
from libs.planner.workload import Workload


@dataclass(frozen=True)
class Trial:
    """One simulated fleet at the workload's rate."""

    fleet: Counts
    attainment: float
    ttft_attainment: float
    itl_attainment: float
    busy: dict[Role, float]  # mean fraction of its workers' time each role's engines stepped

    def meets(self, slo: Slo) -> bool:
        return self.attainment >= slo.attainment


@dataclass(frozen=True)
class Recommendation:
    workload: str
    slo: Slo
    capacity: Capacity
    model_disaggregated: Counts
    model_colocated: Counts
    disaggregated: Counts
    colocated: Counts
    choice: Counts
    local_prefill_max_tokens: int
    trials: tuple[Trial, ...] = field(default=())

    @property
    def disaggregate(self) -> bool:
        return self.choice.disaggregated


def model_counts(rate: float, caps: Capacity, utilization: float) -> tuple[Counts, Counts]:
    """(XpYd, Npd) from the capacity model alone."""

    def need(per_worker: float) -> int:
        return max(1, math.ceil(rate / (per_worker * utilization) - 1e-9)) if per_worker > 0 else 10**6

    return Counts(prefill=need(caps.prefill), decode=need(caps.decode)), Counts(
        colocated=need(caps.colocated)
    )


def local_prefill_threshold(engine: Engine, shape: Shape, slo: Slo) -> int:
    """The longest prompt whose computation fits in one decode step at the planned batch
    without the step exceeding the ITL objective (0: none does)."""
    c = engine.coefficients
    batch = decode_batch(engine, shape, slo)
    step = c.base_s + (c.per_seq_s + c.per_context_token_s * shape.context) * batch + c.per_seq_s
    slack = slo.itl_s - step
    if slack <= 0 or c.per_prefill_token_s <= 0:
        return 0
    # p*L + a*L^2/2 <= slack
    a, p = c.per_prefill_attention_s / 2, c.per_prefill_token_s
    length = slack / p if a == 0 else (-p + math.sqrt(p * p + 4 * a * slack)) / (2 * a)
    return int(min(length, engine.max_num_batched_tokens))


Simulate = Callable[[Counts], SimResult]


def trial(fleet: Counts, run: Simulate, slo: Slo, duration_s: float) -> Trial:
    result = run(fleet)
    outcomes = result.outcomes
    ttft_ok = sum(o.ok and o.ttft_s is not None and o.ttft_s <= slo.ttft_s for o in outcomes)
    itl_ok = sum(o.ok and o.itl(slo.itl_stat) <= slo.itl_s for o in outcomes)
    n = max(len(outcomes), 1)
    busy = {
        role: result.busy_s.get(role, 0.0) / (fleet.get(role) * max(result.end_s, duration_s))
        for role in Role
        if fleet.get(role)
    }
    return Trial(fleet, attainment(outcomes, slo), ttft_ok / n, itl_ok / n, busy)


def refine(start: Counts, run: Simulate, slo: Slo, duration_s: float, limit: int, log: list[Trial]) -> Counts:
    """From the model's fleet to the smallest nearby one the simulation says meets the
    objectives (up while missing, then down role by role while met)."""
    cache: dict[Counts, Trial] = {}

    def check(fleet: Counts) -> Trial:
        if fleet not in cache:
            cache[fleet] = trial(fleet, run, slo, duration_s)
            log.append(cache[fleet])
        return cache[fleet]

    roles = [Role.BOTH] if start.colocated else [Role.PREFILL, Role.DECODE]
    fleet = start
    result = check(fleet)
    while not result.meets(slo) and fleet.total < limit:
        if fleet.colocated:
            role = Role.BOTH
        elif result.itl_attainment < slo.attainment:
            role = Role.DECODE
        else:
            role = max((Role.PREFILL, Role.DECODE), key=lambda r: result.busy.get(r, 0.0))
        fleet = fleet.with_role(role, fleet.get(role) + 1)
        result = check(fleet)
    if not result.meets(slo):
        return fleet  # the limit: reported as not meeting
    shrunk = True
    while shrunk:
        shrunk = False
        for role in roles:
            if fleet.get(role) <= 1:
                continue
            smaller = fleet.with_role(role, fleet.get(role) - 1)
            if check(smaller).meets(slo):
                fleet, shrunk = smaller, True
    return fleet


def recommend(
    workload: Workload,
    profile: str,
    slo: Slo,
    *,
    cores: int | None = None,
    utilization: float = 0.85,
    verify: bool = True,
    duration_s: float = 120.0,
    warmup_s: float = 20.0,
    seed: int = 0,
    limit: int = 32,
    engine_overrides: dict[str, object] | None = None,
) -> Recommendation:
    overrides = dict(engine_overrides or {})
    engine = Engine.from_profile(profile, cores, **overrides)
    shape = Shape.of(workload.isl, workload.osl)
    caps = capacity(engine, shape, slo)
    rate = workload.rate.peak
    model_disagg, model_coloc = model_counts(rate, caps, utilization)
    threshold = local_prefill_threshold(engine, shape, slo)
    trials: list[Trial] = []
    disagg, coloc = model_disagg, model_coloc
    if verify:
        options = SimOptions(profile, duration_s=duration_s, warmup_s=warmup_s, seed=seed, engine=overrides)

        def run(fleet: Counts) -> SimResult:
            return simulate(fleet, workload, options)

        disagg = refine(model_disagg, run, slo, duration_s, limit, trials)
        coloc = refine(model_coloc, run, slo, duration_s, limit, trials)
    met = {t.fleet for t in trials if t.meets(slo)}
    disagg_ok = not verify or disagg in met
    coloc_ok = not verify or coloc in met
    # A tie is pd: one kind of worker, no KV transfer.
    choice = disagg if disagg_ok and (not coloc_ok or disagg.total < coloc.total) else coloc
    return Recommendation(
        workload.describe(),
        slo,
        caps,
        model_disagg,
        model_coloc,
        disagg,
        coloc,
        choice,
        threshold,
        tuple(trials),
    )
