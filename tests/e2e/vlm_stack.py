"""An encoder stack whose workers cannot run a vision tower: the proof that prefill and
colocated workers take the encoder's embeddings instead of pixels.

The workers load `nan_vision_copy` of the model: the same files, with every vision-tower and
connector (projector) weight replaced by NaN, while the tokenizer and the encoder load the real
model. Were a worker to run its own tower on an image, NaN would spread from the image's
positions through attention to every later position and the greedy tokens would change (the
test compares them with vLLM's in-engine path on the real weights), so output identical to
that reference shows the workers never ran it.

The stack is the gateway's own local-stack launcher (libs/stack/local.launch, the code behind
`--mode 1e1p1d`), run in the test process with its worker configs pointed at the NaN copy;
the gateway then serves it from a child process given the services' addresses.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from libs.config.flags import parse
from libs.config.roles import Role
from libs.gateway.config import GatewayConfig
from libs.stack import local
from libs.stack.launcher import LocalStack, Service
from libs.worker.config import WorkerConfig
from services.entry_points import ENTRY_POINTS
from tests.e2e.harness import log_dir, start

# Idefics3's vision tower (SigLIP) and its connector (pixel shuffle + projection).
VISION = re.compile(r"(^|\.)(vision_model|connector)\.")


def nan_vision_copy(model_dir: Path, dest: Path) -> Path:
    """`model_dir` copied to `dest` with its vision weights NaN; returns `dest`. Same tensor
    names, shapes and dtypes, so every file keeps its size (safetensors' header lists only
    those) and the copy keeps the model's fingerprint: libs/models/fingerprint.py identifies a
    model for KV compatibility, and the language model, which alone makes the KV, is the
    same bytes."""
    import torch
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    poisoned = 0
    for path in model_dir.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy2(path, dest / path.name)
            continue
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if VISION.search(name):
                tensors[name] = torch.full_like(tensor, float("nan"))
                poisoned += 1
        save_file(tensors, dest / path.name, metadata={"format": "pt"})
    assert poisoned, f"no vision weights found in {model_dir}"
    return dest


def stack_config(mode: str, model_dir: Path, cache_dir: Path, *extra: str) -> GatewayConfig:
    flags = [*extra, "--mode", mode, "--port", "0", "--model", str(model_dir), "--dtype", "float32",
             "--max-model-len", "2048", "--cache-dir", str(cache_dir)]  # fmt: skip
    return parse(GatewayConfig, flags)


def launch_with_worker_model(
    configs: list[GatewayConfig], worker_model: Path
) -> list[tuple[LocalStack, local.StackAddresses]]:
    """libs/stack/local.launch of each config, all at once (one stack's start leaves a core
    idle while its processes import in turn), with every worker's --model replaced by
    `worker_model`."""
    original = local.worker_config

    def worker_config(*args: Any, **kwargs: Any) -> WorkerConfig:
        return replace(original(*args, **kwargs), model=str(worker_model))

    stacks = [LocalStack(log_dir() / f"stack-{config.mode.name}") for config in configs]

    async def launch_all() -> list[local.StackAddresses]:
        launches = (
            local.launch(c, s, entry_points=ENTRY_POINTS) for c, s in zip(configs, stacks, strict=True)
        )
        return list(await asyncio.gather(*launches))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "worker_config", worker_config)
        try:
            addresses = asyncio.run(launch_all())
        except BaseException:
            for stack in stacks:
                stack.stop()
            raise
    return list(zip(stacks, addresses, strict=True))


def start_gateway(name: str, config: GatewayConfig, addresses: local.StackAddresses) -> tuple[Service, str]:
    """A gateway child serving the running services at `addresses`."""
    flags = ["--port", "0", "--tokenizer", addresses.tokenizer, "--wait-for-workers-s", "0",
             "--cache-dir", str(config.cache_dir)]  # fmt: skip
    for flag, role in (
        ("--prefill-workers", Role.PREFILL),
        ("--decode-workers", Role.DECODE),
        ("--pd-workers", Role.BOTH),
    ):
        if addresses.workers[role]:
            flags += [flag, ",".join(addresses.workers[role])]
    if addresses.encoders:
        flags += ["--encoders", ",".join(addresses.encoders)]
    service = start(name, "services.gateway.main", parse(GatewayConfig, flags))
    try:
        return service, service.wait_http_ready(120)
    except BaseException:
        service.kill()
        raise
