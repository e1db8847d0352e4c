"""Serdes: canonical JSON, Avro (with Confluent framing), errors with provenance."""

import pytest

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
