"""Kafka's number and UUID serdes (``Serdes.long() / integer() / short() / float() / double() /
uuid()``): the exact bytes Java's serializers write, wrong sizes as deserialization errors under
the on-error policy, and the serdes as keys, values and operator state in the driver.

The expected bytes below were printed by a JDK 17 program (``ByteBuffer.putLong / putInt /
putShort``, ``Float.floatToRawIntBits``, ``Double.doubleToLongBits``, ``UUID.toString()`` as
UTF-8), which is what Kafka's LongSerializer, IntegerSerializer, ShortSerializer, FloatSerializer,
DoubleSerializer and UUIDSerializer write.
"""

import math
import pickle
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.errors import DeserializationError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

JAVA_BYTES = [
    (Serdes.long(), 1, "0000000000000001"),
    (Serdes.long(), -1, "ffffffffffffffff"),
    (Serdes.long(), 0, "0000000000000000"),
    (Serdes.long(), 2 ** 63 - 1, "7fffffffffffffff"),
    (Serdes.long(), -2 ** 63, "8000000000000000"),
    (Serdes.long(), 1234567890123, "0000011f71fb04cb"),
    (Serdes.integer(), 1, "00000001"),
    (Serdes.integer(), -1, "ffffffff"),
    (Serdes.integer(), 258, "00000102"),
    (Serdes.integer(), 2 ** 31 - 1, "7fffffff"),
    (Serdes.integer(), -2 ** 31, "80000000"),
    (Serdes.integer(), -2, "fffffffe"),
    (Serdes.short(), 1, "0001"),
    (Serdes.short(), -1, "ffff"),
    (Serdes.short(), 32767, "7fff"),
    (Serdes.short(), -32768, "8000"),
    (Serdes.short(), 300, "012c"),
    (Serdes.float(), 1.0, "3f800000"),
    (Serdes.float(), -2.5, "c0200000"),
    (Serdes.float(), 0.1, "3dcccccd"),
    (Serdes.float(), 0.0, "00000000"),
    (Serdes.float(), -0.0, "80000000"),
    (Serdes.float(), math.inf, "7f800000"),
    (Serdes.float(), math.nan, "7fc00000"),
    (Serdes.float(), 1.401298464324817e-45, "00000001"),     # Float.MIN_VALUE
    (Serdes.float(), 3.4028234663852886e38, "7f7fffff"),     # Float.MAX_VALUE
    (Serdes.double(), 1.0, "3ff0000000000000"),
    (Serdes.double(), -2.5, "c004000000000000"),
    (Serdes.double(), 0.1, "3fb999999999999a"),
    (Serdes.double(), -0.0, "8000000000000000"),
    (Serdes.double(), -math.inf, "fff0000000000000"),
    (Serdes.double(), math.nan, "7ff8000000000000"),
    (Serdes.double(), 5e-324, "0000000000000001"),           # Double.MIN_VALUE
    (Serdes.double(), 1e300, "7e37e43c8800759c"),
    (Serdes.uuid(), uuid.UUID("123e4567-e89b-12d3-a456-426614174000"),
     "31323365343536372d653839622d313264332d613435362d343236363134313734303030"),
]


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b


@pytest.mark.parametrize("serde,value,hexbytes", JAVA_BYTES, ids=lambda x: repr(x))
def test_bytes_are_javas_both_ways(serde, value, hexbytes):
    data = bytes.fromhex(hexbytes)
    assert serde.serialize(value) == data
    back = serde.deserialize(data)
    # (0.1 is no binary32: Java's 0.1f, read as a double, is 0.10000000149011612)
    want = 0.10000000149011612 if (serde.name, value) == ("float", 0.1) else value
    assert _same(back, want) and type(back) is type(value)


def test_the_examples_of_the_issue():
    assert Serdes.long().serialize(1) == b"\x00" * 7 + b"\x01"
    assert Serdes.long().serialize(-1) == b"\xff" * 8
    assert Serdes.uuid().serialize(uuid.UUID(int=0)) == b"00000000-0000-0000-0000-000000000000"


def test_none_is_no_bytes_both_ways():
    for serde in (Serdes.long(), Serdes.integer(), Serdes.short(), Serdes.float(), Serdes.double(), Serdes.uuid()):
        assert serde.serialize(None) is None and serde.deserialize(None) is None
        serde.check(None)


