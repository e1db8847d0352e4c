"""KGroupedTable aggregations in the driver: exact output sequences (lists, with timestamps)."""

from processor import Emit, StreamsBuilder
from processor.records import Change
from processor.serde import Serdes
from processor.serde.change import ChangeSerde
from processor.testing import TopologyTestDriver


def ages_by_city(emit=None, kind="sum"):
    b = StreamsBuilder()
    people = b.table("people", value_serde=Serdes.json())
    grouped = people.group_by(lambda k, v: (v["city"], v["age"]))
    if kind == "sum":
        table = grouped.aggregate(lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v,
                                  emit=emit, name="ages")
    elif kind == "count":
        table = grouped.count(emit=emit, name="ages")
    else:
        table = grouped.reduce(lambda agg, v: agg + v, lambda agg, v: agg - v or None, emit=emit, name="ages")
    table.to_stream().to("by-city")
    return b.build()


def out(driver, topic="by-city"):
    return [(r.key, r.value, r.timestamp) for r in driver.read_output(topic)]


def repartition(driver):
    return [(r.key, r.value) for r in driver.read_output(
        "test-app-ages-repartition", Serdes.string(), ChangeSerde(Serdes.json()))]


def test_group_change_moves_a_row_between_groups():
    with TopologyTestDriver(ages_by_city()) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "bob", {"city": "oslo", "age": 40}, timestamp=20)
        assert out(d) == [("oslo", 30, 10), ("oslo", 70, 20)]
        d.pipe_input("people", "alice", {"city": "rome", "age": 30}, timestamp=30)
        # subtract from the old group first, then add to the new one
        assert out(d) == [("oslo", 40, 30), ("rome", 30, 30)]
        assert repartition(d) == [("oslo", Change(30, None)), ("oslo", Change(40, None)),
                                  ("oslo", Change(None, 30)), ("rome", Change(30, None))]
        assert d.get_store("ages").items() == [("oslo", 40), ("rome", 30)]


def test_update_within_a_group_is_one_step_with_no_transient_value():
    with TopologyTestDriver(ages_by_city()) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "bob", {"city": "oslo", "age": 40}, timestamp=20)
        d.read_output("by-city")
        repartition(d)
        d.pipe_input("people", "alice", {"city": "oslo", "age": 31}, timestamp=30)
        assert repartition(d) == [("oslo", Change(31, 30))]   # one record carries both sides (KIP-904)
        assert out(d) == [("oslo", 71, 30)]                  # never the transient 40


def test_delete_reaches_the_aggregate_through_the_subtractor():
    with TopologyTestDriver(ages_by_city()) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "bob", {"city": "oslo", "age": 40}, timestamp=20)
        d.pipe_input("people", "bob", None, timestamp=50)
        d.pipe_input("people", "nobody", None, timestamp=60)   # tombstone for an absent row: nothing
        assert out(d) == [("oslo", 30, 10), ("oslo", 70, 20), ("oslo", 30, 50)]
        assert d.get_store("ages").get_with_timestamp("oslo") == (30, 50)


def test_count_stays_zero_and_reduce_deletes_when_the_last_row_leaves():
    with TopologyTestDriver(ages_by_city(kind="count")) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "alice", None, timestamp=20)
        assert out(d) == [("oslo", 1, 10), ("oslo", 0, 20)]
    with TopologyTestDriver(ages_by_city(kind="reduce")) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "bob", {"city": "oslo", "age": 5}, timestamp=15)
        d.pipe_input("people", "bob", None, timestamp=18)
        d.pipe_input("people", "alice", None, timestamp=20)
        assert out(d) == [("oslo", 30, 10), ("oslo", 35, 15), ("oslo", 30, 18), ("oslo", None, 20)]
        assert d.get_store("ages").items() == []
        assert d.get_store("ages.emitted").items() == []


def test_on_change_suppresses_an_update_that_restores_the_previous_value():
    """A row changes within its group without changing the count: on_update forwards the count
    again, on_change forwards nothing and keeps the timestamp of the last real change."""
    def run(emit):
        with TopologyTestDriver(ages_by_city(emit, kind="count")) as d:
            d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
            d.pipe_input("people", "alice", {"city": "oslo", "age": 31}, timestamp=20)
            d.pipe_input("people", "bob", {"city": "oslo", "age": 40}, timestamp=30)
            return out(d), d.get_store("ages.emitted").get("oslo"), d.metrics()["KTABLE-AGGREGATE-0000000004"]

    got, emitted, m = run(Emit.on_update())
    assert got == [("oslo", 1, 10), ("oslo", 1, 20), ("oslo", 2, 30)]
    assert m["records_emitted"] == 3 and m["noop_updates_skipped"] == 0
    got, emitted, m = run(Emit.on_change())
    assert got == [("oslo", 1, 10), ("oslo", 2, 30)]
    assert emitted == (2, 30, 0)
    assert m["records_emitted"] == 2 and m["noop_updates_skipped"] == 1


def test_on_change_keeps_the_timestamp_of_the_last_real_change():
    with TopologyTestDriver(ages_by_city(kind="count")) as d:
        d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=10)
        d.pipe_input("people", "alice", {"city": "oslo", "age": 31}, timestamp=20)
        assert d.get_store("ages").get_with_timestamp("oslo") == (1, 10)
        assert d.get_store("ages.emitted").get("oslo") == (1, 10, 0)


