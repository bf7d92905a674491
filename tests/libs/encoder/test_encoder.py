"""ImageEncoder with a fake vision tower: caching by content, refusals counted, and the
encoder keeps serving after a bad image."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
import torch
from PIL import Image

from libs.encoder.encoder import ImageEncoder
from libs.encoder.errors import ImageError
from libs.encoder.images import ImageLimits


class CountingTower:
    hidden_size = 8

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, image: Image.Image) -> torch.Tensor:
        self.calls += 1
        width, height = image.size
        return torch.full((4, self.hidden_size), float(width * 1000 + height))


def png_url(width: int, height: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_repeated_image_is_encoded_once() -> None:
    async def scenario() -> None:
        tower = CountingTower()
        encoder = ImageEncoder(tower, ImageLimits(), cache_bytes=1 << 20)
        first = await encoder.encode(url=png_url(3, 2))
        again = await encoder.encode(url=png_url(3, 2))
        other = await encoder.encode(url=png_url(2, 3))
        assert not first.cached and again.cached and not other.cached
        assert first.content_hash == again.content_hash != other.content_hash
        assert torch.equal(first.embeddings, again.embeddings)
        assert float(other.embeddings[0, 0]) == 2003.0
        assert tower.calls == 2
        # Concurrent requests for one new image: still one encode.
        results = await asyncio.gather(*(encoder.encode(url=png_url(5, 5)) for _ in range(4)))
        assert tower.calls == 3 and sum(not r.cached for r in results) == 1

    asyncio.run(scenario())


def test_bad_image_then_good_one() -> None:
    async def scenario() -> None:
        tower = CountingTower()
        encoder = ImageEncoder(tower, ImageLimits(), cache_bytes=1 << 20)
        with pytest.raises(ImageError, match="not an image"):
            await encoder.encode(data=b"plain text")
        assert (await encoder.encode(url=png_url(1, 1))).embeddings.shape == (4, 8)

    asyncio.run(scenario())
