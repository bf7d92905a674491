"""A discrete-event simulation of a fleet serving a workload, in simulated seconds.

Each worker is the mock engine's Simulator on the simulation's clock (worker.py), the gateway
is gateway.py, arrivals are Poisson at the workload's (piecewise-constant) rate with prompt
and output lengths drawn from its distributions, and every request runs to its output
length (ignore_eos), as tools/bench's runs do. A controller (the planner's policy) may be
ticked every `interval_s` to change the fleet; workers it adds become routable after the
start-up time, and workers it removes are retired first and gone once their requests (and
handed-over KV) are done.

Only requests arriving in [warmup_s, duration_s) are measured; the run goes on until they
have all finished, or `drain_limit_s` more, after which an unfinished one counts as failed.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from libs.config.roles import Role
from libs.planner.sim.events import EventLoop
from libs.planner.sim.gateway import Flight, SimGateway
from libs.planner.sim.observer import WindowObserver
from libs.planner.sim.worker import SimWorker, State, resolve_worker
from libs.planner.slo import Outcome
from libs.planner.state import Counts, Observation
from libs.planner.workload import RateTrace, Workload


class Controller(Protocol):
    @property
    def interval_s(self) -> float: ...

    @property
    def quantile(self) -> float:  # of TTFT and ITL in its observations
        ...

    def decide(self, observation: Observation, current: Counts) -> Counts: ...


@dataclass(frozen=True)
class SimOptions:
    profile: str
    duration_s: float
    warmup_s: float = 0.0
    drain_limit_s: float = 300.0
    seed: int = 0
    local_prefill_max_tokens: int = 0  # conditional disaggregation's threshold rule; 0: off
    startup_s: float | None = None  # workers added by a controller; None: the profile's
    engine: dict[str, Any] = field(default_factory=dict)  # CoreConfig overrides (max_num_seqs...)
    arrivals: tuple[float, ...] | None = None  # exact arrival times instead of the Poisson process
    # Closed loop instead (tools/bench's --concurrency without a rate): this many requests in
    # flight, each finished one replaced at once, `num_requests` in all (the rate is unused).
    concurrency: int | None = None
    num_requests: int | None = None


@dataclass(frozen=True)
class TimelinePoint:
    t: float
    ready: Counts
    starting: Counts
    retiring: Counts
    target: Counts | None = None
    arrival_rate: float | None = None


@dataclass
class SimResult:
    fleet: str
    outcomes: list[Outcome]  # the measured requests
    worker_seconds: float  # every worker, from being asked for until gone (or the end)
    end_s: float
    timeline: list[TimelinePoint] = field(default_factory=list)
    busy_s: dict[Role, float] = field(default_factory=dict)
    unfinished: int = 0

    @property
    def worker_minutes(self) -> float:
        return self.worker_seconds / 60.0


def poisson_arrivals(trace: RateTrace, end_s: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process whose rate follows `trace`, up to `end_s` (exact for
    a piecewise-constant rate: the exponential gap is redrawn at each change)."""
    t = 0.0
    while t < end_s:
        rate = trace.rate_at(t)
        change = trace.next_change(t)
        limit = min(end_s, change) if change is not None else end_s
        if rate <= 0:
            t = limit
            continue
        gap = rng.expovariate(rate)
        if t + gap >= limit:
            t = limit
            continue
        t += gap
        yield t


class SimFleet:
    """The simulation's connector: adds and removes workers as a controller asks."""

    def __init__(self, loop: EventLoop, gateway: SimGateway, options: SimOptions) -> None:
        self.loop = loop
        self.gateway = gateway
        self.options = options
        self._serial = 0
        probe = resolve_worker(options.profile, "probe", **options.engine)
        self.startup_s = probe.startup_s if options.startup_s is None else options.startup_s

    def start(self, role: Role, *, ready_now: bool = False) -> SimWorker:
        self._serial += 1
        name = f"{role.value}-{self._serial}"
        resolved = resolve_worker(self.options.profile, f"sim-{name}", **self.options.engine)
        worker = SimWorker(self.loop, name, role, resolved, self.gateway.on_outputs)
        self.gateway.attach(worker)
        if ready_now:
            self.gateway.ready(worker)
        else:
            self.loop.after(self.startup_s, lambda: self._ready(worker))
        return worker

    def _ready(self, worker: SimWorker) -> None:
        if worker.state is State.STARTING:
            self.gateway.ready(worker)

    def counts(self) -> Counts:
        return Counts.of({role: len(self.gateway.present(role)) for role in Role})

    def scale_to(self, target: Counts) -> None:
        for role in Role:
            present = self.gateway.present(role)
            wanted = target.get(role)
            for _ in range(wanted - len(present)):
                self.start(role)
            # Fewer: a starting worker is dropped first (never served), then the least loaded.
            for worker in sorted(present, key=_removal_order)[: max(len(present) - wanted, 0)]:
                if worker.state is State.STARTING:
                    worker.state = State.GONE
                    worker.gone_at = self.loop.now
                else:
                    self.gateway.retire(worker)

    def state_counts(self, state: State) -> Counts:
        return Counts.of(
            {role: sum(w.role is role and w.state is state for w in self.gateway.workers) for role in Role}
        )


