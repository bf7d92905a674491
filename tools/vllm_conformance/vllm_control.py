"""The control run: vLLM's own OpenAI server, serving the runner's model, in place of Cleave.

A test of vLLM's that fails against vLLM itself serving the same small model depends on the
model its authors chose (its wording, tokenizer, chat template or a model-specific parser),
not on the server; one that passes there and fails against Cleave is Cleave's to fix. So
`--server vllm` runs the same tests, the same way, against
`python -m vllm.entrypoints.openai.api_server` with the test's own serve arguments, and the
two reports side by side give that split by measurement rather than by reading assertions.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from libs.rpc.ports import free_port
from libs.stack.process import ProcessSpec, RunningProcess, python_module, start
from tools.vllm_conformance.serve_args import control_args

HOST = "127.0.0.1"
KV_CACHE_GIB = 2


def _wait_healthy(running: RunningProcess, url: str, timeout_s: float) -> None:
    # Synchronous: some of vLLM's tests build their server inside a running event loop.
    deadline = time.monotonic() + timeout_s
    while True:
        code = running.exit_code()
        if code is not None:
            raise running.failure(f"exited with code {code} while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == httpx.codes.OK:
                return
        if time.monotonic() > deadline:
            raise running.failure(f"not healthy after {timeout_s:.0f}s")
        time.sleep(0.5)


def _cores() -> str:
    return ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))


@contextlib.contextmanager
def vllm_server(
    model_path: str,
    served_name: str,
    vllm_args: Sequence[str],
    env: Mapping[str, str],
    log_dir: Path,
    startup_timeout_s: float,
) -> Iterator[str]:
    """vLLM's OpenAI server on loopback; yields its base URL once /health answers."""
    # vLLM's server takes a port number, not a port file: one below the kernel's ephemeral
    # range, which no other process's bind(0) or outgoing connection can take meanwhile.
    port = free_port()
    argv = python_module("vllm.entrypoints.openai.api_server", [
        "--model", model_path, "--served-model-name", served_name, "--host", HOST, "--port", str(port),
        *control_args(vllm_args),
    ])  # fmt: skip
    environment = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": _cores(), **env}
    url = f"http://{HOST}:{port}"
    running = start(ProcessSpec(f"vllm-control-{port}", argv, environment), log_dir)
    try:
        _wait_healthy(running, url, startup_timeout_s)
        yield url
    finally:
        running.stop(timeout_s=60)
