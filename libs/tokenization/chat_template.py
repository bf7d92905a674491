"""`--chat-template` as vLLM reads it (its load_chat_template): a file's contents, or, when no
such file opens and the value looks like Jinja, the value itself. vLLM also looks a bare name
up among its bundled templates; Cleave does not bundle them, so such a name is refused."""

from __future__ import annotations

# vLLM's test for "this is a template, not a path".
_JINJA_CHARS = "{}\n"


def load_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") as file:
            return file.read()
    except OSError as error:
        if any(c in value for c in _JINJA_CHARS):
            return value
        raise ValueError(
            f"--chat-template {value!r}: no such file, and not a template ({error.strerror})"
        ) from None
