"""Images a worker's engine encodes itself: modes without an encoder service (pd, XpYd) with
a vision-language model. The gateway sends the image files; here each is decoded with the
encoder's own checks and limits (libs/encoder/images.py), so a bad image gets the same 400
in every mode, and vLLM gets PIL images (its in-engine path: its processor, its tower)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from libs.encoder.images import ImageLimits, open_image
from libs.worker.errors import InvalidRequest

# The encoder's defaults (libs/encoder/limits.py): the gateway already bounded the file size.
LIMITS = ImageLimits()


async def decode_images(
    files: Sequence[bytes], *, takes_images: bool, with_embeddings: bool, limits: ImageLimits = LIMITS
) -> list[Any]:
    """The request's images as RGB PIL images (none without images). Decoding is CPU work
    of up to the pixel limit: off the event loop, which serves other requests' tokens."""
    if not files:
        return []
    if not takes_images:
        raise InvalidRequest("this worker's model is text-only: it takes no images")
    if with_embeddings:
        raise InvalidRequest("a request carries either images or image embeddings, not both")
    return [await asyncio.to_thread(open_image, data, limits) for data in files]


def image_embeddings(tensors: Sequence[Any], *, enabled: bool) -> list[Any]:
    """The request's image embeddings (common_pb2.Tensor) as tensors; refused where vLLM would
    refuse them (`enabled`: the worker runs with --enable-mm-embeds)."""
    if not tensors:
        return []
    if not enabled:
        raise InvalidRequest("this worker takes no image embeddings (start it with --enable-mm-embeds)")
    # Imported here: it needs torch, which a worker without images (a mock one) never loads.
    from libs.encoder.tensors import from_proto

    try:
        return [from_proto(tensor) for tensor in tensors]
    except ValueError as error:
        raise InvalidRequest(str(error)) from error
