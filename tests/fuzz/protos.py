"""Hypothesis strategies for arbitrary protobuf messages, built from their descriptors.

Every field may be set or left unset; scalars range over the whole wire type with the edges
(0, -1, the extremes, NaN and infinities) made likely; enums take unknown numbers too;
repeated fields and maps are empty, short or long; oneofs get at most one member. `overrides`
(field full name -> strategy) bias the fields that guard deeper code (a model name, token ids
inside a vocabulary) so that examples reach past the first check more often than chance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

M = TypeVar("M", bound=Message)
Strategy = st.SearchStrategy[Any]

_T = FieldDescriptor


def _ints(bits: int, signed: bool) -> Strategy:
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    edges = sorted({0, 1, high, low, *((-1,) if signed else ())})
    return st.one_of(st.sampled_from(edges), st.integers(-4 if signed else 0, 70), st.integers(low, high))


_SCALARS: dict[int, Strategy] = {
    _T.TYPE_INT32: _ints(32, True),
    _T.TYPE_SINT32: _ints(32, True),
    _T.TYPE_SFIXED32: _ints(32, True),
    _T.TYPE_INT64: _ints(64, True),
    _T.TYPE_SINT64: _ints(64, True),
    _T.TYPE_SFIXED64: _ints(64, True),
    _T.TYPE_UINT32: _ints(32, False),
    _T.TYPE_FIXED32: _ints(32, False),
    _T.TYPE_UINT64: _ints(64, False),
    _T.TYPE_FIXED64: _ints(64, False),
    _T.TYPE_BOOL: st.booleans(),
    _T.TYPE_FLOAT: st.floats(width=32),
    _T.TYPE_DOUBLE: st.floats(),
    # Protobuf strings are UTF-8: hypothesis's text never holds lone surrogates.
    _T.TYPE_STRING: st.one_of(st.text(max_size=12), st.text(max_size=300)),
    _T.TYPE_BYTES: st.binary(max_size=64),
}


def mostly(usual: Strategy, unusual: Strategy, *, percent: int = 85) -> Strategy:
    """`usual` about `percent` % of the time (st.one_of draws its branches evenly)."""
    return st.integers(1, 100).flatmap(lambda roll: usual if roll <= percent else unusual)


def messages(
    cls: type[M],
    overrides: Mapping[str, Strategy] | None = None,
    *,
    max_depth: int = 4,
    max_list: int = 40,
) -> st.SearchStrategy[M]:
    """Arbitrary `cls` messages; a field named in `overrides` draws from that strategy (a
    repeated field's override draws the whole list)."""
    return _message(cls.DESCRIPTOR, dict(overrides or {}), max_depth, max_list)


def _message(descriptor: Descriptor, overrides: dict[str, Strategy], depth: int, max_list: int) -> Strategy:
    cls = _class_of(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        chosen_oneof = {
            oneof.name: draw(st.sampled_from([None, *oneof.fields]))
            for oneof in descriptor.oneofs
            if not _synthetic(oneof)
        }
        for field in descriptor.fields:
            real_oneof = field.containing_oneof is not None and not _synthetic(field.containing_oneof)
            if real_oneof:
                if chosen_oneof[field.containing_oneof.name] is not field:
                    continue
            elif field.full_name not in overrides and not draw(st.booleans()):
                continue
            _assign(message, field, draw(_field(field, overrides, depth, max_list)))
        return message

    return build()


def _field(field: FieldDescriptor, overrides: dict[str, Strategy], depth: int, max_list: int) -> Strategy:
    if field.full_name in overrides:
        return overrides[field.full_name]
    if _is_map(field):
        key = field.message_type.fields_by_name["key"]
        value = field.message_type.fields_by_name["value"]
        return st.dictionaries(
            _single(key, overrides, depth, max_list),
            _single(value, overrides, depth, max_list),
            max_size=max_list,
        )
    single = _single(field, overrides, depth, max_list)
    if field.is_repeated:
        if field.type == _T.TYPE_MESSAGE:
            return st.lists(single, max_size=3 if depth > 1 else 0)
        return st.one_of(st.lists(single, max_size=4), st.lists(single, max_size=max_list))
    return single


def _single(field: FieldDescriptor, overrides: dict[str, Strategy], depth: int, max_list: int) -> Strategy:
    if field.type == _T.TYPE_MESSAGE:
        if depth <= 1:
            return st.just(_class_of(field.message_type)())
        return _message(field.message_type, overrides, depth - 1, max_list)
    if field.type == _T.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        # Proto3 enums are open: a peer built from a newer contract sends numbers we lack.
        return st.one_of(st.sampled_from(known), st.integers(-3, 40))
    return _SCALARS[field.type]


def _assign(message: Message, field: FieldDescriptor, value: Any) -> None:
    target = getattr(message, field.name)
    if _is_map(field):
        if field.message_type.fields_by_name["value"].type == _T.TYPE_MESSAGE:
            for key, item in value.items():
                target[key].CopyFrom(item)
        else:
            target.update(value)
    elif field.is_repeated:
        target.extend(value)
    elif field.type == _T.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == _T.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _synthetic(oneof: Any) -> bool:
    # A proto3 `optional` field lives in a oneof of its own that the language hides.
    return len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name


def _class_of(descriptor: Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)
