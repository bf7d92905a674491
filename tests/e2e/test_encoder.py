"""Modes 1e1p1d and 1e1pd end to end with a tiny random vision-language model (Idefics3,
generated at test time, float32): greedy output of image+text chats through the encoder
service equals vLLM's in-engine path (the engine runs the vision tower on the images
itself); a repeated image comes from the encoder's cache; bad images are 400s that say what
is wrong, and the encoder keeps serving.

The workers (prefill and decode in 1e1p1d, the colocated one in 1e1pd) load a copy of the
model whose vision tower and connector weights are NaN (tests/e2e/vlm_stack.py); only the
encoder has the real ones. Output token-identical to vLLM's in-engine path on the real
weights therefore also shows that the workers take embeddings and never run the tower. That
this proof can fail is checked in transformers, not in vLLM (test_vlm_stack: the copy's tower
makes an image prompt NaN and changes its greedy tokens, a text prompt stays bit-identical);
mode pd (no encoder) runs the real weights in-engine and is compared with the same reference."""

from __future__ import annotations

import base64
import http.server
import io
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from libs.models.fingerprint import model_fingerprint
from libs.models.tiny_vlm import make_tiny_vlm
from tests.e2e.harness import child_env, log_dir, start
from tests.e2e.stack import stop_gateway_stack
from tests.e2e.vlm_stack import launch_with_worker_model, nan_vision_copy, stack_config, start_gateway
from tests.fixtures.smollm2 import save_smollm2_tokenizer

MAX_TOKENS = 12


def image(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    noise = random.Random(seed).randbytes(width * height * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), noise).save(out, format=fmt)
    return out.getvalue()


def url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def part(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url(data, mime)}}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


A, B, C = image(64, 64, 1), image(300, 200, 2), image(128, 512, 3)
D, E = image(640, 480, 4, "JPEG"), image(33, 77, 5)
# (messages, images in order): several sizes, two images in one message, an image in an
# earlier turn, a repeated image (A).
CASES: list[tuple[list[dict[str, Any]], list[bytes]]] = [
    ([{"role": "user", "content": [part(A), text("What is in this image?")]}], [A]),
    ([{"role": "user", "content": [text("Describe"), part(B)]}], [B]),
    ([{"role": "user", "content": [part(C), text("Tall picture.")]}], [C]),
    ([{"role": "user", "content": [part(D, "image/jpeg"), text("A photo.")]}], [D]),
    ([{"role": "user", "content": [part(E), text("Tiny.")]}], [E]),
    ([{"role": "user", "content": [part(A), part(B), text("Compare the two.")]}], [A, B]),
    ([{"role": "user", "content": [text("First"), part(C), text("then"), part(E)]}], [C, E]),
    (
        [
            {"role": "user", "content": [part(B), text("What is this?")]},
            {"role": "assistant", "content": "Noise."},
            {"role": "user", "content": "Are you sure?"},
        ],
        [B],
    ),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": [part(D, "image/jpeg")]}], [D]),
    ([{"role": "user", "content": [part(A), text("Once more, this image.")]}], [A]),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = save_smollm2_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), tokenizer)


@pytest.fixture(scope="module")
def nan_vision_model(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workers' copy: vision tower and connector NaN. Its fingerprint is the real
    model's (same config and weight files): the stack's KV-compatibility identity is the
    language model's, which is the same, so no check between services refuses it."""
    copy = nan_vision_copy(model_dir, tmp_path_factory.mktemp("tiny-vlm-nan-vision"))
    assert model_fingerprint(copy, "idefics3") == model_fingerprint(model_dir, "idefics3")
    return copy


def chat(gateway: str, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": served_model(gateway), "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "return_token_ids": True}  # fmt: skip
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=300)


def served_model(gateway: str) -> str:
    return str(httpx.get(f"{gateway}/v1/models").json()["data"][0]["id"])


