"""Byte layouts of what aggregation persists and sends: each has a version byte, unknown
versions are rejected loudly."""

import pytest

from processor import Windowed, provenance
from processor.records import Change
from processor.serde import Serdes
from processor.serde import change as change_codec
from processor.serde.change import ChangeSerde
from processor.state import emitted, window_key


def test_change_codec_layout_and_round_trip():
    assert change_codec.encode(b"new", b"old") == b"\x01\x03\x00\x00\x00\x03newold"
    assert change_codec.encode(b"new", None) == b"\x01\x01\x00\x00\x00\x03new"
    assert change_codec.encode(None, b"old") == b"\x01\x02old"
    assert change_codec.encode(None, None) == b"\x01\x00"
    s = ChangeSerde(Serdes.json())
    for c in [Change({"a": 1}, 2), Change(None, ""), Change("", None), Change(None, None)]:
        assert s.deserialize(s.serialize(c)) == c


@pytest.mark.parametrize("data, match", [
    (b"\x02\x00", "unknown change record version 2"),
    (b"\x01\x04", "unknown change record flags"),
    (b"\x01\x01\x00\x00\x00\x09ab", "truncated"),
    (b"\x01\x01\x00\x00\x00\x01abc", "trailing bytes"),
    (b"\x01", "too short"),
])
def test_change_codec_rejects_bad_input(data, match):
    with pytest.raises(ValueError, match=match):
        change_codec.decode(data)


def test_emitted_codec():
    raw = emitted.encode(b"7", 10, 20)
    assert raw == b"\x01\x01" + (10).to_bytes(8, "big") + (20).to_bytes(8, "big") + b"7"
    assert emitted.decode(raw) == emitted.Emitted(b"7", 10, 20)
    assert emitted.decode(emitted.encode(None, 1, 2)) == emitted.Emitted(None, 1, 2)
    with pytest.raises(ValueError, match="version 9"):
        emitted.decode(b"\x09" + raw[1:])
    with pytest.raises(ValueError, match="flags"):
        emitted.decode(b"\x01\x02" + raw[2:])


def test_provenance_header():
    raw = provenance.encode("orders", 3, 42, 1)
    assert raw == b"\x01" + (3).to_bytes(4, "big") + (42).to_bytes(8, "big") + (1).to_bytes(4, "big") + b"orders"
    assert provenance.decode(raw) == provenance.Provenance("orders", 3, 42, 1)
    with pytest.raises(ValueError, match="version 2"):
        provenance.decode(b"\x02" + raw[1:])


def test_window_keys():
    assert window_key.encode(10, b"k") == (10).to_bytes(8, "big") + b"k"
    assert window_key.decode(window_key.encode(10, b"k")) == (10, b"k")
    s = Serdes.windowed(Serdes.string(), 100)
    assert s.serialize(Windowed("k", 200, 300)) == b"k" + (200).to_bytes(8, "big")
    assert s.deserialize(b"k" + (200).to_bytes(8, "big")) == Windowed("k", 200, 300)
