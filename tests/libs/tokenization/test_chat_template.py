"""--chat-template as vLLM reads it: a file's contents, or the value itself when it is Jinja."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.tokenization.chat_template import load_chat_template


def test_a_file_is_read_and_a_template_is_taken_as_given(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(path)) == "{{ messages[0].content }}"
    inline = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert load_chat_template(inline) == inline
    assert load_chat_template(None) is None


def test_a_missing_file_that_is_no_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file, and not a template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
