"""Chat messages and their rendering through a model's own chat template.

transformers' apply_chat_template does the rendering; what it leaves to us is
input validation (it happily renders a None content or a typo'd role into a
prompt the model was never trained on) and turning template errors into
ValueErrors the API layer can report as a bad request.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError
from transformers import PreTrainedTokenizerBase

# Roles every ChatML-style template understands. Other roles are passed to the template as
# vLLM's chat utils pass them (a custom role is the template's to render or refuse).
CHAT_ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})
# apply_chat_template's own arguments, which a request's template kwargs may not replace.
_RESERVED_KWARGS = frozenset(
    {"conversation", "chat_template", "tokenize", "add_generation_prompt", "continue_final_message"}
)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    # A string, or (a message with images) its parts: {"type": "text", "text": ...} and
    # {"type": "image"}, which the template renders as the model's image placeholder.
    content: str | list[dict[str, str]]
    # The message's other fields (vLLM gives a template every field of a message).
    extra: Mapping[str, Any] = field(default_factory=dict)


def validate_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Checks messages and converts them to the dicts apply_chat_template expects."""
    if not messages:
        raise ValueError("messages must contain at least one message")
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise ValueError(f"messages[{index}] must be a ChatMessage, got {type(message).__name__}")
        if not isinstance(message.role, str) or not message.role:
            raise ValueError(f"messages[{index}] has no role; common roles are {sorted(CHAT_ROLES)}")
        # Dataclasses do not enforce annotations at runtime, and request JSON
        # can carry lists (multimodal parts) or null here.
        if not isinstance(message.content, str) and not _is_parts(message.content):
            raise ValueError(
                f"messages[{index}] ({message.role}) content must be a string, "
                f"got {type(message.content).__name__}"
            )
        converted.append({**message.extra, "role": message.role, "content": message.content})
    return converted


def _is_parts(content: object) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") in ("text", "image") for part in content
    )


def render_chat(
    hf_tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool,
    source: str,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Renders messages to prompt text; `source` names the tokenizer in errors."""
    if chat_template is None:
        raise ValueError(
            f"tokenizer at {source} has no chat template; "
            "set TokenizerConfig.chat_template to render chat requests"
        )
    conversation = validate_messages(messages)
    kwargs = dict(template_kwargs or {})
    reserved = sorted(_RESERVED_KWARGS & kwargs.keys())
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {reserved}")
    if continue_final_message and conversation[-1]["role"] != "assistant":
        # transformers' own check, with the API's name for it.
        raise ValueError("continue_final_message needs the last message to be an assistant message")
    try:
        rendered = hf_tokenizer.apply_chat_template(
            conversation,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **kwargs,
        )
    except TemplateError as error:
        # Templates reject e.g. non-alternating roles via raise_exception().
        raise ValueError(f"chat template rejected the messages: {error}") from error
    except TypeError as error:
        # A text-only template concatenating a message's content fails on a list of parts.
        if any(not isinstance(message["content"], str) for message in conversation):
            raise ValueError(
                f"the model's chat template cannot render image parts (a text-only model?): {error}"
            ) from error
        raise
    if not isinstance(rendered, str):
        raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not str")
    return rendered