@pytest.mark.parametrize("serde,size", [(Serdes.long(), 8), (Serdes.integer(), 4), (Serdes.short(), 2),
                                        (Serdes.float(), 4), (Serdes.double(), 8)])
def test_any_other_size_is_refused_by_deserialize_and_check(serde, size):
    java = {"long": "Long", "integer": "Integer", "short": "Short", "float": "Float", "double": "Double"}[serde.name]
    for n in sorted({0, 1, size - 1, size + 1, 16}):
        with pytest.raises(ValueError, match=rf"^{serde.name} serde expects exactly {size} bytes "
                                             rf"\(Kafka's {java}Deserializer\), got {n}$"):
            serde.deserialize(b"\x01" * n)
        with pytest.raises(ValueError, match=f"got {n}$"):
            serde.check(b"\x01" * n)
    serde.check(b"\x01" * size)


def test_uuid_reads_either_case_and_refuses_anything_else():
    s = Serdes.uuid()
    u = uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
    assert s.deserialize(b"123E4567-E89B-12D3-A456-426614174000") == u
    assert s.serialize(s.deserialize(b"123E4567-E89B-12D3-A456-426614174000")) == str(u).encode()
    for bad in (b"123e4567e89b12d3a456426614174000", b"{123e4567-e89b-12d3-a456-426614174000}",
                b"urn:uuid:123e4567-e89b-12d3-a456-426614174000", b"123e4567-e89b-12d3-a456-42661417400g",
                b"123e4567-e89b-12d3-a456-4266141740000", b"1-2-3-4-5", b"", b"\xff" * 36,
                b"123e4567-e89b-12d3-a456-426614174000\n"):
        with pytest.raises(ValueError, match="uuid serde: "):
            s.deserialize(bad)
        with pytest.raises(ValueError, match="uuid serde: "):
            s.check(bad)


def test_values_of_the_wrong_type_or_range_are_refused_on_serialize():
    cases = [(Serdes.long(), 2 ** 63, ValueError, r"out of range \[-9223372036854775808, 9223372036854775807\]"),
             (Serdes.long(), -2 ** 63 - 1, ValueError, "out of range"),
             (Serdes.integer(), 2 ** 31, ValueError, "out of range"),
             (Serdes.short(), -32769, ValueError, "out of range"),
             (Serdes.long(), True, TypeError, "long serde expects int, got bool"),
             (Serdes.long(), 1.0, TypeError, "long serde expects int, got float"),
             (Serdes.integer(), "1", TypeError, "integer serde expects int, got str"),
             (Serdes.float(), 1e39, ValueError, "beyond the range of a 32-bit float"),
             (Serdes.float(), "1.5", TypeError, "float serde expects float, got str"),
             (Serdes.double(), False, TypeError, "double serde expects float, got bool"),
             (Serdes.uuid(), "123e4567-e89b-12d3-a456-426614174000", TypeError, "uuid serde expects uuid.UUID")]
    for serde, value, exc, message in cases:
        with pytest.raises(exc, match=message):
            serde.serialize(value)
    # ints are floats' values too; a float rounds to binary32
    assert Serdes.double().serialize(3) == Serdes.double().serialize(3.0)
    assert Serdes.float().deserialize(Serdes.float().serialize(0.1)) == 0.10000000149011612


def test_every_nan_is_javas_canonical_nan():
    negative_nan = -math.nan
    assert Serdes.double().serialize(negative_nan) == bytes.fromhex("7ff8000000000000")
    assert Serdes.float().serialize(negative_nan) == bytes.fromhex("7fc00000")


@settings(max_examples=300, deadline=None)
@given(st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(allow_nan=False, width=32), st.floats(allow_nan=False))
def test_round_trips_and_big_endian_order(n, f32, f64):
    for serde, bits in ((Serdes.long(), 64), (Serdes.integer(), 32), (Serdes.short(), 16)):
        v = n % (1 << bits) - (1 << (bits - 1))
        data = serde.serialize(v)
        assert len(data) == bits // 8 and serde.deserialize(data) == v
        assert int.from_bytes(data, "big", signed=True) == v
    assert Serdes.float().deserialize(Serdes.float().serialize(f32)) == f32
    assert Serdes.double().deserialize(Serdes.double().serialize(f64)) == f64


