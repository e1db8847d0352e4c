"""Serdes: canonical JSON, Avro (with Confluent framing), errors with provenance."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.errors import DeserializationError
from processor.serde import Serdes


def test_json_is_canonical():
    j = Serdes.json()
    assert j.serialize({"b": 1, "a": [1, 2], "é": "ü"}) == '{"a":[1,2],"b":1,"é":"ü"}'.encode()
    assert j.serialize({"a": 1, "b": 2}) == j.serialize({"b": 2, "a": 1})
    assert j.serialize(None) is None and j.deserialize(None) is None
    with pytest.raises(ValueError):
        j.serialize({"x": float("nan")})


_STDLIB_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _stdlib_encode(value):
    try:
        return ("ok", _STDLIB_ENCODER.encode(value).encode("utf-8"))
    except (TypeError, ValueError) as exc:     # ValueError: NaN; UnicodeEncodeError: lone surrogates
        return ("refused", type(exc).__name__)


def _our_encode(value):
    try:
        return ("ok", Serdes.json().serialize(value))
    except (TypeError, ValueError) as exc:
        return ("refused", type(exc).__name__)


_encodable = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 25), max_value=10 ** 25)
    | st.floats() | st.floats(min_value=-1e-3, max_value=1e-3) | st.text()
    | st.sampled_from(["e-mail", "null", "0.00001"]),
    lambda kids: st.lists(kids, max_size=4) | st.tuples(kids, kids)
    | st.dictionaries(st.text(max_size=5), kids, max_size=4)
    | st.dictionaries(st.integers(0, 3), kids, max_size=2),
    max_leaves=12)


@settings(max_examples=1500, deadline=None)
@given(_encodable.filter(lambda v: v is not None))     # (None is a tombstone: no bytes)
def test_json_encodes_exactly_as_the_standard_library(value):
    """orjson's fast path gives the standard library's canonical bytes, and refuses what it
    refuses (the values generated here hold no enums or UUIDs: see below)."""
    assert _our_encode(value) == _stdlib_encode(value)


@pytest.mark.parametrize("value", [
    1e-05, 1.5e-07, -2.5e-300, 5e-324, 1e16, 1e22, 0.0001, 0.00012, 2 ** 64, -(2 ** 63) - 1, 2 ** 63,
    float("nan"), float("inf"), {"x": float("-inf")}, "\ud800", {1: "a", 2: "b"}, {"é": 1, "e": 2, "z": 3},
    [[[[[]]]]] * 3, {"a": None}, True, ("t", 1)])
def test_json_encodes_edge_cases_as_the_standard_library(value):
    assert _our_encode(value) == _stdlib_encode(value)


def test_json_writes_enums_and_uuids_where_the_standard_library_refuses_them():
    """The one documented difference (``processor/serde/__init__.py``): orjson writes enum
    members as their values and UUIDs as strings; the bytes are still canonical."""
    import enum
    import uuid

    class Tier(enum.Enum):
        GOLD = {"b": 1, "a": 2}
        SILVER = "é"

    j = Serdes.json()
    assert j.serialize({"t": Tier.GOLD, "s": Tier.SILVER}) == '{"s":"é","t":{"a":2,"b":1}}'.encode()
    assert j.serialize([uuid.UUID(int=1)]) == b'["00000000-0000-0000-0000-000000000001"]'
    assert _stdlib_encode(Tier.GOLD)[0] == "refused" and _stdlib_encode(uuid.UUID(int=1))[0] == "refused"


def test_json_refuses_subclasses_and_objects_as_the_standard_library():
    import dataclasses
    import datetime

    class MyInt(int):
        def __repr__(self):
            return "MyInt"

    @dataclasses.dataclass
    class Point:
        x: int

    for value in [MyInt(3), {"k": MyInt(4)}, Point(1), datetime.date(2026, 1, 1), object(), {"a": {1, 2}}]:
        assert _our_encode(value) == _stdlib_encode(value), value


def _same(a, b) -> bool:
    """Equal values of equal types all the way down (1 == 1.0 == True in Python; NaN != NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
    return a == b


def _stdlib(data: bytes):
    try:
        return ("ok", json.JSONDecoder().decode(data.decode("utf-8")))
    except (ValueError, RecursionError) as exc:   # JSONDecodeError, UnicodeDecodeError, deep nesting
        return ("refused", type(exc).__name__)


def _ours(data: bytes):
    try:
        return ("ok", Serdes.json().deserialize(data))
    except (ValueError, RecursionError) as exc:
        return ("refused", type(exc).__name__)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=12)


@settings(max_examples=600, deadline=None)
@given(_json_values)
def test_json_decodes_what_the_standard_library_encodes_to_the_same_values(value):
    text = json.dumps(value, ensure_ascii=False).encode("utf-8")
    got, want = _ours(text), _stdlib(text)
    assert got[0] == want[0] and _same(got[1], want[1]), (text, got, want)