def test_a_row_in_no_group_is_not_aggregated():
    b = StreamsBuilder()
    t = b.table("people", value_serde=Serdes.json())
    t.group_by(lambda k, v: (v.get("city"), 1)).count(name="n").to_stream().to("counts")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("people", "alice", {"city": "oslo"}, timestamp=1)
        d.pipe_input("people", "alice", {}, timestamp=2)            # leaves oslo, joins no group
        d.pipe_input("people", "alice", {"city": "oslo"}, timestamp=3)
        assert out(d, "counts") == [("oslo", 1, 1), ("oslo", 0, 2), ("oslo", 1, 3)]
        assert d.metrics()["KTABLE-SELECT-0000000001"] == {"no_group": 1}


def test_aggregation_counters():
    with TopologyTestDriver(ages_by_city(Emit.on_change(), kind="count")) as d:
        for i, age in enumerate([30, 31, 32]):
            d.pipe_input("people", "alice", {"city": "oslo", "age": age}, timestamp=i)
        m = d.metrics()["KTABLE-AGGREGATE-0000000004"]
        assert m == {"records_in": 3, "records_emitted": 1, "noop_updates_skipped": 2, "emissions_deferred": 0}


def test_a_selected_null_value_joins_no_group():
    """As Kafka Streams' KTableRepartitionMap: a side whose selected value is None is not sent,
    so no (None<-None) change reaches the aggregate and no tombstone appears for a group with
    no result."""
    b = StreamsBuilder()
    t = b.table("rows", value_serde=Serdes.json())
    t.group_by(lambda k, v: (v["g"], v.get("x"))) \
        .reduce(lambda agg, v: agg + v, lambda agg, v: agg - v, emit=Emit.on_update(), name="r") \
        .to_stream().to("out")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("rows", "a", {"g": "G1", "x": 5}, timestamp=1)
        d.pipe_input("rows", "a", {"g": "G2"}, timestamp=2)
        assert out(d, "out") == [("G1", 5, 1), ("G1", 0, 2)]
        assert [r.key for r in d.read_output("test-app-r-repartition", Serdes.string(), ChangeSerde(Serdes.json()))] \
            == ["G1", "G1"]


def test_aggregate_timestamps_never_go_backwards():
    with TopologyTestDriver(ages_by_city(Emit.on_update(), kind="count")) as d:
        d.pipe_input("people", "a", {"city": "oslo", "age": 1}, timestamp=100)
        d.pipe_input("people", "b", {"city": "oslo", "age": 1}, timestamp=50)
        d.pipe_input("people", "b", {"city": "oslo", "age": 2}, timestamp=40)   # no-op for the count
        assert out(d) == [("oslo", 1, 100), ("oslo", 2, 100), ("oslo", 2, 100)]
        assert d.get_store("ages").get_with_timestamp("oslo") == (2, 100)


def test_an_aggregate_to_stream_sink_writes_the_stored_bytes_and_old_values_reach_table_consumers():
    """A sink reached from an aggregate through value-preserving steps writes the aggregate's
    stored bytes (no second serialization); a table consumer of the aggregate still gets old
    values (the filter needs both sides), while a to_stream child gets none decoded."""
    def build(between):
        b = StreamsBuilder()
        agg = b.table("people", value_serde=Serdes.json()).group_by(lambda k, v: (v["city"], {"n": v["age"]})) \
            .aggregate(lambda: {"n": 0}, lambda k, v, a: {"n": a["n"] + v["n"]},
                       lambda k, v, a: {"n": a["n"] - v["n"]}, name="ages", value_serde=Serdes.json())
        between(agg).to("by-city", value_serde=Serdes.json())
        return b.build()

    plain = build(lambda agg: agg.to_stream())
    mapped = build(lambda agg: agg.to_stream().map_values(lambda v: {**v, "x": 1}))
    filtered = build(lambda agg: agg.filter(lambda k, v: v["n"] > 35).to_stream())
    sinks = {name: next(n for n in t.nodes if n.sink_topic == "by-city").attrs.passthrough
             for name, t in (("plain", plain), ("mapped", mapped), ("filtered", filtered))}
    assert sinks == {"plain": True, "mapped": False, "filtered": True}
    for topo, want in ((plain, [("oslo", {"n": 30}), ("oslo", {"n": 70}), ("oslo", {"n": 30})]),
                       (mapped, [("oslo", {"n": 30, "x": 1}), ("oslo", {"n": 70, "x": 1}),
                                 ("oslo", {"n": 30, "x": 1})]),
                       # 30 fails on both sides: nothing; 70 passes; back to 30 fails on the new side
                       # only, and the old side (70) passes: a tombstone, which needs the old value
                       (filtered, [("oslo", {"n": 70}), ("oslo", None)])):
        with TopologyTestDriver(topo) as d:
            d.pipe_input("people", "alice", {"city": "oslo", "age": 30}, timestamp=1)
            d.pipe_input("people", "bob", {"city": "oslo", "age": 40}, timestamp=2)
            d.pipe_input("people", "bob", None, timestamp=3)
            raw = d.read_output("by-city", Serdes.string(), Serdes.bytes())
            assert [(r.key, None if r.value is None else Serdes.json().deserialize(r.value)) for r in raw] == want
            assert all(r.value is None or r.value == Serdes.json().serialize(Serdes.json().deserialize(r.value))
                       for r in raw)
            assert d.get_store("ages").get("oslo") == {"n": 30}
