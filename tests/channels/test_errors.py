"""`RecordSerializationError` (channels/errors.py): a batch that does not pack names its
first bad record, the type msgpack rejected and the fix; the task re-blames the step."""

from __future__ import annotations

import pytest

from channels.errors import AbsflowError, RecordSerializationError
from channels.messages import encode_data


def test_a_lone_surrogate_is_named_as_with_msgpack() -> None:
    with pytest.raises(
        RecordSerializationError, match=r"record 1 .* surrogates not allowed.*valid Unicode"
    ):
        encode_data(0, ["fine", "bad \ud800"])


def test_serialization_error_names_record_and_fix() -> None:
    with pytest.raises(RecordSerializationError) as info:
        encode_data(0, ["fine", ("also", "fine"), {1, 2}])
    message = str(info.value)
    assert "record 2" in message
    assert "'set'" in message
    assert "msgpack types" in message
    assert "None, bool, int, float, str, bytes, list/tuple, dict" in message
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, AbsflowError)
    assert isinstance(info.value.__cause__, TypeError)


def test_serialization_error_for_nested_object_names_outer_record() -> None:
    with pytest.raises(RecordSerializationError, match=r"record 0 .* type 'tuple'.*object"):
        encode_data(0, [("k", object())])


def test_serialization_error_for_too_large_int() -> None:
    with pytest.raises(RecordSerializationError, match=r"record 1 .* type 'int'"):
        encode_data(0, [1, 2**64])


def test_serialization_error_names_the_producing_step_once_the_task_knows_it() -> None:
    with pytest.raises(RecordSerializationError) as info:
        encode_data(0, [1, ("a", frozenset({1}))])
    err = info.value
    assert err.step is None and err.index == 1 and err.offending_type == "frozenset"
    named = err.naming("pair")
    assert named.step == "pair" and named.record == ("a", frozenset({1}))
    message = str(named)
    assert message.startswith("step 'pair' emitted a record that cannot cross tasks")
    assert "a 'tuple' holding a 'frozenset'" in message
    assert "convert the frozenset to a list/tuple in step 'pair'" in message


def test_a_batch_whose_records_all_look_packable_still_gets_a_clear_error() -> None:
    err = RecordSerializationError.of_batch([1, "a"], ValueError("too deep"), step="emit")
    assert err.step == "emit" and err.index == -1 and err.offending_type == ""
    assert str(err).startswith("a batch cannot be encoded (too deep)")
    assert "msgpack types" in str(err)
    named = err.naming("emit")
    assert str(named).startswith("step 'emit' emitted a batch that cannot cross tasks")
    assert named.cause == "too deep"


@pytest.mark.parametrize(
    ("record", "leaf", "fix"),
    [
        ({"k": [1, {2: 2**70}]}, "int", "keep ints within 64 bits"),
        ([b"ok", {"s": {3}}], "set", "convert the set to a list/tuple"),
        ({"x": "bad \ud800"}, "str", "strings must be valid Unicode"),
        ((1, 2.5, None, True, object()), "object", "convert the object to one of these"),
    ],
)
def test_the_first_unpackable_part_is_found_however_deep(
    record: object, leaf: str, fix: str
) -> None:
    err = RecordSerializationError.of_batch([0, record], TypeError("no"))
    assert err.index == 1 and err.record == record and err.offending_type == leaf
    assert fix in str(err)


def test_a_packable_batch_has_no_offending_record() -> None:
    ok: list[object] = [
        None,
        True,
        -(2**63),
        2**64 - 1,
        1.5,
        "é",
        b"b",
        bytearray(b"x"),
        [1, (2,)],
        {"a": {}},
    ]
    err = RecordSerializationError.of_batch(ok, TypeError("elsewhere"))
    assert err.offending_type == "" and err.index == -1
