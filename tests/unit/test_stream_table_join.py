"""Stream-table joins in the test driver: each stream record meets the table's current row."""

import pytest

from processor import StreamsBuilder
from processor.errors import TopologyError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def build(how, table_transform=lambda t: t):
    b = StreamsBuilder()
    clicks = b.stream("clicks")
    users = table_transform(b.table("users"))
    getattr(clicks, "join" if how == "inner" else "left_join")(users, lambda c, u: [c, u]).to("out")
    return b.build()


def out(d):
    return [(r.key, r.value, r.timestamp) for r in d.read_output("out")]


def test_inner_and_left_exact_sequences_table_updates_trigger_nothing():
    for how in ("inner", "left"):
        with TopologyTestDriver(build(how)) as d:
            d.pipe_input("clicks", "u1", "c0", timestamp=1)
            d.pipe_input("users", "u1", "ann", timestamp=50)
            d.pipe_input("clicks", "u1", "c1", timestamp=2)    # the stream record's timestamp
            d.pipe_input("users", "u1", "bob", timestamp=60)
            d.pipe_input("clicks", "u1", "c2", timestamp=70)
            d.pipe_input("users", "u1", None, timestamp=80)
            d.pipe_input("clicks", "u1", "c3", timestamp=90)
            d.pipe_input("clicks", None, "c4", timestamp=91)   # no key: cannot be looked up
            d.pipe_input("clicks", "u1", None, timestamp=92)   # no value: nothing to join
            want = [("u1", ["c1", "ann"], 2), ("u1", ["c2", "bob"], 70)]
            if how == "left":   # KIP-962: a left join forwards a record without a key, joined with nothing
                want = [("u1", ["c0", None], 1)] + want + [("u1", ["c3", None], 90), (None, ["c4", None], 91)]
            assert out(d) == want
            m = d.metrics()["KSTREAM-JOIN-0000000002"]
            assert m == {"no_match": 2 if how == "inner" else 0, "skipped_null_key": 1 if how == "inner" else 0,
                         "skipped_null_value": 1}


def test_join_with_a_filtered_table_sees_the_filtered_rows():
    with TopologyTestDriver(build("left", lambda t: t.filter(lambda k, v: v != "bob"))) as d:
        d.pipe_input("users", "u1", "bob", timestamp=1)
        d.pipe_input("clicks", "u1", "c1", timestamp=2)
        d.pipe_input("users", "u1", "ann", timestamp=3)
        d.pipe_input("clicks", "u1", "c2", timestamp=4)
        assert out(d) == [("u1", ["c1", None], 2), ("u1", ["c2", "ann"], 4)]


def test_stream_and_table_are_one_sub_topology_and_outer_is_refused():
    t = build("inner")
    assert len(t.subtopologies) == 1
    assert "KSTREAM-JOIN-0000000002 (stores: [users-STATE-STORE-0000000001])" in t.describe()
    b = StreamsBuilder()
    with pytest.raises(TopologyError, match="inner or left"):
        b.stream("s").outer_join(b.table("t"), lambda a, c: a)
    b = StreamsBuilder()
    agg = b.stream("s").group_by_key().count()
    b.stream("x").join(agg, lambda v, n: [v, n]).to("out", value_serde=Serdes.json())
    with TopologyTestDriver(b.build()) as d:   # an aggregate is looked up as last emitted
        d.pipe_input("s", "k", 1, timestamp=1)
        d.pipe_input("s", "k", 1, timestamp=2)
        d.pipe_input("x", "k", "v", timestamp=3)
        assert out(d) == [("k", ["v", 2], 3)]
