"""Chat rendering: the model's own template, as transformers renders it, plus input checks."""

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from libs.tokenization.chat import ChatMessage
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig

CONVERSATIONS = {
    "system_user": [
        ChatMessage("system", "You are terse."),
        ChatMessage("user", "What is the capital of France?"),
    ],
    "user_only": [ChatMessage("user", "Hi!")],
    "multi_turn": [
        ChatMessage("system", "You are terse."),
        ChatMessage("user", "Capital of France?"),
        ChatMessage("assistant", "Paris."),
        ChatMessage("user", "And of Japan? 東京?"),
    ],
    "ends_with_assistant": [
        ChatMessage("user", "Count to three."),
        ChatMessage("assistant", "1, 2, 3"),
    ],
}


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> PreTrainedTokenizerBase:
    """transformers' own tokenizer for the same folder, to render the expected prompts."""
    return AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_apply_chat_template(
    smollm2: Tokenizer,
    reference: PreTrainedTokenizerBase,
    name: str,
    add_generation_prompt: bool,
) -> None:
    messages = CONVERSATIONS[name]
    expected = reference.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    rendered = smollm2.render_chat(messages, add_generation_prompt=add_generation_prompt)
    assert rendered == expected


def test_chatml_markers(smollm2: Tokenizer) -> None:
    rendered = smollm2.render_chat(CONVERSATIONS["multi_turn"])
    assert rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert "<|im_start|>user\nCapital of France?<|im_end|>\n" in rendered
    assert "<|im_start|>assistant\nParis.<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>user\nAnd of Japan? 東京?<|im_end|>\n<|im_start|>assistant\n")
    assert smollm2.render_chat(CONVERSATIONS["multi_turn"], add_generation_prompt=False).endswith(
        "東京?<|im_end|>\n"
    )


def test_model_default_system_prompt(smollm2: Tokenizer) -> None:
    # SmolLM2's template adds its own system turn when none is given.
    rendered = smollm2.render_chat(CONVERSATIONS["user_only"])
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_rendered_prompt_encodes_to_chatml_ids(smollm2: Tokenizer) -> None:
    ids = smollm2.encode(smollm2.render_chat(CONVERSATIONS["system_user"]), add_special_tokens=False)
    assert ids[0] == 1  # <|im_start|>
    assert ids.count(2) == 2  # one <|im_end|> per message


def test_empty_messages(smollm2: Tokenizer) -> None:
    with pytest.raises(ValueError, match="at least one message"):
        smollm2.render_chat([])


def test_missing_role(smollm2: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"messages\[1\] has no role"):
        smollm2.render_chat([ChatMessage("user", "hi"), ChatMessage("", "x")])


def test_custom_role_and_extra_fields_reach_the_template(smollm2: Tokenizer) -> None:
    # As vLLM's chat utils: any role, and the message's other fields, go to the template.
    prompt = smollm2.render_chat([ChatMessage("robot", "beep", extra={"name": "r2"})])
    assert "<|im_start|>robot\nbeep<|im_end|>" in prompt


@pytest.mark.parametrize("content", [None, ["hi"], [{"type": "audio"}], 3])
def test_content_not_a_string(smollm2: Tokenizer, content: object) -> None:
    message = ChatMessage("user", content)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"messages\[0\] \(user\) content must be a string"):
        smollm2.render_chat([message])


def test_parts_on_a_text_only_template_are_a_clear_error(smollm2: Tokenizer) -> None:
    # A message with images reaches the template as its parts; SmolLM2's cannot render them.
    message = ChatMessage("user", [{"type": "image"}, {"type": "text", "text": "hi"}])
    with pytest.raises(ValueError, match="cannot render image parts"):
        smollm2.render_chat([message])


def test_not_a_chat_message(smollm2: Tokenizer) -> None:
    with pytest.raises(ValueError, match="must be a ChatMessage"):
        smollm2.render_chat([{"role": "user", "content": "hi"}])  # type: ignore[list-item]


def test_no_chat_template(byte_fallback: Tokenizer) -> None:
    with pytest.raises(ValueError, match="has no chat template"):
        byte_fallback.render_chat([ChatMessage("user", "hi")])


def test_chat_template_override(byte_fallback_dir: Path) -> None:
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    config = TokenizerConfig(path=byte_fallback_dir, chat_template=template)
    tokenizer = Tokenizer.from_config(config)
    assert tokenizer.render_chat([ChatMessage("user", "hi")]) == "[user] hi\n"


def test_template_errors_become_value_errors(byte_fallback_dir: Path) -> None:
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=byte_fallback_dir, chat_template=template))
    with pytest.raises(ValueError, match="chat template rejected the messages: system first"):
        tokenizer.render_chat([ChatMessage("user", "hi")])
