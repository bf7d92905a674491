"""The gateway as the simulation sees it: admission (an in-flight bound per worker, FIFO
queues), least-load routing, and a request's route through the workers.

As libs/gateway does (serving/route.py, fleet/admission.py, fleet/routing/least_load.py):
- colocated workers present: the request goes to one of them (`colocated`);
- otherwise a decode slot is taken first and held through the prefill, then a prefill slot;
  the prefill worker computes the prompt with max_tokens 1 and keeps its KV under a lease;
  the decode worker pulls it, computes the last prompt token and streams every token the
  client sees (`remote_prefill`); with `local_prefill_max_tokens` (conditional
  disaggregation's threshold rule), a prompt that short is computed on the decode worker
  (`local_prefill`);
- each worker takes at most twice its max_num_seqs of requests; the rest wait, per role,
  first come first served; a worker is picked by fewest (admitted + engine-waiting), then
  fewest running, then KV usage.
What it leaves out: RPC and HTTP time (the live run measures what they add), the kvstore,
breakers and migration (no faults are simulated).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.config.roles import Role
from libs.mockengine.protocol import AddRequest, EngineCoreOutput, SamplingSpec
from libs.planner.sim.events import EventLoop
from libs.planner.sim.worker import SimWorker, State
from libs.planner.slo import Outcome, outcome_of

INFLIGHT_PER_SEQ = 2  # admission's default bound: twice the worker's max_num_seqs


@dataclass(eq=False)
class Flight:
    """One client request in the simulated gateway."""

    request_id: str
    arrival_s: float
    prompt: list[int]
    osl: int
    token_times: list[float] = field(default_factory=list)
    route: str = ""
    decode: SimWorker | None = None
    prefill: SimWorker | None = None

    @property
    def isl(self) -> int:
        return len(self.prompt)


Grant = Callable[[SimWorker], None]


class SimGateway:
    def __init__(
        self,
        loop: EventLoop,
        on_finish: Callable[[Flight, Outcome], None],
        *,
        local_prefill_max_tokens: int = 0,
    ) -> None:
        self.loop = loop
        self.on_finish = on_finish
        self.local_prefill_max_tokens = local_prefill_max_tokens
        self.workers: list[SimWorker] = []
        self.engines: dict[str, SimWorker] = {}  # shared with every worker as its peers
        self.queues: dict[Role, deque[Grant]] = {role: deque() for role in Role}
        self._flights: dict[str, Flight] = {}
        self.on_worker_idle: Callable[[SimWorker], None] = lambda _worker: None

    # -- the fleet ----------------------------------------------------------------------------
    def attach(self, worker: SimWorker) -> None:
        self.workers.append(worker)
        self.engines[worker.engine_id] = worker
        worker.peers = self.engines
        worker.on_settled = self._maybe_idle

    def ready(self, worker: SimWorker) -> None:
        worker.state = State.READY
        worker.ready_at = self.loop.now
        self._dispatch(worker.role)

    def retire(self, worker: SimWorker) -> None:
        """No new request goes to it; those on it finish (then on_worker_idle)."""
        worker.state = State.RETIRING
        self._maybe_idle(worker)

    def routable(self, role: Role) -> list[SimWorker]:
        return [w for w in self.workers if w.role is role and w.state is State.READY]

    def present(self, role: Role) -> list[SimWorker]:
        """Workers of `role` that are or will be routable (starting or ready)."""
        return [w for w in self.workers if w.role is role and w.state in (State.STARTING, State.READY)]

    @property
    def queue_depth(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    # -- admission ------------------------------------------------------------------------------
    def _admit(self, role: Role, grant: Grant) -> None:
        worker = None if self.queues[role] else self._try(role)
        if worker is None:
            self.queues[role].append(grant)
        else:
            grant(worker)

    def _try(self, role: Role) -> SimWorker | None:
        candidates = [w for w in self.routable(role) if w.admitted < INFLIGHT_PER_SEQ * w.max_num_seqs]
        if not candidates:
            return None
        worker = min(
            candidates, key=lambda w: (w.admitted + w.num_waiting, w.num_running, w.kv_usage, w.name)
        )
        worker.admitted += 1
        return worker

    def _release(self, worker: SimWorker) -> None:
        worker.admitted -= 1
        self._dispatch(worker.role)
        self._maybe_idle(worker)

    def _dispatch(self, role: Role) -> None:
        queue = self.queues[role]
        while queue:
            worker = self._try(role)
            if worker is None:
                return
            queue.popleft()(worker)

    def _maybe_idle(self, worker: SimWorker) -> None:
        if (
            worker.state is State.RETIRING
            and worker.admitted == 0
            and not worker.sim.has_work
            and not worker.holds_leases
        ):
            worker.state = State.GONE
            worker.gone_at = self.loop.now
            self.on_worker_idle(worker)

    # -- a request's route --------------------------------------------------------------------
    def submit(self, flight: Flight) -> None:
        self._flights[flight.request_id] = flight
        if self.present(Role.BOTH):
            flight.route = "colocated"
            self._admit(Role.BOTH, lambda worker: self._generate(flight, worker, None))
        else:
            self._admit(Role.DECODE, lambda worker: self._decode_admitted(flight, worker))

    def _decode_admitted(self, flight: Flight, decode: SimWorker) -> None:
        flight.decode = decode
        if flight.isl <= self.local_prefill_max_tokens:
            flight.route = "local_prefill"
            self._generate(flight, decode, None)
            return
        flight.route = "remote_prefill"
        self._admit(Role.PREFILL, lambda prefill: self._prefill(flight, prefill))

    def _prefill(self, flight: Flight, prefill: SimWorker) -> None:
        flight.prefill = prefill
        sampling = SamplingSpec(max_tokens=1, temperature=0.0, ignore_eos=True)
        prefill.add(
            AddRequest(
                flight.request_id, flight.prompt, sampling, kv_transfer_params={"do_remote_decode": True}
            )
        )

    def _generate(self, flight: Flight, worker: SimWorker, params: dict[str, object] | None) -> None:
        flight.decode = worker
        sampling = SamplingSpec(max_tokens=flight.osl, temperature=0.0, ignore_eos=True)
        worker.add(AddRequest(flight.request_id, flight.prompt, sampling, kv_transfer_params=params))

    def on_outputs(self, worker: SimWorker, outputs: list[EngineCoreOutput]) -> None:
        """A worker's step outputs, at the step's end (`loop.now`)."""
        for output in outputs:
            flight = self._flights.get(output.request_id)
            if flight is None:
                continue
            if worker.role is Role.PREFILL:
                if output.finish_reason is not None:
                    self._prefilled(flight, worker, output)
                continue
            flight.token_times.extend([self.loop.now] * len(output.new_token_ids))
            if output.finish_reason is not None:
                self._finish(flight, worker, ok=output.finish_reason in ("length", "stop"))

    def _prefilled(self, flight: Flight, prefill: SimWorker, output: EngineCoreOutput) -> None:
        self._release(prefill)
        decode = flight.decode
        assert decode is not None
        if output.finish_reason not in ("length", "stop"):
            self._finish(flight, decode, ok=False)
            return
        # No descriptor (the first token ended it): the decode worker computes the prompt.
        self._generate(flight, decode, output.kv_transfer_params)

    def _finish(self, flight: Flight, worker: SimWorker, *, ok: bool) -> None:
        self._flights.pop(flight.request_id, None)
        self._release(worker)
        self.on_finish(flight, outcome_of(flight.arrival_s, flight.token_times, ok=ok))

    @property
    def in_flight(self) -> int:
        return len(self._flights)
