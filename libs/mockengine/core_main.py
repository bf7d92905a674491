"""Entry point of a mock engine-core process: `python -m libs.mockengine.core_main
--input ADDR --output ADDR --config JSON` (started by libs/mockengine/client.py).

Imports nothing heavy (no torch, no vLLM, no gRPC): a fleet of mock workers must stay light.
The core exits when its parent does: the client holds the write end of the core's stdin and
never writes, so end-of-file on stdin means the client's process is gone (a SIGKILLed worker
included), and the core leaves at once instead of running orphaned.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import msgspec

from libs.mockengine.config import CoreConfig, resolve
from libs.mockengine.core import EngineCore


async def _exit_when_parent_exits() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()  # returns at end of file: the parent closed it or died
    os._exit(0)


async def _run(core: EngineCore, watch_parent: bool) -> None:
    watcher = asyncio.create_task(_exit_when_parent_exits()) if watch_parent else None
    try:
        await core.run()
    finally:
        if watcher is not None:
            watcher.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True, help="ZMQ address the client sends requests on")
    parser.add_argument("--output", required=True, help="ZMQ address the core sends outputs on")
    parser.add_argument("--config", required=True, help="libs.mockengine.config.CoreConfig as JSON")
    parser.add_argument("--no-parent-watch", action="store_true", help="keep running when stdin closes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="mock-core %(levelname)s %(message)s")
    resolved = resolve(msgspec.json.decode(args.config, type=CoreConfig))
    asyncio.run(_run(EngineCore(resolved, args.input, args.output), not args.no_parent_watch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
