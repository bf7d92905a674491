"""The client side of a mock engine core (vLLM's AsyncMPClient, in miniature): starts the core
process, sends it requests, and reads its messages with one asyncio task.

It offers the step-level API: add_request / abort / release_handoff, `get_output()` for each
step's outputs in order, `get_stats()` and `reset_prefix_cache()` as calls answered by the
core, `dead` once the core process is gone (its outputs end with CoreDied), and shutdown.
Demultiplexing outputs into per-request streams is the adapter's job (engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from libs.mockengine.config import CoreConfig
from libs.mockengine.protocol import (
    AbortRequests,
    AddRequest,
    CoreFailed,
    CoreStats,
    EngineCoreOutputs,
    GetStats,
    Ready,
    ReleaseHandoff,
    ResetPrefixCache,
    Shutdown,
    UtilityResult,
    message_decoder,
)

CORE_MODULE = "libs.mockengine.core_main"


class CoreDied(Exception):
    """The engine-core process exited (crashed, killed or failed); only a restart helps."""


class EngineCoreClient:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._outputs: asyncio.Queue[EngineCoreOutputs | CoreDied] = asyncio.Queue()
        self._calls: dict[int, asyncio.Future[UtilityResult]] = {}
        self._call_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._failure = ""
        self.dead = False
        self._messages_read = 0
        self.ready: Ready
        self.latest_stats = CoreStats()
        self.stats_received = 0  # how many times latest_stats was replaced

    @classmethod
    async def start(cls, config: CoreConfig, *, ready_timeout_s: float | None = None) -> EngineCoreClient:
        """Starts the core and waits until it reports ready (its simulated start-up
        included); raises CoreDied if it fails first."""
        client = cls()
        await client._start(config, ready_timeout_s)
        return client

    async def _start(self, config: CoreConfig, ready_timeout_s: float | None) -> None:
        self._dir = tempfile.mkdtemp(prefix="cleave-mockcore-")
        self._context = zmq.asyncio.Context()
        self._input = self._context.socket(zmq.PUSH)
        self._output = self._context.socket(zmq.PULL)
        input_address, output_address = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        self._input.bind(input_address)
        self._output.bind(output_address)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            CORE_MODULE,
            "--input",
            input_address,
            "--output",
            output_address,
            "--config",
            msgspec.json.encode(config).decode(),
            stdin=subprocess.PIPE,
            env=env,
        )
        self._tasks.append(asyncio.create_task(self._watch_process()))
        try:
            first = await asyncio.wait_for(self._next_message(), ready_timeout_s)
        except BaseException:
            await self.shutdown(timeout_s=1.0)
            raise
        if not isinstance(first, Ready):
            await self.shutdown(timeout_s=1.0)
            raise CoreDied(f"the mock engine core did not start: {first}")
        self.ready = first
        self._tasks.append(asyncio.create_task(self._read_messages()))

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    # -- requests ------------------------------------------------------------------------------
    async def add_request(self, request: AddRequest) -> None:
        await self._send(request)

    async def abort(self, request_ids: list[str]) -> None:
        await self._send(AbortRequests(request_ids=request_ids))

    async def release_handoff(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        await self._send(ReleaseHandoff(request_id=request_id, kv_transfer_params=kv_transfer_params))

    async def get_stats(self) -> CoreStats:
        result = await self._call(GetStats(call_id=0))
        return result.stats or CoreStats()

    async def reset_prefix_cache(self) -> bool:
        return (await self._call(ResetPrefixCache(call_id=0))).ok

    async def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs, in the order the core sent them; raises CoreDied once
        the core is gone and everything it sent was read."""
        item = await self._outputs.get()
        if isinstance(item, CoreDied):
            self._outputs.put_nowait(item)  # every later call fails the same way
            raise item
        return item

    async def _call(self, message: GetStats | ResetPrefixCache) -> UtilityResult:
        if self.dead:
            raise CoreDied(self._death_message())
        call_id = next(self._call_ids)
        future: asyncio.Future[UtilityResult] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            await self._send(type(message)(call_id=call_id))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def _send(self, message: msgspec.Struct) -> None:
        if self.dead:
            raise CoreDied(self._death_message())
        await self._input.send(self._encoder.encode(message), copy=False)

    # -- reading ----------------------------------------------------------------------------------
    async def _next_message(self) -> Any:
        decoder = message_decoder()
        receive = asyncio.ensure_future(self._output.recv())
        died = asyncio.ensure_future(self.process.wait())
        try:
            done, _ = await asyncio.wait({receive, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
        if receive in done:
            message = decoder.decode(receive.result())
            if isinstance(message, CoreFailed):
                return message.message
            return message
        receive.cancel()
        return f"the core process exited with status {self.process.returncode} before it was ready"

    async def _read_messages(self) -> None:
        try:
            await self._read_forever()
        except Exception as error:  # a message this client cannot read: the core is unusable
            self._failure = f"unreadable message from the core: {error!r}"
            if self.process.returncode is None:
                self.process.kill()  # the process watcher then reports the death

    async def _read_forever(self) -> None:
        decoder = message_decoder()
        while True:
            message = decoder.decode(await self._output.recv())
            self._messages_read += 1
            if isinstance(message, EngineCoreOutputs):
                self.latest_stats = message.stats
                self.stats_received += 1
                self._outputs.put_nowait(message)
            elif isinstance(message, UtilityResult):
                if message.stats is not None:
                    self.latest_stats = message.stats
                    self.stats_received += 1
                future = self._calls.get(message.call_id)
                if future is not None and not future.done():
                    future.set_result(message)
            elif isinstance(message, CoreFailed):
                self._failure = message.message

    async def _watch_process(self) -> None:
        await self.process.wait()
        await self._let_reader_finish()
        self.dead = True
        died = CoreDied(self._death_message())
        for future in self._calls.values():
            if not future.done():
                future.set_exception(died)
        self._outputs.put_nowait(died)

    async def _let_reader_finish(self, quiet_s: float = 0.05, limit_s: float = 2.0) -> None:
        """Lets the reader take what the core sent before it died: its last messages can still
        be on their way through ZMQ's I/O threads, so wait until none has come for `quiet_s`."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            seen = self._messages_read
            await asyncio.sleep(quiet_s)
            if self._messages_read == seen:
                return

    def _death_message(self) -> str:
        detail = f": {self._failure}" if self._failure else ""
        return f"the mock engine core (pid {self.process.pid}) exited with status {self.process.returncode}{detail}"

    # -- stopping ---------------------------------------------------------------------------------
    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Asks the core to stop, kills it if it does not within timeout_s, cleans up."""
        if self.process.returncode is None:
            with contextlib.suppress(zmq.ZMQError):
                await self._input.send(self._encoder.encode(Shutdown()))
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._input.close(linger=0)
        self._output.close(linger=0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)