def _removal_order(worker: SimWorker) -> tuple[int, int, int]:
    return (
        0 if worker.state is State.STARTING else 1,
        worker.admitted + worker.num_waiting,
        worker.num_running,
    )


def simulate(
    fleet: Counts,
    workload: Workload,
    options: SimOptions,
    controller: Controller | None = None,
    on_tick: Callable[[TimelinePoint], None] | None = None,
) -> SimResult:
    loop = EventLoop()
    rng = random.Random(options.seed)
    tokens = np.random.default_rng(options.seed)
    measured: list[Flight] = []
    pending: set[str] = set()  # measured and not finished
    outcomes: dict[str, Outcome] = {}
    observer: WindowObserver | None = None

    closed_loop = {"sent": 0}

    def finished(flight: Flight, outcome: Outcome) -> None:
        outcomes[flight.request_id] = outcome
        pending.discard(flight.request_id)
        if observer is not None:
            observer.finished(flight)
        if options.concurrency is not None and closed_loop["sent"] < (options.num_requests or 0):
            send_next()

    gateway = SimGateway(loop, finished, local_prefill_max_tokens=options.local_prefill_max_tokens)
    sim_fleet = SimFleet(loop, gateway, options)
    for role in Role:
        for _ in range(fleet.get(role)):
            sim_fleet.start(role, ready_now=True)
    vocab = gateway.workers[0].resolved.profile.model.vocab_size if gateway.workers else 32000
    timeline: list[TimelinePoint] = []

    def snapshot(target: Counts | None = None, rate: float | None = None) -> TimelinePoint:
        point = TimelinePoint(
            loop.now,
            sim_fleet.state_counts(State.READY),
            sim_fleet.state_counts(State.STARTING),
            sim_fleet.state_counts(State.RETIRING),
            target,
            rate,
        )
        timeline.append(point)
        if on_tick is not None:
            on_tick(point)
        return point

    def arrive(index: int, when: float) -> None:
        flight = Flight(
            f"req-{index}",
            when,
            tokens.integers(0, vocab, size=workload.isl.sample(rng)).tolist(),
            workload.osl.sample(rng),
        )
        if options.warmup_s <= when < options.duration_s:
            measured.append(flight)
            pending.add(flight.request_id)
        if observer is not None:
            observer.arrived(flight)
        gateway.submit(flight)

    def send_next() -> None:
        index = closed_loop["sent"]
        closed_loop["sent"] += 1
        loop.after(0.0, lambda: arrive(index, loop.now))

    if options.concurrency is not None:
        for _ in range(min(options.concurrency, options.num_requests or 0)):
            send_next()
    else:
        times = (
            options.arrivals
            if options.arrivals is not None
            else poisson_arrivals(workload.rate, options.duration_s, rng)
        )
        for index, when in enumerate(times):
            loop.at(when, functools.partial(arrive, index, when))

    if controller is not None:
        observer = WindowObserver(gateway, controller.quantile)

        def tick() -> None:
            assert observer is not None and controller is not None
            observation = observer.take(loop.now)
            target = controller.decide(observation, sim_fleet.counts())
            sim_fleet.scale_to(target)
            snapshot(target, observation.arrival_rate)
            if loop.now + controller.interval_s < options.duration_s:
                loop.after(controller.interval_s, tick)

        loop.after(controller.interval_s, tick)
    snapshot()

    loop.run_until(options.duration_s)
    if pending:
        loop.run_until(options.duration_s + options.drain_limit_s, stop=lambda: not pending)
    end = loop.now
    snapshot()
    results = []
    unfinished = 0
    for flight in measured:
        outcome = outcomes.get(flight.request_id)
        if outcome is None:
            unfinished += 1
            outcome = Outcome(flight.arrival_s, None, math.inf, math.inf, len(flight.token_times), ok=False)
        results.append(outcome)
    worker_seconds = sum(
        (w.gone_at if w.gone_at is not None else end) - w.started_at for w in gateway.workers
    )
    busy = {role: sum(w.busy_s for w in gateway.workers if w.role is role) for role in Role}
    return SimResult(fleet.name, results, worker_seconds, end, timeline, busy, unfinished)
