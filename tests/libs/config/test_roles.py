"""The role a worker serves, as its --role flag spells it."""

from __future__ import annotations

from libs.config.codecs import enum_of
from libs.config.roles import Role


def test_roles_render_and_parse_as_their_flag_values() -> None:
    codec = enum_of(Role)
    assert [codec.format(role) for role in Role] == ["prefill", "decode", "both"]
    assert all(codec.parse("--role", role.value) is role for role in Role)
