"""Images from OpenAI content parts: `data:` URLs, and http(s) URLs only when enabled; each
decoded with bounded bytes, pixels and time, or refused with a message saying what is wrong.

PIL does the decoding (what vLLM's own media connector uses); this module adds the limits a
server exposed to clients needs before PIL allocates anything: the byte size before decoding,
the pixel count from the header before the pixels are decoded (a 20,000 x 20,000 PNG is a few
hundred kB on the wire and 1.2 GB decoded), and the formats a vision processor can take.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import urllib.error
import urllib.request

from PIL import Image, UnidentifiedImageError

from libs.encoder.errors import ImageError
from libs.encoder.limits import ImageLimits

__all__ = ["ImageLimits", "content_hash", "image_bytes", "open_image"]

# Still-image formats every Hugging Face image processor takes through PIL.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def content_hash(data: bytes) -> str:
    """The cache key: identical files give one key whatever URL or request carried them."""
    return hashlib.sha256(data).hexdigest()


def image_bytes(url: str, limits: ImageLimits) -> bytes:
    """The encoded image file an `image_url` names."""
    if url.startswith("data:"):
        return _data_url(url, limits)
    if url.startswith(("http://", "https://")):
        if not limits.allow_http:
            raise ImageError(
                "image URLs over http(s) are disabled on this server; send the image as a data: URL"
            )
        return _fetch(url, limits)
    scheme = url.split(":", 1)[0] if ":" in url else url[:16]
    raise ImageError(f"unsupported image URL scheme {scheme!r}; use a data: URL (or http(s) where enabled)")


def _data_url(url: str, limits: ImageLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise ImageError("malformed data: URL (no ',' before the data)")
    if not header.endswith(";base64"):
        raise ImageError("data: URLs of images must be base64 (data:image/png;base64,...)")
    # base64 is 4/3 the size: refuse before decoding anything too large.
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise ImageError(f"image is larger than this server's limit of {limits.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageError(f"the image's base64 data is invalid: {error}") from error


def _fetch(url: str, limits: ImageLimits) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "cleave-encoder"})
    try:
        with urllib.request.urlopen(request, timeout=limits.http_timeout_s) as response:
            data = bytes(response.read(limits.max_bytes + 1))
    except TimeoutError as error:
        raise ImageError(f"fetching the image timed out after {limits.http_timeout_s:g} s") from error
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            raise ImageError(f"fetching the image timed out after {limits.http_timeout_s:g} s") from error
        raise ImageError(f"could not fetch the image: {error.reason}") from error
    except OSError as error:
        raise ImageError(f"could not fetch the image: {error}") from error
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is larger than this server's limit of {limits.max_bytes} bytes")
    return data


def open_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Decoded RGB pixels, after the format and pixel-count checks."""
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is larger than this server's limit of {limits.max_bytes} bytes")
    if not data:
        raise ImageError("the image is empty")
    try:
        # Header only: PIL decodes pixels lazily, on load().
        image = Image.open(io.BytesIO(data), formats=None)
    except UnidentifiedImageError as error:
        raise ImageError("the data is not an image (no known image format)") from error
    except Image.DecompressionBombError as error:  # PIL's own bound, above ours by default
        raise ImageError(f"{error}; more than this server's limit of {limits.max_pixels} pixels") from error
    except (OSError, ValueError) as error:
        raise ImageError(f"cannot read the image: {error}") from error
    if image.format not in FORMATS:
        raise ImageError(f"unsupported image format {image.format}; supported: {', '.join(FORMATS)}")
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageError(
            f"image is {width}x{height} pixels, more than this server's limit of {limits.max_pixels} pixels"
        )
    if width == 0 or height == 0:
        raise ImageError(f"image has no pixels ({width}x{height})")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise ImageError(f"the {image.format} image is corrupt or truncated: {error}") from error
    return image.convert("RGB")
