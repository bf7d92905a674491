"""TTFT of image+text chats while text-only requests stream, per local-stack mode (issue 14:
does a separate encoder keep image encoding out of the way?). For each mode the gateway's
local stack is started with the same model; `--text-streams` clients keep streaming text
requests while image prompts (each a new image, so no cache answers) are sent one at a time;
the report gives each mode's median TTFT and their ratio (first mode / second). In `pd` (no
encoder) the colocated worker's engine encodes the images itself (vLLM's in-engine path).

heavy --exclusive ./bazel run //tools/bench:image_ttft -- --modes 1e1p1d,pd
(--model DIR: a vision-language model folder; default: the tests' tiny random Idefics3.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from libs.config.flags import parse
from libs.gateway.config import GatewayConfig
from libs.stack.entry_points import ServiceKind
from libs.stack.launcher import Service, start_service
from services.entry_points import ENTRY_POINTS


def image_url(seed: int, size: int) -> str:
    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), random.Random(seed).randbytes(size * size * 3)).save(
        out, format="PNG"
    )
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


async def ttft(http: httpx.AsyncClient, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            # The first chunk with text: the role-only chunk that opens a chat stream (its
            # content is "") comes before any token is computed.
            if line.startswith("data: {") and _content(json.loads(line[len("data: ") :])):
                return time.perf_counter() - started
    raise RuntimeError("the stream ended without content")


def _content(chunk: dict[str, Any]) -> str:
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in chunk.get("choices", []))


async def text_load(http: httpx.AsyncClient, model: str, stop: asyncio.Event, max_tokens: int) -> int:
    sent = 0
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip
    while not stop.is_set():
        async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            response.raise_for_status()
            async for _line in response.aiter_lines():  # the whole stream: decode keeps working
                pass
        sent += 1
    return sent


async def measure(base: str, args: argparse.Namespace) -> list[float]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        stop = asyncio.Event()
        loads = [
            asyncio.create_task(text_load(http, model, stop, args.text_max_tokens))
            for _ in range(args.text_streams)
        ]
        await asyncio.sleep(2)  # the text streams are decoding
        times = []
        for i in range(args.image_prompts):
            content = [{"type": "image_url", "image_url": {"url": image_url(1000 + i, args.image_size)}},
                       {"type": "text", "text": "What is in this image?"}]  # fmt: skip
            # ignore_eos: a random model's first token may be EOS, which would end the stream
            # without any text to time.
            body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
                    "temperature": 0.0, "ignore_eos": True}  # fmt: skip
            times.append(await ttft(http, body))
        stop.set()
        await asyncio.gather(*loads)
        return times


def start_stack(mode: str, model: Path, cache: Path) -> tuple[Service, str]:
    flags = [
        "--mode",
        mode,
        "--port",
        "0",
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--cache-dir",
        str(cache),
    ]
    service = start_service(
        "gateway",
        "gateway",
        ENTRY_POINTS.module(ServiceKind.GATEWAY),
        parse(GatewayConfig, flags),
        cache / "logs",
    )
    return service, service.wait_http_ready(900)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default="1e1p1d,pd")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--text-streams", type=int, default=4)
    parser.add_argument("--text-max-tokens", type=int, default=64)
    parser.add_argument("--image-prompts", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=512)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cleave-image-ttft-") as folder:
        work = Path(folder)
        model = args.model
        if model is None:
            from transformers import AutoTokenizer

            from libs.models.builtin import locate_smollm2_gguf
            from libs.models.tiny_vlm import make_tiny_vlm

            gguf = locate_smollm2_gguf()
            tokenizer = AutoTokenizer.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, local_files_only=True
            )
            tokenizer.save_pretrained(str(work / "tokenizer"))
            model = make_tiny_vlm(work / "model", work / "tokenizer")
        results: dict[str, list[float]] = {}
        for mode in args.modes.split(","):
            service, base = start_stack(mode, model, work / mode)
            try:
                results[mode] = asyncio.run(measure(base, args))
            finally:
                service.stop()
        report: dict[str, Any] = {
            mode: {"ttft_median_s": statistics.median(t), "ttft_s": t} for mode, t in results.items()
        }
        modes = list(results)
        if len(modes) == 2:
            report["ratio"] = report[modes[0]]["ttft_median_s"] / report[modes[1]]["ttft_median_s"]
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
