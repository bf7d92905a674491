"""An image chat through a running encode compose stack (1e1pd, 1e1p1d; docs/deploy.md):

    python3 tests/deploy/compose_image_chat.py --model NAME [--port 8000] [--timeout 300]

- one chat completion whose message holds a data: URL PNG and a question must be answered
  (at least one generated token, the image's embeddings counted in the prompt), and the
  gateway's own counter must show one more image that the encoder encoded
  (cleave_gateway_images_total{source="encoded"} or, on a rerun, source="cached");
- a data: URL that is not an image must be a 400 naming the problem, not a 5xx, and the
  stack must still answer the image chat afterwards.

Started by tests/deploy/compose_smoke.sh --image-chat after its text chat. Standard library
only (the host's python3, outside Bazel); HTTP goes only to the gateway on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import struct
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from typing import Any


def png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of seeded noise, written with zlib (the host's python3 has no PIL)."""
    noise = random.Random(seed)
    rows = b"".join(b"\x00" + noise.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def post(base: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def images_counted(base: str) -> float:
    """Images the gateway sent to its encoder, encoded or from the encoder's cache."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(
        r'^cleave_gateway_images_total\{source="(?:encoded|cached)"\} ([0-9.e+]+)$', text, re.M
    )
    return sum(float(value) for value in found)


def image_chat(model: str, url: str) -> dict[str, Any]:
    return {
        "model": model,
        "temperature": 0,
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is in this image?"},
                ],
            }
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    url = "data:image/png;base64," + base64.b64encode(png(96, 64, seed=15)).decode()

    before = images_counted(base)
    status, reply = post(base, image_chat(args.model, url), args.timeout)
    if status != 200:
        print(f"compose_image_chat: the image chat got {status}: {reply}", file=sys.stderr)
        return 1
    usage = reply["usage"]
    text = reply["choices"][0]["message"]["content"]
    print(f"compose_image_chat: answer {text!r}, usage {usage}", file=sys.stderr)
    if usage["completion_tokens"] < 1 or images_counted(base) != before + 1:
        print(
            f"compose_image_chat: no token, or the gateway did not count the image: {reply}", file=sys.stderr
        )
        return 1
    print(f"compose_image_chat: prompt of {usage['prompt_tokens']} tokens with the image", file=sys.stderr)

    not_image = "data:image/png;base64," + base64.b64encode(b"this is not a picture").decode()
    status, reply = post(base, image_chat(args.model, not_image), args.timeout)
    if status != 400:
        print(f"compose_image_chat: a non-image got {status}, not 400: {reply}", file=sys.stderr)
        return 1
    print(f"compose_image_chat: a non-image is a 400: {reply['error']['message']!r}", file=sys.stderr)
    status, reply = post(base, image_chat(args.model, url), args.timeout)
    if status != 200:
        print(f"compose_image_chat: after the bad image the chat got {status}: {reply}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
