"""Every message of every contract survives serialize -> parse with all fields set."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor as d
from google.protobuf.message import Message

from cleave.common.v1 import common_pb2
from cleave.encoder.v1 import encoder_pb2
from cleave.kvstore.v1 import kvstore_pb2
from cleave.tokenizer.v1 import tokenizer_pb2
from cleave.worker.v1 import worker_pb2

FAMILIES = [common_pb2, tokenizer_pb2, encoder_pb2, worker_pb2, kvstore_pb2]

_SCALAR_SAMPLES = {
    d.FieldDescriptor.TYPE_STRING: "héllo 👋",
    d.FieldDescriptor.TYPE_BYTES: b"\x00\xffkv",
    d.FieldDescriptor.TYPE_BOOL: True,
    d.FieldDescriptor.TYPE_FLOAT: 0.5,
    d.FieldDescriptor.TYPE_DOUBLE: 0.25,
    d.FieldDescriptor.TYPE_INT32: -7,
    d.FieldDescriptor.TYPE_INT64: -(2**40),
    d.FieldDescriptor.TYPE_UINT32: 7,
    d.FieldDescriptor.TYPE_UINT64: 2**40,
    d.FieldDescriptor.TYPE_FIXED32: 0xDEADBEEF,
    # Block hashes as KV events carry them: the full 64 bits are used.
    d.FieldDescriptor.TYPE_FIXED64: 0xFEDCBA9876543210,
}


def _sample(field: d.FieldDescriptor) -> object:
    if field.type == d.FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number  # the last, so never the zero default
    return _SCALAR_SAMPLES[field.type]


def fill(message: Message, depth: int = 0) -> Message:
    """Sets every field (the first member of each oneof) to a non-default value."""
    seen_oneofs: set[str] = set()
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        if oneof is not None and not oneof.name.startswith("_"):
            if oneof.name in seen_oneofs:
                continue
            seen_oneofs.add(oneof.name)
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = field.message_type.fields
            if value_field.message_type is None:
                value[_sample(key_field)] = _sample(value_field)
            else:
                fill(value[_sample(key_field)], depth + 1)
        elif field.is_repeated:
            if field.message_type is not None:
                fill(value.add(), depth + 1)
                fill(value.add(), depth + 1)
            else:
                value.extend([_sample(field), _sample(field)])
        elif field.message_type is not None:
            if depth < 4:
                fill(value, depth + 1)
            else:
                value.SetInParent()
        else:
            setattr(message, field.name, _sample(field))
    return message


def all_message_classes() -> list[type[Message]]:
    classes = []
    for module in FAMILIES:
        for name in module.DESCRIPTOR.message_types_by_name:
            classes.append(getattr(module, name))
    return classes


@pytest.mark.parametrize("cls", all_message_classes(), ids=lambda c: c.DESCRIPTOR.full_name)
def test_round_trip_with_every_field_set(cls: type[Message]) -> None:
    original = fill(cls())
    wire = original.SerializeToString()
    parsed = cls.FromString(wire)
    assert parsed == original
    # Every field survived: none of them is at its default after the trip.
    for field in cls.DESCRIPTOR.fields:
        if field.containing_oneof is not None and not field.containing_oneof.name.startswith("_"):
            continue
        if field.is_repeated:
            assert len(getattr(parsed, field.name)) > 0, field.name
        elif field.message_type is not None or field.has_presence:
            assert parsed.HasField(field.name), field.name


def test_every_family_has_messages_and_services() -> None:
    assert len(all_message_classes()) > 40
    services = {s.full_name for m in FAMILIES for s in m.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "cleave.tokenizer.v1.Tokenizer",
        "cleave.encoder.v1.Encoder",
        "cleave.worker.v1.Worker",
        "cleave.kvstore.v1.KvStore",
    }


def test_unset_optional_differs_from_zero() -> None:
    # temperature=0 means greedy; unset means the default of 1.0. The contract must keep them apart.
    params = common_pb2.SamplingParams()
    assert not params.HasField("temperature")
    params.temperature = 0.0
    parsed = common_pb2.SamplingParams.FromString(params.SerializeToString())
    assert parsed.HasField("temperature") and parsed.temperature == 0.0


def test_stream_messages_end_in_typed_complete_or_error() -> None:
    for message in (worker_pb2.GenerateResponse, tokenizer_pb2.DetokenizeStreamResponse):
        kinds = {f.name for f in message.DESCRIPTOR.oneofs_by_name["kind"].fields}
        assert "complete" in kinds and "error" in kinds, message.DESCRIPTOR.full_name


def test_the_kvstore_contract_does_not_depend_on_the_worker_contract() -> None:
    # KvLayout is shared by workers and the kvstore, so it lives in the common contract.
    assert [dep.name for dep in kvstore_pb2.DESCRIPTOR.dependencies] == ["cleave/common/v1/common.proto"]
    assert kvstore_pb2.LookupRequest.DESCRIPTOR.fields_by_name["layout"].message_type is (
        worker_pb2.KvHandoff.DESCRIPTOR.fields_by_name["layout"].message_type
    )
