"""One simulated worker: the mock engine's own Simulator (libs/mockengine/simulator.py: vLLM's
scheduler, blocks, prefix cache, handoff leases) stepped on the simulation's clock instead of
the engine-core process's sleeps.

What the core process does (libs/mockengine/core.py) and this keeps: a step's outputs are
delivered when it ends; requests added meanwhile wait for the next step; a decode step that
admits a handed-over prompt starts its KV pull at once, which takes the profile's transfer
time, after which the prompt's last token is computed (vLLM's recompute for logits). What it
leaves out: the side channel's round trip (loopback, well under a step), injected faults.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from libs.config.roles import Role
from libs.mockengine.config import CoreConfig, ResolvedConfig, resolve
from libs.mockengine.leases import LeaseTable
from libs.mockengine.protocol import AddRequest, EngineCoreOutput
from libs.mockengine.request import SimRequest
from libs.mockengine.simulator import PullOrder, Simulator
from libs.mockengine.timing import StepTimeModel
from libs.mockengine.tokens import MASK64, sampling_key, splitmix64
from libs.planner.sim.events import EventLoop


class FastSimulator(Simulator):
    """The mock's Simulator, but a request's token context is seeded from its id instead of
    hashed over its whole prompt: output token values only matter for equality checks, which
    the simulation does not make, and hashing a 2,000-token prompt in Python took half of its
    time. Everything the scheduler and the step time see is unchanged. (Simulator.add with
    that one line changed; n = 1 and greedy sampling, as the simulation sends.)"""

    def add(self, add: AddRequest) -> None:
        if add.request_id in self._sequences or add.sampling.n != 1:
            raise ValueError(f"request {add.request_id!r}: a duplicate id, or n != 1")
        self._arrivals += 1
        sequence = SimRequest(
            request_id=add.request_id,
            index=0,
            prompt_token_ids=list(add.prompt_token_ids),
            sampling=add.sampling,
            sampling_key=sampling_key(temperature=0.0, seed=0, index=0),
            context_hash=splitmix64(hash(add.request_id) & MASK64),
            kv_transfer_params=add.kv_transfer_params,
            arrival=self._arrivals,
        )
        self._sequences[add.request_id] = [sequence]
        self.scheduler.add(sequence)


class State(enum.Enum):
    STARTING = "starting"  # asked for, loading: not routable, counted in worker-seconds
    READY = "ready"
    RETIRING = "retiring"  # no new requests; finishing its own
    GONE = "gone"


OutputHandler = Callable[["SimWorker", list[EngineCoreOutput]], None]


class SimWorker:
    def __init__(
        self,
        loop: EventLoop,
        name: str,
        role: Role,
        resolved: ResolvedConfig,
        on_outputs: OutputHandler,
        *,
        cores: int | None = None,
    ) -> None:
        self.loop = loop
        self.name = name
        self.role = role
        self.resolved = resolved
        self.on_outputs = on_outputs
        self.timing = StepTimeModel(resolved.profile.coefficients_for(cores), 1.0)
        # Only a prefill engine hands over KV (its side channel named in each descriptor).
        self.sim = FastSimulator(resolved, side_channel=("sim", 0) if role is Role.PREFILL else None)
        self.sim.leases = LeaseTable(self.sim.pool, resolved.config.kv_lease_s, clock=lambda: loop.now)
        self.engine_id = resolved.config.engine_id
        self.state = State.STARTING
        self.admitted = 0  # the gateway's requests on it (admission's in-flight count)
        self.started_at = loop.now
        self.ready_at: float | None = None
        self.gone_at: float | None = None
        self.busy_s = 0.0
        self._stepping = False
        # Decode side: where a pulled prompt's blocks live (engine id -> worker).
        self.peers: dict[str, SimWorker] = {}
        # Called when its work or leases may have ended (the gateway retires it then).
        self.on_settled: Callable[[SimWorker], None] = lambda _worker: None

    @property
    def max_num_seqs(self) -> int:
        return self.resolved.max_num_seqs

    @property
    def num_waiting(self) -> int:
        return len(self.sim.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.sim.scheduler.running)

    @property
    def kv_usage(self) -> float:
        return self.sim.pool.usage

    @property
    def idle(self) -> bool:
        return not self._stepping and not self.sim.has_work and self.admitted == 0

    def add(self, request: AddRequest) -> None:
        self.sim.add(request)
        self._kick()

    def abort(self, request_id: str) -> None:
        self.on_outputs(self, self.sim.abort([request_id]))
        self._kick()

    def _kick(self) -> None:
        if not self._stepping and self.state is not State.GONE:
            self._step()

    def _step(self) -> None:
        self.sim.leases.expire()
        step = self.sim.step()
        if not step.shape.num_seqs and not step.pulls and not step.outputs:
            self._stepping = False
            return
        self._stepping = True
        duration = self.timing.seconds(step.shape)
        self.busy_s += duration
        for order in step.pulls:
            self._start_pull(order)
        self.loop.after(duration, lambda: self._step_done(step.outputs))

    def _step_done(self, outputs: list[EngineCoreOutput]) -> None:
        # Delivered while still "stepping": what the gateway adds in reply waits for the
        # next step, as the core process drains its inbox between steps.
        if outputs:
            self.on_outputs(self, outputs)
        self._stepping = False
        self._kick()

    def _start_pull(self, order: PullOrder) -> None:
        seconds = self.resolved.profile.kv_transfer.seconds(order.num_bytes)
        self.loop.after(seconds, lambda: self._pulled(order, seconds))

    def _pulled(self, order: PullOrder, seconds: float) -> None:
        source = self.peers.get(str(order.params.get("remote_engine_id")))
        why_not = None
        if source is not None:
            why_not = source.sim.leases.end(str(order.params.get("remote_request_id")), "pulled")
        if source is not None:
            source.on_settled(source)
        if source is None or why_not is not None:
            failed = self.sim.pull_failed(order, f"no KV to pull: {why_not or 'unknown engine'}")
            if failed is not None:
                self.on_outputs(self, [failed])
        else:
            self.sim.pull_succeeded(order, seconds)
        self._kick()

    @property
    def holds_leases(self) -> bool:
        """Prefill side: handed-over KV not pulled yet (its worker must not stop before)."""
        return len(self.sim.leases) > 0


def resolve_worker(profile: str, engine_id: str, **overrides: Any) -> ResolvedConfig:
    """A mock engine's config from its profile (overrides: CoreConfig fields, e.g.
    max_num_batched_tokens)."""
    return resolve(CoreConfig(profile=profile, engine_id=engine_id, **overrides))