def test_serdes_are_singletons_equal_by_kind_and_pickle():
    kinds = [Serdes.long(), Serdes.integer(), Serdes.short(), Serdes.float(), Serdes.double(), Serdes.uuid()]
    assert [repr(s) for s in kinds] == ["Serdes.long()", "Serdes.integer()", "Serdes.short()", "Serdes.float()",
                                        "Serdes.double()", "Serdes.uuid()"]
    assert len(set(kinds)) == 6 and all(pickle.loads(pickle.dumps(s)) == s for s in kinds)
    assert Serdes.long() != Serdes.double()


# -- in the test driver: errors under the policy -------------------------------------------------------
def _long_values_topology():
    b = StreamsBuilder()
    b.stream("numbers", key_serde=Serdes.string(), value_serde=Serdes.long()) \
        .map_values(lambda v: v * 2).to("doubled", value_serde=Serdes.long())
    return b.build()


def _pipe_numbers(d):
    d.pipe_raw("numbers", b"a", bytes.fromhex("0000000000000005"), timestamp=1)
    d.pipe_raw("numbers", b"b", bytes.fromhex("00000005"), timestamp=2)          # an Integer: 4 bytes
    d.pipe_raw("numbers", b"c", bytes.fromhex("ffffffffffffffff"), timestamp=3)


def test_a_value_of_the_wrong_size_is_dead_lettered_naming_record_and_step():
    with TopologyTestDriver(_long_values_topology(), application_id="app", on_error="dlq") as d:
        _pipe_numbers(d)
        assert [(r.key, r.value, r.timestamp) for r in d.read_output("doubled")] == [("a", 10, 1), ("c", -2, 3)]
        dlq = d.read_output("app-dlq")
        assert [(r.key, r.value, r.timestamp) for r in dlq] == [(b"b", b"\x00\x00\x00\x05", 2)]
        h = dict(dlq[0].headers)
        assert h["__streams.errors.message"] == (
            b"record numbers[0]@1, step KSTREAM-SOURCE-0000000000: value deserialization with Serdes.long() "
            b"failed: ValueError: long serde expects exactly 8 bytes (Kafka's LongDeserializer), got 4")
        assert (h["__streams.errors.topic"], h["__streams.errors.partition"], h["__streams.errors.offset"]) == \
            (b"numbers", b"0", b"1")
        assert h["processor.errors.step"] == b"KSTREAM-SOURCE-0000000000"


def test_the_sink_writes_javas_bytes():
    with TopologyTestDriver(_long_values_topology(), application_id="app") as d:
        _pipe_numbers(d)
        assert [r.value for r in d.read_output("doubled", Serdes.string(), Serdes.bytes())] == \
            [bytes.fromhex("000000000000000a"), bytes.fromhex("fffffffffffffffe")]


def test_a_value_of_the_wrong_size_is_skipped_under_skip():
    with TopologyTestDriver(_long_values_topology(), application_id="app", on_error="skip") as d:
        _pipe_numbers(d)
        assert [(r.key, r.value, r.timestamp) for r in d.read_output("doubled")] == [("a", 10, 1), ("c", -2, 3)]
        assert d.read_output("app-dlq") == []


def test_a_value_of_the_wrong_size_is_fatal_under_fail():
    with TopologyTestDriver(_long_values_topology(), application_id="app", on_error="fail") as d:
        d.pipe_raw("numbers", b"a", bytes.fromhex("0000000000000005"), timestamp=1)
        with pytest.raises(DeserializationError) as info:
            d.pipe_raw("numbers", b"b", b"\x00" * 9, timestamp=2)
        assert [(r.key, r.value) for r in d.read_output("doubled")] == [("a", 10)]
    err = info.value
    assert (err.topic, err.partition, err.offset, err.step) == ("numbers", 0, 1, "KSTREAM-SOURCE-0000000000")
    assert str(err) == ("record numbers[0]@1, step KSTREAM-SOURCE-0000000000: value deserialization with "
                        "Serdes.long() failed: ValueError: long serde expects exactly 8 bytes (Kafka's "
                        "LongDeserializer), got 9")