def metric(gateway: str, name: str, label: str) -> float:
    text_ = httpx.get(f"{gateway}/metrics").text
    found = re.search(rf'^{name}{{source="{label}"}} ([0-9.e+]+)$', text_, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def stacks(
    model_dir: Path, nan_vision_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The local stacks of `--mode 1e1p1d` and `--mode 1e1pd` (the gateway's own launcher),
    their workers on the NaN-vision copy, each served by a gateway given their addresses;
    and `--mode pd` (no encoder: the colocated worker's engine encodes the images, with the
    real weights), started by its gateway."""
    stops: list[Callable[[], None]] = []
    urls: dict[str, str] = {}
    try:
        # 1e1p1d's encoder fetches http(s) image URLs (1 s limit), from 127.0.0.1 too (the
        # slow test server: --allow-private-image-urls); 1e1pd's refuses them.
        extra = {
            "1e1p1d": ("--allow-image-urls", "--allow-private-image-urls", "--image-fetch-timeout-s", "1"),
            "1e1pd": (),
        }
        # The three stacks start at once: started one after another they took 194 s in a CI
        # rehearsal, mostly one core importing vLLM while the other idled.
        service = start(
            "gateway-pd",
            "services.gateway.main",
            stack_config("pd", model_dir, tmp_path_factory.mktemp("pd")),
        )
        stops.append(lambda: stop_gateway_stack(service))
        configs = {
            mode: stack_config(mode, model_dir, tmp_path_factory.mktemp(mode), *extra[mode])
            for mode in ("1e1p1d", "1e1pd")
        }
        launched = launch_with_worker_model(list(configs.values()), nan_vision_model)
        stops.extend(stack.stop for stack, _ in launched)
        for (mode, config), (_, addresses) in zip(configs.items(), launched, strict=True):
            gateway, urls[mode] = start_gateway(f"gateway-{mode}", config, addresses)
            stops.append(gateway.stop)
        urls["pd"] = service.wait_http_ready(900)
        yield urls
    finally:
        for stop in reversed(stops):
            stop()


@pytest.fixture(scope="module")
def reference(model_dir: Path, stacks: dict[str, str]) -> list[list[int]]:
    """vLLM's in-engine path on the prompts as the gateway's tokenizer renders them."""
    gateway = stacks["1e1pd"]
    model = served_model(gateway)
    cases = []
    for messages, images in CASES:
        tokenized = httpx.post(f"{gateway}/tokenize", json={"model": model, "messages": messages}).json()
        cases.append(
            {
                "prompt_token_ids": tokenized["tokens"],
                "images": [base64.b64encode(i).decode() for i in images],
            }
        )
    folder = log_dir()
    (folder / "vlm_cases.json").write_text(json.dumps(cases))
    with (folder / "reference_vlm.log").open("wb") as log:
        process = subprocess.run(
            [sys.executable, "-m", "tests.e2e.reference_vlm", str(model_dir), str(folder / "vlm_cases.json"),
             str(folder / "vlm_reference.json"), str(MAX_TOKENS)],
            stdout=log, stderr=subprocess.STDOUT, env=child_env(), timeout=900, check=False,
        )  # fmt: skip
    assert process.returncode == 0, (folder / "reference_vlm.log").read_text()[-3000:]
    return list(json.loads((folder / "vlm_reference.json").read_text()))


@pytest.mark.parametrize("mode", ["1e1p1d", "1e1pd", "pd"])
def test_greedy_output_equals_vllm_in_engine_vision(
    mode: str, stacks: dict[str, str], reference: list[list[int]]
) -> None:
    gateway = stacks[mode]
    model = served_model(gateway)
    for (messages, _images), expected in zip(CASES, reference, strict=True):
        response = chat(gateway, messages)
        assert response.status_code == 200, response.text
        got = response.json()["choices"][0]["token_ids"]
        assert got == expected, f"{mode}: {messages[-1]}"
    # Every case after the first repeats an image (A, B, C, D, E appear again): cache hits.
    cached = metric(gateway, "cleave_gateway_images_total", "cached")
    encoded = metric(gateway, "cleave_gateway_images_total", "encoded")
    engine = metric(gateway, "cleave_gateway_images_total", "engine")
    print(f"{mode}: {len(CASES)} prompts identical to vLLM's in-engine path; images encoded {encoded:.0f}, "
          f"from the encoder cache {cached:.0f}, by the worker's engine {engine:.0f}; model {model}")  # fmt: skip
    # pd has no encoder: all 12 images go to the worker's engine (vLLM's own cache).
    assert (encoded, cached, engine) == ((0, 0, 12) if mode == "pd" else (5, 7, 0))


BAD = [
    (url(image(64, 64, 7)[:2000]), "corrupt or truncated"),
    (url(b"just some text, not an image", "text/plain"), "not an image"),
    (url(image(8, 8, 9, "TIFF"), "image/tiff"), "unsupported image format TIFF"),
    ("data:image/png;base64,%%%", "base64 data is invalid"),
]


@pytest.fixture
def slow_image_server() -> Iterator[str]:
    """A 127.0.0.1 HTTP server that answers after 5 s."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/cat.png"
    finally:
        server.shutdown()
        server.server_close()


def test_image_urls_disabled_or_timing_out_are_400s(stacks: dict[str, str], slow_image_server: str) -> None:
    cases = (
        ("1e1pd", "disabled on this server"),
        ("1e1p1d", "timed out after 1 s"),
        ("pd", "disabled on this server"),
    )
    for mode, needle in cases:
        messages = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": slow_image_server}}]}
        ]
        response = chat(stacks[mode], messages)
        assert response.status_code == 400, response.text
        assert needle in response.json()["error"]["message"], response.text
        print(f"{mode} 400: {response.json()['error']['message']}")


@pytest.mark.parametrize("mode", ["1e1p1d", "pd"])
def test_bad_images_are_400s_and_the_encoder_keeps_serving(mode: str, stacks: dict[str, str]) -> None:
    """The encoder's checks, and in pd (no encoder) the same checks in the worker."""
    gateway = stacks[mode]
    huge = Image.new("1", (20_000, 20_000))
    out = io.BytesIO()
    huge.save(out, format="PNG")  # a few kB on the wire, 1.2 GB as RGB
    cases = [*BAD, (url(out.getvalue()), "more than this server's limit")]
    for bad, needle in cases:
        messages = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": bad}}, text("hi")]}
        ]
        response = chat(gateway, messages)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert needle in message, message
        print(f"400: {message}")
    good = chat(gateway, CASES[0][0])
    assert good.status_code == 200, good.text
