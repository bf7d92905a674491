"""The mock's engine core: a process of its own that runs the simulation loop, as vLLM's
EngineCore does, so the worker shell's CPU can be measured apart from the simulator's.

The loop: take what the client sent (add, abort, release, stats, shutdown), run one step
while any sequence can make progress, sleep until the step's simulated duration has passed
since it began, then send the step's outputs as one message. With a zero-time profile it
only yields to the event loop between steps. Idle, it waits for input, a finished KV pull or
the next lease expiry. KV pulls (decode side) and the side channel (prefill side) run as
tasks on the same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from typing import Any, NoReturn

import msgspec
import zmq
import zmq.asyncio

from libs.mockengine import side_channel
from libs.mockengine.config import NO_SIDE_CHANNEL, ResolvedConfig
from libs.mockengine.faults import FaultPlan
from libs.mockengine.protocol import (
    AbortRequests,
    AddRequest,
    CoreFailed,
    CoreRequest,
    EngineCoreOutput,
    EngineCoreOutputs,
    GetStats,
    Ready,
    ReleaseHandoff,
    ResetPrefixCache,
    Shutdown,
    UtilityResult,
    request_decoder,
)
from libs.mockengine.simulator import PullOrder, Simulator
from libs.mockengine.timing import StepTimeModel

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0  # an idle core looks at its leases at least this often
# Back-to-back steps run on one timeline (each starts when the previous one was due to end,
# so the loop's own work and sleep overshoot do not stretch the simulated clock), unless the
# core fell further behind than this (an overloaded machine): then it restarts from now
# rather than burst to catch up.
MAX_LAG_S = 0.02


class EngineCore:
    def __init__(self, resolved: ResolvedConfig, input_address: str, output_address: str) -> None:
        self.resolved = resolved
        self.config = resolved.config
        self.timing = StepTimeModel(
            resolved.profile.coefficients_for(self.config.cores), self.config.time_scale
        )
        self.faults = FaultPlan.parse(self.config.faults)
        self._input_address = input_address
        self._output_address = output_address
        self._encoder = msgspec.msgpack.Encoder()
        self._inbox: deque[CoreRequest] = deque()
        self._pending: list[EngineCoreOutput] = []
        self._wake = asyncio.Event()
        self._stats_changed = False
        self._stopping = False
        self._steps = 0
        self._busy_s = 0.0
        self._step_deadline: float | None = None  # when the last step was due to end
        self._tasks: set[asyncio.Task[None]] = set()
        self.sim: Simulator

    async def run(self) -> None:
        context = self._context = zmq.asyncio.Context()
        self._input = context.socket(zmq.PULL)
        self._input.connect(self._input_address)
        self._output = context.socket(zmq.PUSH)
        self._output.connect(self._output_address)
        try:
            await self._start()
            await self._loop()
        except Exception as error:
            log.exception("mock engine core failed")
            await self._send(CoreFailed(message=f"{type(error).__name__}: {error}"))
            raise
        finally:
            self._output.close(linger=1000)
            self._input.close(linger=0)
            context.term()

    async def _start(self) -> None:
        channel = None
        if self.config.side_channel_port != NO_SIDE_CHANNEL:
            server = await side_channel.serve(
                self.config.side_channel_host, self.config.side_channel_port, self._on_side_request
            )
            port = server.sockets[0].getsockname()[1]
            channel = (self.config.side_channel_host, port)
        self.sim = Simulator(self.resolved, side_channel=channel)
        self._spawn(self._read_inputs())
        await asyncio.sleep(self.timing.scaled(self.resolved.startup_s))
        await self._send(
            Ready(
                num_kv_blocks=self.resolved.num_kv_blocks,
                engine_id=self.config.engine_id,
                side_channel_host=channel[0] if channel else "",
                side_channel_port=channel[1] if channel else 0,
                pid=os.getpid(),
            )
        )

    async def _loop(self) -> None:
        while True:
            self._drain_inbox()
            if self._stopping:
                return
            if self.sim.leases.expire():
                self._stats_changed = True
            if self.sim.has_work and await self._step():
                continue
            if self._pending or self._stats_changed:
                await self._send_outputs(step=-1, duration=0.0)
                continue
            await self._idle()

    async def _step(self) -> bool:
        """One engine step; False when nothing could be scheduled (all blocked)."""
        now = time.monotonic()
        previous = self._step_deadline
        started = previous if previous is not None and now - previous <= MAX_LAG_S else now
        step = self.sim.step()
        if not step.shape.num_seqs and not step.pulls and not step.outputs:
            self._step_deadline = None
            return False
        self._steps += 1
        if self.faults.crashes_at(self._steps):
            self._crash()
        duration = self.timing.seconds(step.shape)
        self._busy_s += duration
        duration += self.faults.stall_seconds(self._steps)
        for order in step.pulls:
            self._spawn(self._pull(order))
        self._step_deadline = started + duration
        remaining = self._step_deadline - time.monotonic()
        await asyncio.sleep(remaining if remaining > 0 else 0)
        self._pending.extend(step.outputs)
        await self._send_outputs(step=self._steps, duration=duration, kv_events=step.kv_events)
        return True

    def _crash(self) -> NoReturn:
        """The injected crash: the process dies after the outputs of every earlier step have left
        it, so that a test knows which steps a client got. (os._exit right after a send drops
        what ZMQ's I/O thread has not written yet.)"""
        log.warning("mock fault: crashing at step %d", self._steps)
        self._output.close(linger=1000)
        self._input.close(linger=0)
        self._context.term()
        os._exit(1)

    async def _idle(self) -> None:
        self._step_deadline = None  # the next busy period starts on its own timeline
        timeout = IDLE_WAKE_S
        expiry = self.sim.leases.next_expiry()
        if expiry is not None:
            timeout = min(timeout, max(expiry - time.monotonic(), 0.0) + 0.001)
        self._wake.clear()
        if self._inbox:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _drain_inbox(self) -> None:
        while self._inbox:
            message = self._inbox.popleft()
            if isinstance(message, AddRequest):
                try:
                    self.sim.add(message)
                except ValueError as error:
                    self._pending.append(
                        EngineCoreOutput(
                            request_id=message.request_id, finish_reason="error", error=str(error)
                        )
                    )
            elif isinstance(message, AbortRequests):
                self._pending.extend(self.sim.abort(message.request_ids))
            elif isinstance(message, ReleaseHandoff):
                self._spawn(self._release(message.kv_transfer_params))
            elif isinstance(message, GetStats):
                self._spawn(self._send(UtilityResult(call_id=message.call_id, stats=self._stats())))
            elif isinstance(message, ResetPrefixCache):
                ok = self.sim.pool.reset_prefix_cache()
                self._stats_changed = True
                self._spawn(self._send(UtilityResult(call_id=message.call_id, ok=ok)))
            elif isinstance(message, Shutdown):
                self._stopping = True

    async def _read_inputs(self) -> None:
        decoder = request_decoder()
        while True:
            frame = await self._input.recv()
            self._inbox.append(decoder.decode(frame))
            self._wake.set()

    # -- KV handoff ----------------------------------------------------------------------------
    async def _pull(self, order: PullOrder) -> None:
        """Decode side: ask the prefill engine for the KV, then wait the transfer time."""
        started = time.monotonic()
        params = order.params
        try:
            if self.faults.take_pull_refusal():
                raise side_channel.SideChannelError("refused by fault injection (refuse-pulls)")
            host, port, request = _pull_target(params)
            await side_channel.ask(host, port, request, timeout_s=self.config.pull_timeout_s)
            transfer = self.resolved.profile.kv_transfer.seconds(order.num_bytes)
            await asyncio.sleep(self.timing.scaled(transfer))
            self.sim.pull_succeeded(order, time.monotonic() - started)
        except side_channel.SideChannelError as error:
            failed = self.sim.pull_failed(order, str(error))
            if failed is not None:
                self._pending.append(failed)
        self._stats_changed = True
        self._wake.set()

    async def _release(self, params: dict[str, Any]) -> None:
        """Decode side: tell the prefill engine its KV will not be pulled (fire and forget,
        as vLLM's notification)."""
        try:
            host, port, pull = _pull_target(params)
            release = side_channel.ReleaseKv(engine_id=pull.engine_id, request_id=pull.request_id)
            await side_channel.ask(host, port, release, timeout_s=self.config.pull_timeout_s)
        except side_channel.SideChannelError as error:
            log.info("mock KV release not delivered: %s", error)

    def _on_side_request(self, request: side_channel.SideRequest) -> side_channel.SideReply:
        """Prefill side: a decode engine pulls or releases a handed-over prompt."""
        if request.engine_id != self.config.engine_id:
            return side_channel.SideReply(
                False, f"engine id {request.engine_id!r} is not {self.config.engine_id!r}"
            )
        pulling = isinstance(request, side_channel.PullKv)
        if pulling and self.faults.take_pull_refusal():
            return side_channel.SideReply(False, "refused by fault injection (refuse-pulls)")
        why_not = self.sim.leases.end(request.request_id, "pulled" if pulling else "released")
        self._stats_changed = True
        self._wake.set()
        if why_not is not None:
            return side_channel.SideReply(False, f"no KV held for request {request.request_id!r}: {why_not}")
        return side_channel.SideReply(True)

    # -- output ------------------------------------------------------------------------------------
    def _stats(self) -> Any:
        return self.sim.stats(steps=self._steps, busy_s=self._busy_s)

    async def _send_outputs(self, *, step: int, duration: float, kv_events: list[Any] | None = None) -> None:
        outputs, self._pending = self._pending, []
        events = (kv_events or []) + self.sim.take_kv_events()
        self._stats_changed = False
        await self._send(
            EngineCoreOutputs(
                step=step,
                timestamp=time.time(),
                outputs=outputs,
                kv_events=events,
                stats=self._stats(),
                step_duration_s=duration,
            )
        )

    async def _send(self, message: msgspec.Struct) -> None:
        await self._output.send(self._encoder.encode(message), copy=False)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _pull_target(params: dict[str, Any]) -> tuple[str, int, side_channel.PullKv]:
    try:
        host, port = str(params["remote_host"]), int(params["remote_port"])
        request = side_channel.PullKv(
            engine_id=str(params["remote_engine_id"]), request_id=str(params["remote_request_id"])
        )
    except (KeyError, TypeError, ValueError) as error:
        raise side_channel.SideChannelError(f"the handoff descriptor lacks {error}") from None
    return host, port, request
