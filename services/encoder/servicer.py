"""gRPC adapter of the encoder: messages in and out, errors -> status codes through
libs.rpc.methods (a bad image -> INVALID_ARGUMENT with what is wrong; a bug -> INTERNAL)."""

from __future__ import annotations

import grpc
import grpc.aio
import structlog

from cleave.encoder.v1 import encoder_pb2, encoder_pb2_grpc
from libs.encoder.encoder import ImageEncoder
from libs.encoder.errors import ImageError
from libs.encoder.tensors import to_proto
from libs.observability.logging import bind_request_id
from libs.rpc.methods import rpc_method
from libs.rpc.server import ServiceBinding

log = structlog.get_logger(__name__)

SERVICE_NAME = encoder_pb2.DESCRIPTOR.services_by_name["Encoder"].full_name
SERVICE = "encoder"


class EncoderServicer(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, encoder: ImageEncoder, model: str) -> None:
        self._encoder = encoder
        self._model = model

    @rpc_method(service=SERVICE)
    async def Encode(
        self, request: encoder_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> encoder_pb2.EncodeResponse:
        if request.metadata.request_id:
            bind_request_id(request.metadata.request_id)
        response = encoder_pb2.EncodeResponse()
        for index, image in enumerate(request.images):
            try:
                encoded = await self._encoder.encode(url=image.url, data=image.data)
            except ImageError as error:
                # Which image of the request: the gateway maps it back to its content part.
                raise ImageError(f"image {index}: {error}") from error
            response.embeddings.append(
                encoder_pb2.ImageEmbedding(
                    embeddings=to_proto(encoded.embeddings),
                    content_hash=encoded.content_hash,
                    cached=encoded.cached,
                )
            )
        return response

    async def GetInfo(
        self, request: encoder_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> encoder_pb2.EncoderInfo:
        return encoder_pb2.EncoderInfo(model=self._model, hidden_size=self._encoder.hidden_size)


def binding(servicer: EncoderServicer) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, servicer, encoder_pb2_grpc.add_EncoderServicer_to_server)
