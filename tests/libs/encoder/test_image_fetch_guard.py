"""Image URLs are fetched only from public addresses, checked after DNS resolution and after
every redirect, with at most MAX_REDIRECTS redirects (libs/encoder/images.py). Nothing here
leaves the machine: the servers listen on 127.0.0.1, names resolve through a patched
getaddrinfo, and where a test needs a "public" server, 127.0.0.1 is declared public for it."""

from __future__ import annotations

import http.server
import io
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from libs.encoder import images
from libs.encoder.errors import ImageError
from libs.encoder.images import MAX_REDIRECTS, ImageLimits, image_bytes, permitted

GUARDED = ImageLimits(allow_http=True, http_timeout_s=2)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


class Server:
    """A 127.0.0.1 server: /img is a PNG, /to?u=URL redirects there, /hop/N redirects to
    /hop/N+1 (forever); records every path asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        body = png()
        seen = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                if self.path == "/img":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path.startswith("/to?u="):
                    target = self.path.removeprefix("/to?u=")
                elif self.path.startswith("/hop/"):
                    target = f"/hop/{int(self.path.removeprefix('/hop/')) + 1}"
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


def resolve(monkeypatch: pytest.MonkeyPatch, names: dict[str, str]) -> None:
    """Names resolve to the given addresses; anything else as before (127.0.0.1 literals)."""
    real = socket.getaddrinfo

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real(names.get(host, host), port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def loopback_is_public(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 stands in for a public server; every other address keeps its verdict."""
    monkeypatch.setattr(images, "permitted", lambda address: address == "127.0.0.1" or permitted(address))


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:10.0.0.1", False),
    ],
)
def test_only_global_unicast_addresses_are_permitted(address: str, allowed: bool) -> None:
    assert permitted(address) is allowed


def test_a_loopback_url_is_refused_without_a_connection(server: Server) -> None:
    with pytest.raises(ImageError, match=r"resolves to 127\.0\.0\.1, a private, loopback"):
        image_bytes(server.url("/img"), GUARDED)
    assert server.paths == []
    # The operator's --allow-private-image-urls lifts the check.
    assert image_bytes(server.url("/img"), ImageLimits(allow_http=True, allow_private=True)) == png()


@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.7", "::1"])
def test_a_name_resolving_to_a_private_address_is_refused_after_resolution(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    resolve(monkeypatch, {"images.example": address})
    with pytest.raises(ImageError, match=r"'images\.example' resolves to .*non-public address"):
        image_bytes("http://images.example/cat.png", GUARDED)


def test_a_redirect_to_a_private_address_is_refused(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    loopback_is_public(monkeypatch)
    resolve(monkeypatch, {"metadata.internal": "169.254.169.254"})
    assert image_bytes(server.url("/img"), GUARDED) == png()  # the "public" server itself
    with pytest.raises(ImageError, match=r"'metadata\.internal' resolves to 169\.254\.169\.254"):
        image_bytes(server.url("/to?u=http://metadata.internal/latest/meta-data/"), GUARDED)
    with pytest.raises(ImageError, match=r"'127\.0\.0\.2' resolves to 127\.0\.0\.2"):
        image_bytes(server.url(f"/to?u=http://127.0.0.2:{server.port}/img"), GUARDED)
    assert "/img" not in server.paths[1:]  # no redirect reached the image


def test_redirects_are_followed_up_to_the_limit(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    loopback_is_public(monkeypatch)
    assert image_bytes(server.url("/to?u=/img"), GUARDED) == png()
    server.paths.clear()
    with pytest.raises(ImageError, match=f"redirected more than {MAX_REDIRECTS} times"):
        image_bytes(server.url("/hop/0"), GUARDED)
    assert server.paths == [f"/hop/{i}" for i in range(MAX_REDIRECTS + 1)]


def test_a_redirect_to_another_scheme_is_refused(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    loopback_is_public(monkeypatch)
    with pytest.raises(ImageError, match="unsupported scheme 'file'"):
        image_bytes(server.url("/to?u=file:///etc/passwd"), GUARDED)


def test_http_errors_and_unresolvable_names_are_clear(
    monkeypatch: pytest.MonkeyPatch, server: Server
) -> None:
    loopback_is_public(monkeypatch)
    with pytest.raises(ImageError, match="HTTP 404"):
        image_bytes(server.url("/missing"), GUARDED)

    def unresolvable(*_args: Any, **_kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    with pytest.raises(ImageError, match=r"cannot resolve 'nowhere\.example'"):
        image_bytes("http://nowhere.example/a.png", GUARDED)