@pytest.mark.parametrize("text", [
    b"123456789012345678901234567890", b"-9223372036854775809", b"9223372036854775807",
    b'{"big": 18446744073709551616, "x": 1.5}', b"1e400", b"-1e400", b"NaN", b"Infinity",
    b"-0", b"-0.0", b"1E5", b"0.1000000000000000055511151231257827", b'"\\ud800"',
    b'{"a":1,"a":2}', b"\xef\xbb\xbf{}", b"\xff", b"[1,]", b"{}x", b"", b"  7 ", b'"\t"',
    b'"tab\there"', b"[" * 2000 + b"]" * 2000,
    b"[1234567890,123456789,1]", b'{"t":12345678901234567890}', b"[1.5e-7,12345678901234567890]"])
def test_json_decodes_edge_cases_as_the_standard_library(text):
    got, want = _ours(text), _stdlib(text)
    if want[0] == "refused":
        assert got[0] == "refused", (text, got)
    else:
        assert got[0] == "ok" and _same(got[1], want[1]), (text, got, want)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_json_refuses_exactly_what_the_standard_library_refuses(data):
    got, want = _ours(data), _stdlib(data)
    assert got[0] == want[0], (data, got, want)
    if got[0] == "ok":
        assert _same(got[1], want[1]), (data, got, want)


_EDGE_TEXTS = [
    b"123456789012345678901234567890", b"1e400", b"NaN", b"Infinity", b'"\\ud800"', b"\xff", b"[1,]",
    b"{}x", b"", b"  7 ", b'"\t"', b'{"a":1,"a":2}', b"\xef\xbb\xbf{}", b"[" * 200 + b"]" * 200,
    b"[" * 255 + b"]" * 255, b"[" * 2000 + b"]" * 2000, b"[" * 2000, b'{"customer":"c-1","amount":5}']


def _check_outcome(serde, data):
    try:
        serde.check(data)
        return "ok"
    except Exception:
        return "refused"


@pytest.mark.parametrize("text", _EDGE_TEXTS)
def test_json_check_refuses_exactly_what_deserialize_refuses(text):
    serde = Serdes.json()
    assert _check_outcome(serde, text) == _ours(text)[0], text


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=40), _json_values.map(lambda v: json.dumps(v).encode())))
def test_json_check_agrees_with_deserialize_on_any_bytes(data):
    serde = Serdes.json()
    assert _check_outcome(serde, data) == _ours(data)[0], data


def test_string_and_bytes():
    assert Serdes.string().serialize("héllo") == "héllo".encode()
    assert Serdes.string().deserialize(b"abc") == "abc"
    assert Serdes.bytes().serialize(b"\x00\x01") == b"\x00\x01"
    with pytest.raises(TypeError):
        Serdes.string().serialize(5)


ORDER = {"id": "o1", "customer_id": "c1", "amount": 1234, "status": "PAID"}


def test_avro_from_schemas_dir_roundtrip_and_framing():
    plain = Serdes.avro("order")
    framed = Serdes.avro("order.avsc", schema_id=7)
    body = plain.serialize(ORDER)
    wire = framed.serialize(ORDER)
    assert wire == b"\x00\x00\x00\x00\x07" + body
    assert plain.deserialize(body) == ORDER
    assert framed.deserialize(wire) == ORDER
    with pytest.raises(ValueError, match="schema id 9"):
        framed.deserialize(b"\x00\x00\x00\x00\x09" + body)
    with pytest.raises(ValueError, match="magic byte 1"):
        framed.deserialize(b"\x01\x00\x00\x00\x07" + body)
    with pytest.raises(ValueError, match="trailing"):
        plain.deserialize(body + b"xx")


def test_avro_schema_dict():
    s = Serdes.avro({"type": "record", "name": "P", "fields": [{"name": "x", "type": "long"}]})
    assert s.deserialize(s.serialize({"x": 5})) == {"x": 5}
    assert s == Serdes.avro({"type": "record", "name": "P", "fields": [{"name": "x", "type": "long"}]})


def test_deserialization_error_names_topic_partition_offset_and_step():
    from processor.testing import TopologyTestDriver

    b = StreamsBuilder()
    b.table("orders", value_serde=Serdes.avro("order")).to_stream().to("out")
    with TopologyTestDriver(b.build(), on_error="fail") as d:
        d.pipe_input("orders", "o1", ORDER, timestamp=1)
        with pytest.raises(DeserializationError) as info:
            d.pipe_raw("orders", b"o2", b"\xff\xff", timestamp=2)
    err = info.value
    assert (err.topic, err.partition, err.offset, err.step) == ("orders", 0, 1, "KTABLE-SOURCE-0000000000")
    assert str(err).startswith("record orders[0]@1, step KTABLE-SOURCE-0000000000: value deserialization")
