"""Image decoding limits: every bad image is an ImageError whose message says what is wrong."""

from __future__ import annotations

import base64
import http.server
import io
import random
import struct
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from PIL import Image

from libs.encoder.errors import ImageError
from libs.encoder.images import ImageLimits, content_hash, image_bytes, open_image

LIMITS = ImageLimits()


def png(width: int = 8, height: int = 6, color: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def noise_png() -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (64, 64), random.Random(0).randbytes(64 * 64 * 3)).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def huge_png_header(width: int, height: int) -> bytes:
    """A PNG whose header says width x height (no real pixel data): what a decompression
    bomb looks like before decoding; allocating the real thing would take 1.2 GB."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def test_data_url_round_trip() -> None:
    data = png()
    assert image_bytes(data_url(data), LIMITS) == data
    image = open_image(data, LIMITS)
    assert image.size == (8, 6) and image.mode == "RGB"


def test_jpeg_and_rgba_become_rgb() -> None:
    out = io.BytesIO()
    Image.new("RGBA", (5, 5), (1, 2, 3, 4)).save(out, format="PNG")
    assert open_image(out.getvalue(), LIMITS).mode == "RGB"
    out = io.BytesIO()
    Image.new("RGB", (5, 5)).save(out, format="JPEG")
    assert open_image(out.getvalue(), LIMITS).size == (5, 5)


def test_content_hash_is_of_the_bytes() -> None:
    assert content_hash(png()) == content_hash(png())
    assert content_hash(png()) != content_hash(png(color=(0, 0, 0)))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"hello, this is not an image at all", "not an image"),
        (noise_png()[:2000], "corrupt or truncated"),
        (huge_png_header(20_000, 20_000), "more than this server's limit of 40000000 pixels"),
        (huge_png_header(8_000, 8_000), "8000x8000 pixels, more than this server's limit of 40000000 pixels"),
    ],
    ids=["empty", "not-an-image", "truncated", "20000x20000", "8000x8000"],
)
def test_bad_images(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        open_image(data, LIMITS)


def test_unsupported_format() -> None:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, format="TIFF")
    with pytest.raises(ImageError, match="unsupported image format TIFF"):
        open_image(out.getvalue(), LIMITS)


def test_byte_limit() -> None:
    small = ImageLimits(max_bytes=100)
    with pytest.raises(ImageError, match="larger than this server's limit of 100 bytes"):
        image_bytes(data_url(b"x" * 1000), small)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png,plain", "must be base64"),
        ("data:image/png;base64", "no ','"),
        ("data:image/png;base64,@@@", "base64 data is invalid"),
        ("file:///etc/passwd", "unsupported image URL scheme 'file'"),
        ("http://127.0.0.1:1/a.png", "disabled on this server"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        image_bytes(url, LIMITS)


@pytest.fixture
def slow_server() -> Iterator[str]:
    """127.0.0.1 HTTP server: /slow answers after 3 s, /ok at once."""
    body = png()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                time.sleep(3)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_fetch_when_enabled(slow_server: str) -> None:
    enabled = ImageLimits(allow_http=True, http_timeout_s=0.5, allow_private=True)  # 127.0.0.1
    assert image_bytes(f"{slow_server}/ok", enabled) == png()
    started = time.monotonic()
    with pytest.raises(ImageError, match=r"timed out after 0\.5 s"):
        image_bytes(f"{slow_server}/slow", enabled)
    assert time.monotonic() - started < 2.5
