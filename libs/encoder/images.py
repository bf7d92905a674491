"""Images from OpenAI content parts: `data:` URLs, and http(s) URLs only when enabled; each
decoded with bounded bytes, pixels and time, or refused with a message saying what is wrong.

PIL does the decoding (what vLLM's own media connector uses); this module adds the limits a
server exposed to clients needs before PIL allocates anything: the byte size before decoding,
the pixel count from the header before the pixels are decoded (a 20,000 x 20,000 PNG is a few
hundred kB on the wire and 1.2 GB decoded), and the formats a vision processor can take.

An http(s) URL is a request the server makes on the client's behalf, from inside its network:
without a guard a client could have it read a cloud metadata service (169.254.169.254), an
internal admin page or a service on loopback, and learn from the answer's timing and errors
what is there. So a fetch connects only to global addresses (not private, loopback,
link-local, shared, reserved, multicast or unspecified ones), checked on the addresses DNS
gives at connection time (the socket connects to the address that was checked, so a name
that resolves differently a moment later gains nothing), and again for every redirect, of
which it follows at most MAX_REDIRECTS. `ImageLimits.allow_private` (the flag
`--allow-private-image-urls`) lifts the address check, for images on the operator's own
network and for tests on 127.0.0.1. Proxies from the environment are not used (a proxy would
resolve the name itself, past the check). vLLM follows redirects (requests' default, up to
30; VLLM_MEDIA_URL_ALLOW_REDIRECTS=0 turns them off) and has no address check (its
--allowed-media-domains is a domain allow-list).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import io
import ipaddress
import socket
import ssl
import time
import urllib.parse

from PIL import Image, UnidentifiedImageError

from libs.encoder.errors import ImageError
from libs.encoder.limits import ImageLimits

__all__ = ["ImageLimits", "content_hash", "image_bytes", "open_image"]

# Still-image formats every Hugging Face image processor takes through PIL.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
# Redirects one image fetch follows (each checked as the first URL is); one more is a 400.
MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


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
    """GET `url` within `limits`, following at most MAX_REDIRECTS redirects, each hop to a
    permitted address only; `http_timeout_s` bounds the whole fetch, redirects included."""
    deadline = time.monotonic() + limits.http_timeout_s
    for _hop in range(MAX_REDIRECTS + 1):
        status, location, data = _get(url, limits, deadline)
        if status not in _REDIRECTS:
            break
        if not location:
            raise ImageError(f"could not fetch the image: HTTP {status} without a Location")
        url = urllib.parse.urljoin(url, location)
        if not url.startswith(("http://", "https://")):
            scheme = url.split(":", 1)[0]
            raise ImageError(f"the image URL redirected to an unsupported scheme {scheme!r}")
    else:
        raise ImageError(f"the image URL redirected more than {MAX_REDIRECTS} times")
    if status >= 400:
        raise ImageError(f"could not fetch the image: HTTP {status}")
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is larger than this server's limit of {limits.max_bytes} bytes")
    return data


def _get(url: str, limits: ImageLimits, deadline: float) -> tuple[int, str | None, bytes]:
    """One GET, no redirect followed: (status, Location, body of a 2xx)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if not host:
        raise ImageError("the image URL names no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:  # a port that is not a number, or out of range
        raise ImageError(f"malformed image URL: {error}") from error
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    timed_out = ImageError(f"fetching the image timed out after {limits.http_timeout_s:g} s")
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out
    connection = _GuardedConnection(host, port, left, limits.allow_private, tls=parts.scheme == "https")
    try:
        connection.request("GET", path, headers={"User-Agent": "cleave-encoder"})
        response = connection.getresponse()
        if response.status in _REDIRECTS:
            return response.status, response.getheader("Location"), b""
        if response.status >= 300:
            return response.status, None, b""
        # In pieces, each read given the time left: a server trickling bytes cannot stretch
        # the fetch past its limit.
        data = bytearray()
        while len(data) <= limits.max_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise timed_out
            if connection.sock is not None:
                connection.sock.settimeout(left)
            piece = response.read(min(1 << 16, limits.max_bytes + 1 - len(data)))
            if not piece:
                break
            data += piece
        return response.status, None, bytes(data)
    except TimeoutError as error:
        raise timed_out from error
    except ImageError:
        raise
    except (OSError, http.client.HTTPException) as error:
        raise ImageError(f"could not fetch the image: {error}") from error
    finally:
        connection.close()


def permitted(address: str) -> bool:
    """Whether a fetch may connect to `address` (an IP literal) without --allow-private-image-urls:
    global unicast only. An IPv4-mapped IPv6 address is judged as its IPv4 address."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _connect(host: str, port: int, timeout: float, allow_private: bool) -> socket.socket:
    """A TCP connection to the first address of `host` that is permitted and answers."""
    try:
        candidates = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ImageError(f"could not fetch the image: cannot resolve {host!r} ({error.strerror})") from error
    refused = []
    failure: OSError | None = None
    for family, kind, proto, _name, address in candidates:
        ip = str(address[0])
        if not allow_private and not permitted(ip):
            refused.append(ip)
            continue
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError as error:
            sock.close()
            failure = error
            continue
        return sock
    if failure is not None:
        raise failure
    raise ImageError(
        f"the image URL's host {host!r} resolves to {', '.join(sorted(set(refused)))}, a private, "
        "loopback, link-local or otherwise non-public address; this server fetches images only "
        "from public addresses (an operator can allow others with --allow-private-image-urls)"
    )


class _GuardedConnection(http.client.HTTPConnection):
    """http.client's connection whose socket goes only to a permitted address of the host;
    with `tls`, wrapped for HTTPS with the system's CAs and the host's name checked."""

    def __init__(self, host: str, port: int, timeout: float, allow_private: bool, *, tls: bool) -> None:
        super().__init__(host, port, timeout=timeout)
        self._allow_private = allow_private
        self._tls = ssl.create_default_context() if tls else None

    def connect(self) -> None:
        sock = _connect(self.host, self.port, float(self.timeout or 0) or 10.0, self._allow_private)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host) if self._tls else sock


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
