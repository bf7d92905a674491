"""Chat messages and their rendering through a model's own chat template.

transformers' apply_chat_template does the rendering; what it leaves to us is
input validation (it happily renders a None content or a typo'd role into a
prompt the model was never trained on) and turning template errors into
ValueErrors the API layer can report as a bad request.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from jinja2.exceptions import TemplateError
from transformers import PreTrainedTokenizerBase

# Roles every ChatML-style template understands. Tool calling is not supported
# yet; accepting "tool" without its extra fields would render broken prompts.
CHAT_ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def validate_messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """Checks messages and converts them to the dicts apply_chat_template expects."""
    if not messages:
        raise ValueError("messages must contain at least one message")
    converted: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise ValueError(f"messages[{index}] must be a ChatMessage, got {type(message).__name__}")
        if message.role not in CHAT_ROLES:
            raise ValueError(
                f"messages[{index}] has unknown role {message.role!r}; expected one of {sorted(CHAT_ROLES)}"
            )
        # Dataclasses do not enforce annotations at runtime, and request JSON
        # can carry lists (multimodal parts) or null here.
        if not isinstance(message.content, str):
            raise ValueError(
                f"messages[{index}] ({message.role}) content must be a string, "
                f"got {type(message.content).__name__}"
            )
        converted.append({"role": message.role, "content": message.content})
    return converted


def render_chat(
    hf_tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool,
    source: str,
) -> str:
    """Renders messages to prompt text; `source` names the tokenizer in errors."""
    if chat_template is None:
        raise ValueError(
            f"tokenizer at {source} has no chat template; "
            "set TokenizerConfig.chat_template to render chat requests"
        )
    conversation = validate_messages(messages)
    try:
        rendered = hf_tokenizer.apply_chat_template(
            conversation,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    except TemplateError as error:
        # Templates reject e.g. non-alternating roles via raise_exception().
        raise ValueError(f"chat template rejected the messages: {error}") from error
    if not isinstance(rendered, str):
        raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not str")
    return rendered