def test_a_key_that_is_not_a_uuid_is_dead_lettered():
    b = StreamsBuilder()
    b.table("devices", key_serde=Serdes.uuid(), value_serde=Serdes.double(), store_name="devices")
    u = uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
    with TopologyTestDriver(b.build(), application_id="app") as d:
        d.pipe_raw("devices", str(u).encode(), bytes.fromhex("c004000000000000"), timestamp=1)
        d.pipe_raw("devices", b"not-a-uuid", bytes.fromhex("3ff0000000000000"), timestamp=2)
        d.pipe_raw("devices", str(u).encode(), bytes.fromhex("3ff00000"), timestamp=3)     # a Float's 4 bytes
        assert d.get_store("devices").items() == [(u, -2.5)]
        msgs = [dict(r.headers)["__streams.errors.message"] for r in d.read_output("app-dlq")]
    assert msgs == [b"record devices[0]@1, step KTABLE-SOURCE-0000000000: key deserialization with Serdes.uuid() "
                    b"failed: ValueError: uuid serde: 'not-a-uuid' is not a UUID (8-4-4-4-12 hex digits)",
                    b"record devices[0]@2, step KTABLE-SOURCE-0000000000: value deserialization with "
                    b"Serdes.double() failed: ValueError: double serde expects exactly 8 bytes (Kafka's "
                    b"DoubleDeserializer), got 4"]


# -- in the test driver: keys, values and operator state ---------------------------------------------
def test_count_with_long_values_reads_back_as_java_longs():
    """A count whose state and output are Kafka longs, grouped by an Integer key through a
    repartition topic: the store, the changelog-shaped output and the repartition records are
    Java's bytes."""
    b = StreamsBuilder()
    b.stream("clicks", key_serde=Serdes.string(), value_serde=Serdes.integer()) \
        .group_by(lambda k, v: v % 3, key_serde=Serdes.integer()) \
        .count(name="clicks-by-mod", value_serde=Serdes.long()) \
        .to_stream().to("counts", key_serde=Serdes.integer(), value_serde=Serdes.long())
    topo = b.build()
    clicks = [("u1", 4), ("u2", 7), ("u1", 9), ("u3", 10), ("u2", 3), ("u1", -2)]
    with TopologyTestDriver(topo, application_id="app") as d:
        for i, (k, v) in enumerate(clicks):
            d.pipe_input("clicks", k, v, timestamp=i)
        raw = d.read_output("counts", Serdes.bytes(), Serdes.bytes())
        store = d.get_store("clicks-by-mod").items()
    # the model: a running count per v % 3 (Python's modulo: -2 % 3 == 1)
    model, expected = {}, []
    for i, (_, v) in enumerate(clicks):
        model[v % 3] = model.get(v % 3, 0) + 1
        expected.append((v % 3, model[v % 3], i))
    assert [(Serdes.integer().deserialize(r.key), Serdes.long().deserialize(r.value), r.timestamp)
            for r in raw] == expected
    assert [(r.key, r.value) for r in raw][:3] == [(b"\x00\x00\x00\x01", b"\x00" * 7 + b"\x01"),
                                                   (b"\x00\x00\x00\x01", b"\x00" * 7 + b"\x02"),
                                                   (b"\x00\x00\x00\x00", b"\x00" * 7 + b"\x01")]
    assert sorted(store) == sorted(model.items()) == [(0, 2), (1, 4)]


def test_table_with_long_keys_and_double_values_aggregated_by_short_keys():
    b = StreamsBuilder()
    prices = b.table("prices", key_serde=Serdes.long(), value_serde=Serdes.double(), store_name="prices")
    prices.group_by(lambda k, v: (k % 2, v), key_serde=Serdes.short(), value_serde=Serdes.double()) \
        .aggregate(lambda: 0.0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="sum-by-parity",
                   value_serde=Serdes.double()) \
        .to_stream().to("sums", key_serde=Serdes.short(), value_serde=Serdes.double())
    with TopologyTestDriver(b.build(), application_id="app") as d:
        for i, (k, v) in enumerate([(1, 1.5), (2, 0.25), (3, 2.0), (1, 0.5), (2, None)]):
            d.pipe_input("prices", k, v, timestamp=i)
        out = [(r.key, r.value, r.timestamp) for r in d.read_output("sums")]
        assert d.get_store("prices").items() == [(1, 0.5), (3, 2.0)]
        assert d.get_store("sum-by-parity").items() == [(0, 0.0), (1, 2.5)]
    # key 1 changes 1.5 -> 0.5 in one step (same group: KIP-904); key 2's tombstone subtracts
    assert out == [(1, 1.5, 0), (0, 0.25, 1), (1, 3.5, 2), (1, 2.5, 3), (0, 0.0, 4)]
