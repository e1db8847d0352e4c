"""The replay filter (processor/engine/replay_filter.py): an internal record at or below its
source's high-water mark is dropped; a bad provenance header is an error naming the task."""

import pytest

from processor import provenance
from processor.engine.replay_filter import ReplayFilter
from processor.errors import DeserializationError
from processor.state.memory import MemoryStore


def _headers(topic, partition, offset, seq):
    return [("other", b"x"), (provenance.HEADER, provenance.encode(topic, partition, offset, seq))]


def _apply(f, store, topic, headers):
    got = f.check(topic, headers)
    if got:
        store.put(*got)
    return got


def test_records_at_or_below_the_mark_are_dropped_per_source_partition():
    store = MemoryStore("_bookkeeping")
    f = ReplayFilter(store, "task 1_0")
    seen = [bool(_apply(f, store, "rep", _headers(src, p, off, seq))) for src, p, off, seq in [
        ("in", 0, 5, 0), ("in", 0, 5, 1), ("in", 0, 5, 1), ("in", 0, 4, 9), ("in", 1, 4, 9),
        ("in", 0, 6, 0), ("éin", 0, 1, 0), ("éin", 0, 1, 0)]]
    assert seen == [True, True, False, False, True, True, True, False]
    sources = [("in", 0), ("in", 1), ("éin", 0)]
    assert sorted(store._data) == sorted(provenance.mark_key("rep", t, p) for t, p in sources)
    assert provenance.decode_mark(store.get(provenance.mark_key("rep", "in", 0))) == (6, 0)
    assert f.check("rep", [("other", b"x")]) is None


@pytest.mark.parametrize("raw", [b"\x01\x00", provenance.encode("in", 0, 1, 0)[:-2] + b"\xff\xfe",
                                 b"\x02" + provenance.encode("in", 0, 1, 0)[1:]])
def test_a_bad_header_names_the_task(raw):
    f = ReplayFilter(MemoryStore("_bookkeeping"), "task 1_0")
    with pytest.raises(DeserializationError) as exc:
        f.check("rep", [(provenance.HEADER, raw)])
    assert "bad processor.source header" in str(exc.value) and "task 1_0" in str(exc.value)
