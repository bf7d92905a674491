"""Image parts of chat messages -> the encoder service's embeddings (modes xEyPD, xEyPzD),
or, with no encoder and a vision-language model (modes pd, XpYd), the image files for the
workers' engines to encode (vLLM's in-engine path).

With an encoder the gateway does not touch images: it sends each `image_url` as the client
wrote it to the encoder, which fetches (where allowed), checks, caches and encodes; its
INVALID_ARGUMENT (a bad image, with what is wrong) is the client's 400 and never counts
against a worker. Without one the gateway reads the files (data: URLs, http(s) where allowed,
the encoder's code and limits) and the worker decodes them with the encoder's checks, so a
bad image is the same 400 either way.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
import structlog
from prometheus_client import Counter

from cleave.common.v1 import common_pb2
from cleave.encoder.v1 import encoder_pb2, encoder_pb2_grpc
from libs.encoder.errors import ImageError
from libs.encoder.images import ImageLimits, content_hash, image_bytes
from libs.gateway.api.openai_api import ChatCompletionRequest
from libs.gateway.common import deadline, errors
from libs.gateway.common.metrics import STAGE_SECONDS
from libs.rpc.channel import open_channel
from libs.rpc.security import RpcSecurity

log = structlog.get_logger(__name__)

IMAGES = Counter(
    "cleave_gateway_images_total",
    "Images of chat requests by who encodes them: the encoder (cached: from its embedding "
    "cache, or encoded) or, without an encoder, the workers' engines (engine)",
    ["source"],
)

TEXT_ONLY = (
    "image content parts are not supported: this server serves a text-only model (no vision "
    "encoder; serve a vision-language model, or start an xEyPD or xEyPzD mode with one)"
)


class RoundRobinEncoders:
    """Several encoders (mode 2e1p1d ...): each request's images go to the next one. Their
    caches are separate; a repeated image hits the cache of the encoder that got it."""

    def __init__(self, stubs: Sequence[encoder_pb2_grpc.EncoderStub]) -> None:
        self._stubs = itertools.cycle(stubs)

    def Encode(self, request: encoder_pb2.EncodeRequest, **kwargs: Any) -> Any:
        return next(self._stubs).Encode(request, **kwargs)


def encoder_stub(addresses: Sequence[str], security: RpcSecurity | None = None) -> Any:
    """What the gateway calls for images: None without encoders (a text-only server)."""
    stubs = [encoder_pb2_grpc.EncoderStub(open_channel(address, security=security)) for address in addresses]
    if not stubs:
        return None
    return stubs[0] if len(stubs) == 1 else RoundRobinEncoders(stubs)


def image_urls(body: ChatCompletionRequest) -> list[str]:
    """Every image of the conversation, in the order the template renders placeholders."""
    return [url for message in body.messages for url in message.image_urls()]


async def encode_images(
    encoder: Any, body: ChatCompletionRequest, request_id: str
) -> list[common_pb2.Tensor]:
    """The embeddings of the request's images (none without image parts)."""
    return [embedding.embeddings for embedding in await encoded_images(encoder, body, request_id)]


def image_cache_salt(client_salt: str, embeddings: Sequence[encoder_pb2.ImageEmbedding]) -> str:
    """The prompt's cache salt with its images' content hashes in it. A decode worker gets
    the expanded prompt without the images: the same token ids for every image, so without
    this its prefix cache would take one image's KV for another's (vLLM folds cache_salt
    into the first block's hash)."""
    return _salt(client_salt, [e.content_hash for e in embeddings])


def image_files_salt(client_salt: str, files: Sequence[bytes]) -> str:
    """image_cache_salt for image files sent to the workers: the same content hashes (a
    colocated engine keys its cache by the images itself; a decode worker after a handoff
    gets only the expanded prompt)."""
    return _salt(client_salt, [content_hash(data) for data in files])


def _salt(client_salt: str, hashes: Sequence[str]) -> str:
    images = hashlib.sha256("".join(hashes).encode()).hexdigest()
    return f"{client_salt}|images:{images}" if client_salt else f"images:{images}"


async def image_files(body: ChatCompletionRequest, limits: ImageLimits) -> list[bytes]:
    """The conversation's image files, read from their URLs within `limits` (a fetch is
    blocking I/O: off the event loop); a URL that cannot be read is the client's 400."""
    files = []
    for url in image_urls(body):
        try:
            files.append(await asyncio.to_thread(image_bytes, url, limits))
        except ImageError as error:
            raise errors.invalid(str(error), "messages") from error
    IMAGES.labels("engine").inc(len(files))
    return files


async def encoded_images(
    encoder: Any, body: ChatCompletionRequest, request_id: str
) -> list[encoder_pb2.ImageEmbedding]:
    """The encoder's answer for the request's images (none without image parts)."""
    urls = image_urls(body)
    if not urls:
        return []
    if encoder is None:
        raise errors.invalid(TEXT_ONLY, "messages")
    request = encoder_pb2.EncodeRequest(
        metadata=common_pb2.RequestMetadata(request_id=request_id, model=body.model),
        images=[encoder_pb2.Image(url=url) for url in urls],
    )
    current = deadline.current()
    started = time.perf_counter()
    try:
        response = await encoder.Encode(request, timeout=current.grpc_timeout() if current else None)
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise errors.invalid(error.details() or "invalid image", "messages") from error
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and current is not None and current.expired():
            raise current.exceeded() from error
        raise errors.ApiError(
            503, f"encoder unavailable: {error.code().name}", type_="service_unavailable"
        ) from error
    STAGE_SECONDS.labels("encode").observe(time.perf_counter() - started)
    cached = sum(embedding.cached for embedding in response.embeddings)
    IMAGES.labels("cached").inc(cached)
    IMAGES.labels("encoded").inc(len(response.embeddings) - cached)
    log.debug("images encoded", images=len(urls), cached=cached)
    return list(response.embeddings)
