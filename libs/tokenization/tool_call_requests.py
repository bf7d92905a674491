"""ParseToolCalls (`tool_choice: auto`, a finished text): the calls --tool-call-parser finds in
it, as the tokenizer service answers them (on a pool thread, offload.py). The streaming form
is vllm_tool_call_stream.py."""

from __future__ import annotations

from cleave.tokenizer.v1 import tokenizer_pb2
from libs.rpc.errors import FailedPrecondition, InvalidRequest
from libs.tokenization.tokenizer import Tokenizer
from libs.tokenization.tools import ToolCallParser

# The deployment's setup, not the request (the gateway enables `auto` only with a parser).
NO_PARSER = "this tokenizer service has no --tool-call-parser"


def parse_tool_calls(
    tokenizer: Tokenizer, request: tokenizer_pb2.ParseToolCallsRequest, parser: ToolCallParser | None
) -> tokenizer_pb2.ParseToolCallsResponse:
    if parser is None:
        raise FailedPrecondition(NO_PARSER)
    try:
        parsed = parser.parse(request.text, request.tools_json, tokenizer.hf_tokenizer)
    except ValueError as error:  # tools that are not valid JSON or not vLLM's tool shape
        raise InvalidRequest(f"tools: {error}") from None
    return tokenizer_pb2.ParseToolCallsResponse(
        tools_called=parsed.tools_called,
        tool_calls=[
            tokenizer_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in parsed.calls
        ],
        content=parsed.content,
    )
