"""Frozen config types that are parsed from argv and rendered back to argv.

A service's configuration is one frozen dataclass. Each field declares its flag once, with
`flag(...)`: the default, the help text and a `Codec` that turns the flag's text into the
value and back. From that one declaration come the argparse parser (`parse`), the command
line a launcher passes to a child (`render`), and the guarantee `parse(render(c)) == c`.

Flag groups (server, model, logging, engine, ...) are dataclasses too. A config includes a
group either by inheriting it (its flags keep their names: `--port`) or as a field declared
with `group("prefill")`, whose flags are then prefixed (`--prefill-max-num-seqs`). `compose`
builds one config from groups of another (the gateway's `--decode-*` flags become a decode
worker's flags) by field name, so adding a flag to a group needs no copying code anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from libs.config.errors import ConfigError

T = TypeVar("T")
C = TypeVar("C")

_FLAG = "cleave.flag"
_GROUP = "cleave.group"


@dataclass(frozen=True)
class Codec(Generic[T]):
    """How one value type is written on a command line. `parse` raises ConfigError."""

    parse: Callable[[str, str], T]  # (flag name, text) -> value
    format: Callable[[T], str]


@dataclass(frozen=True)
class _FlagSpec:
    codec: Codec[Any]
    help: str
    name: str | None  # the flag's name when it is not the field's name with dashes
    switch: bool  # a store_true flag: present = True, absent = False
    count: bool  # a repeatable flag (`-v -v`): the value is how often it was given
    many: bool  # one or more values after the flag (`--lora-modules a=/x b=/y`): a tuple


def _text(_flag: str, text: str) -> str:
    return text


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(flag, text, "an integer") from None


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(flag, text, "a number") from None


TEXT: Codec[str] = Codec(_text, str)
INT: Codec[int] = Codec(_int, str)
FLOAT: Codec[float] = Codec(_float, repr)
PATH: Codec[Path] = Codec(lambda _flag, text: Path(text), str)


def flag(
    default: Any = None,
    *,
    help: str = "",
    codec: Codec[Any] = TEXT,
    name: str | None = None,
    count: bool = False,
    many: bool = False,
) -> Any:
    """Declares a dataclass field as a command-line flag. A bool default makes a switch (one
    that defaults to True also gets a `--no-NAME` form to turn it off); `count=True` a
    repeatable flag such as `-v` (`name` may then be a short `-x` name); `many=True` a flag
    taking one or more values (argparse's nargs="+", as vLLM's `--lora-modules`), each parsed
    by `codec`, into a tuple."""
    spec = _FlagSpec(
        codec=codec, help=help, name=name, switch=isinstance(default, bool), count=count, many=many
    )
    if isinstance(default, (list, dict, set)):
        raise TypeError("flag defaults must be immutable")
    return dataclasses.field(default=default, metadata={_FLAG: spec})


def group(prefix: str = "", *, factory: Callable[[], Any]) -> Any:
    """Declares a dataclass field holding a flag group; its flags are named `--PREFIX-NAME`."""
    return dataclasses.field(default_factory=factory, metadata={_GROUP: prefix})


def _flag_name(field: dataclasses.Field[Any], prefix: str) -> str:
    spec: _FlagSpec = field.metadata[_FLAG]
    if spec.name is not None and spec.name.startswith("-"):
        return spec.name  # a short flag, never prefixed
    base = spec.name or field.name.replace("_", "-")
    return f"--{prefix}-{base}" if prefix else f"--{base}"


def _group_type(field: dataclasses.Field[Any]) -> type:
    factory: Callable[[], Any] = field.default_factory  # type: ignore[assignment]
    return type(factory())


def _walk(cls: type, prefix: str = "") -> list[tuple[tuple[str, ...], dataclasses.Field[Any], str]]:
    """(path of field names, field, flag name) for every flag of `cls`, groups included."""
    found: list[tuple[tuple[str, ...], dataclasses.Field[Any], str]] = []
    for field in dataclasses.fields(cls):
        if _FLAG in field.metadata:
            found.append(((field.name,), field, _flag_name(field, prefix)))
        elif _GROUP in field.metadata:
            inner = field.metadata[_GROUP]
            nested_prefix = "-".join(p for p in (prefix, inner) if p)
            for path, nested, name in _walk(_group_type(field), nested_prefix):
                found.append(((field.name, *path), nested, name))
    return found


_UNSET = object()


def _dest(field: dataclasses.Field[Any]) -> str:
    return f"count_{field.name}"


def build_parser(cls: type, description: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description or (cls.__doc__ or "").strip().split("\n")[0])
    for _path, field, name in _walk(cls):
        spec: _FlagSpec = field.metadata[_FLAG]
        help_text = spec.help
        if spec.switch:
            # On by default: `--no-NAME` turns it off (`--NAME` is accepted, and changes nothing).
            action = argparse.BooleanOptionalAction if field.default is True else "store_true"
            parser.add_argument(name, action=action, default=_UNSET, help=help_text)
            continue
        if spec.count:
            # argparse's count starts from None, not from a sentinel.
            parser.add_argument(name, action="count", dest=_dest(field), default=None, help=help_text)
            continue
        metavar = name.lstrip("-").upper().replace("-", "_")
        if spec.many:
            parser.add_argument(name, nargs="+", default=_UNSET, metavar=metavar, help=help_text)
            continue
        if field.default is not None:
            help_text = f"{help_text} (default: {spec.codec.format(field.default)})".strip()
        parser.add_argument(name, default=_UNSET, metavar=metavar, help=help_text)
    return parser


def parse(cls: type[C], argv: Sequence[str] | None = None, *, description: str = "") -> C:
    """argv -> a `cls` instance. Raises ConfigError naming the flag; argparse exits on syntax."""
    namespace = vars(build_parser(cls, description).parse_args(argv))
    return _build(cls, namespace, "")


def _build(cls: type[C], namespace: dict[str, Any], prefix: str) -> C:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if _FLAG in field.metadata:
            name = _flag_name(field, prefix)
            text = namespace[
                _dest(field) if field.metadata[_FLAG].count else name.lstrip("-").replace("-", "_")
            ]
            if text is _UNSET or text is None:
                continue
            spec: _FlagSpec = field.metadata[_FLAG]
            if spec.many:
                values[field.name] = tuple(spec.codec.parse(name, item) for item in text)
            else:
                values[field.name] = text if spec.switch or spec.count else spec.codec.parse(name, text)
        elif _GROUP in field.metadata:
            nested_prefix = "-".join(p for p in (prefix, field.metadata[_GROUP]) if p)
            values[field.name] = _build(_group_type(field), namespace, nested_prefix)
    return cls(**values)


def render(config: Any) -> list[str]:
    """The command line that `parse` turns back into `config`: every non-default flag."""
    argv: list[str] = []
    for path, field, name in _walk(type(config)):
        value = config
        for attribute in path:
            value = getattr(value, attribute)
        if value == field.default:
            continue
        spec: _FlagSpec = field.metadata[_FLAG]
        if spec.switch:
            argv.append(name if value else "--no-" + name.removeprefix("--"))
        elif spec.count:
            argv += [name] * value
        elif spec.many:
            argv += [name, *(spec.codec.format(item) for item in value)]
        elif value is not None:
            argv += [name, spec.codec.format(value)]
        else:
            raise ValueError(f"{name} is set by default and cannot be rendered as unset")
    return argv


def compose(cls: type[C], *sources: Any, **overrides: Any) -> C:
    """A `cls` built from flag groups of other configs plus explicit overrides: how a launcher
    turns the gateway's groups into a child's config without listing fields.

    Each source is `(instance, GroupType)`: the fields of `GroupType`, a flag group that `cls`
    inherits, are copied from `instance` (which may be a larger config holding that group),
    so nothing else of the instance (the gateway's own port, say) leaks into the child.
    """
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for instance, group_type in sources:
        if not issubclass(cls, group_type):
            raise TypeError(f"{cls.__name__} does not include the flag group {group_type.__name__}")
        for field in dataclasses.fields(group_type):
            values[field.name] = getattr(instance, field.name)
    unknown = set(overrides) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    values.update(overrides)
    return cls(**values)
