"""Which table sources the backfill reduces to their last real changes, and the reduction itself
(pure: no broker, no Spark). The reduction is also checked end to end by the differential tests
(filter_map, fk_joins: every store byte-identical to the driver's full replay)."""

from backfill.compaction import compaction_plan
from backfill.compaction import last_changes as _last_changes
from processor import Emit, StreamsBuilder
from processor.testing import TopologyTestDriver


def row(offset, key, value, ts=None):
    return ("input", "t", 0, key, value, ts if ts is not None else 100 + offset, None, "", offset, 0)


def test_last_two_real_changes_per_key_in_offset_order():
    rows = [row(0, b"a", b"1"), row(1, b"a", b"1"), row(2, b"b", None), row(3, b"a", b"2"),
            row(4, b"c", b"9"), row(5, b"a", b"2"), row(6, b"c", None), row(7, b"c", None),
            row(8, b"d", b"5"), row(9, b"a", b"3"), row(10, b"a", b"3")]
    kept = _last_changes(rows)
    # a: changes at 0 (1), 3 (2), 9 (3): keeps 3 and 9 (9 is the last REAL change: 10 is a no-op)
    # b: a tombstone of an absent key is no change; c: 4 (9) then 6 (delete); d: 8
    assert [r[8] for r in kept] == [3, 4, 6, 8, 9]


def _topologies():
    b = StreamsBuilder()
    orders = b.table("orders")
    customers = b.table("customers")
    big = orders.filter(lambda k, v: v["n"] > 1).map_values(lambda v: v["n"])
    big.to_stream().to("big")
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: [o, c], how="left").to_stream().to("fk")
    agg_src = b.table("agg-src")
    agg_src.group_by(lambda k, v: (v["g"], 1)).count(emit=Emit.on_change()).to_stream().to("counts")
    pk_l, pk_r = b.table("pk-l"), b.table("pk-r")
    pk_l.join(pk_r, lambda x, y: [x, y]).to_stream().to("pk")
    as_stream = b.table("as-stream")
    as_stream.to_stream().filter(lambda k, v: True).peek(lambda k, v: None).map_values(lambda v: v).to("s")
    as_events = b.table("as-events")
    as_events.to_stream().filter(lambda k, v: True).group_by_key().count(name="events")
    looked_up = b.table("looked-up")
    b.stream("events").join(looked_up, lambda e, t: [e, t]).to("joined")
    return b.build()


def test_only_sources_whose_readers_end_the_same_are_compacted():
    refusals: dict = {}
    plan = compaction_plan(_topologies(), refusals=refusals)
    assert sorted(plan) == ["as-stream", "customers", "orders"]
    assert plan["orders"] == "last real changes per key (foreign-key join, table sink)"
    assert plan["customers"] == "last real changes per key (foreign-key join)"   # its right side: transparent
    # stateless stream steps past to_stream() ending in a sink: no store sees their records
    assert plan["as-stream"] == "last real changes per key (stateless stream steps to sinks)"
    # every refused table names the reader that needs every record
    assert sorted(refusals) == ["agg-src", "as-events", "looked-up", "pk-l", "pk-r"]
    assert all(r.startswith("every record replayed (") for r in refusals.values())
    assert "(group-by)" in refusals["agg-src"] and "depends on the history" in refusals["agg-src"]
    assert "reads the table's changes as a stream" in refusals["as-events"]
    assert "looks the table up" in refusals["looked-up"]


def test_replaying_the_last_two_changes_leaves_the_stores_of_a_full_replay():
    """The driver fed (a) every record and (b) only the kept ones ends with identical tables and
    join results. (The driver numbers offsets itself, so the provenance-carrying version and
    subscription stores are compared where offsets are real: the differential fk_joins case.)"""
    import random

    rnd = random.Random(3)
    history = []
    for _i in range(600):
        if rnd.random() < 0.7:
            k = f"o{rnd.randrange(40)}"
            v = None if rnd.random() < 0.1 else {"n": rnd.randrange(4), "c": f"c{rnd.randrange(8)}"}
            history.append(("orders", k, v))
        else:
            history.append(("customers", f"c{rnd.randrange(8)}", {"r": rnd.randrange(3)}))

    def stores(records):
        topo = _topologies()
        with TopologyTestDriver(topo) as d:
            for off, (topic, k, v) in records:
                d.pipe_input(topic, k, v, timestamp=1000 + off)
            return {name: sorted(d.get_store(name)._stores[0].items()) for name in topo.stores
                    if name.startswith(("orders", "customers", "KTABLE-FK"))}

    full = stores(list(enumerate(history)))
    from processor.serde import Serdes

    js = Serdes.json()
    kept = []
    for topic in ("orders", "customers"):
        rows = [("input", topic, 0, k.encode(), js.serialize(v), 1000 + off, None, "", off, 0)
                for off, (t, k, v) in enumerate(history) if t == topic]
        kept += [(r[8], (topic, r[3].decode(), js.deserialize(r[4]) if r[4] is not None else None))
                 for r in _last_changes(rows)]
    kept.sort()
    assert len(kept) < len(history) / 3
    compacted = stores(kept)
    assert sorted(full) == sorted(compacted) and len(full) >= 5
    for name in full:
        if name.endswith(("-version-store", "-subscription-store")):
            assert [k for k, _ in compacted[name]] == [k for k, _ in full[name]], name
        elif name.startswith("KTABLE-FK-JOIN"):
            # the join result: same keys and values; the timestamp may differ (docs/backfill.md "Same stores")
            assert [(k, v[8:]) for k, v in compacted[name]] == [(k, v[8:]) for k, v in full[name]], name
        else:
            assert compacted[name] == full[name], name


def test_poison_records_are_kept_whatever_follows_them():
    from processor.serde import Serdes

    rows = [row(0, b"a", b'{"x":1}'), row(1, None, b'{"x":2}'), row(2, b"a", b"not json"),
            row(3, b"a", b'{"x":3}'), row(4, b"a", b'{"x":4}')]
    kept = _last_changes(rows, Serdes.string(), Serdes.json())
    # the keyless record and the undeserializable one stay (the task dead-letters them, as a full
    # replay does); of the real changes, the last two
    assert [r[8] for r in kept] == [1, 2, 3, 4]


def test_with_emit_outputs_only_sources_whose_sinks_carry_an_empty_table_are_compacted():
    """``--emit-outputs``: a source is reduced only when every user sink downstream carries a
    table (its final table is the result) that held no record at the snapshot, with no table
    map_values or foreign-key join between (but a transparent one); ``refusals`` names why the
    others replay every record."""
    def topo():
        b = StreamsBuilder()
        orders, customers = b.table("orders"), b.table("customers")
        orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: [o, c], how="left") \
            .to_stream().to("joined")
        b.table("plain").filter(lambda k, v: v["n"] > 1).to_stream().to("big")
        b.table("mapped").map_values(lambda v: v["n"] % 2).to_stream().to("parity")
        b.table("streamed").filter(lambda k, v: True).to_stream().filter(lambda k, v: True).to("s")
        return b.build()

    assert sorted(compaction_plan(topo())) == ["customers", "mapped", "orders", "plain", "streamed"]
    refusals: dict = {}
    plan = compaction_plan(topo(), emit_outputs=True, refusals=refusals)
    assert sorted(plan) == ["customers", "plain"]   # the join's right side: transparent
    assert sorted(refusals) == ["mapped", "orders", "streamed"]
    assert "(a table map_values) skips unchanged results" in refusals["mapped"]
    assert "(a foreign-key join) skips unchanged results" in refusals["orders"]
    assert "s is a stream sink" in refusals["streamed"]
    assert all(r.startswith("every record replayed (--emit-outputs: ") for r in refusals.values())
    # a sink that already holds records: its tombstones need the history
    refusals = {}
    plan = compaction_plan(topo(), emit_outputs=True, held_outputs={"big"}, refusals=refusals)
    assert sorted(plan) == ["customers"] and refusals["plain"] == (
        "every record replayed (--emit-outputs: big already holds records: its tombstones need the history)")
    # without outputs the held sinks do not matter
    assert "plain" in compaction_plan(topo(), held_outputs={"big"})


def test_an_aggregation_of_a_foreign_key_joins_results_reduces_only_through_transparent_joins():
    """What reads a foreign-key join's results may be anything (an aggregation) for a source that
    reaches the join straight, as its right side or as an inner join's left side: the backfill
    gives the results the same changes from the reduced history (``transparent_joins``; checked
    end to end, byte for byte against --no-compaction, in test_backfill_fk_reduction). A left
    join's left side is not: it resolves an intermediate left row without a foreign key at once.
    Nor is a join behind a filter or map_values (found in review: o1 moving A -> B -> C leaves A
    and B at count 0 where every intermediate result reaches the aggregation, as in the driver;
    the backfill's own full replay never sends them, but the rule does not lean on that where the
    join sees changes other than the source's)."""
    def topo(how="inner", between=None):
        b = StreamsBuilder()
        orders, customers = b.table("orders", store_name="orders"), b.table("customers", store_name="cust")
        if between == "filter":
            orders = orders.filter(lambda k, v: v is not None)
        elif between == "map_values":
            orders = orders.map_values(lambda v: v)
        orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: c and c["name"], how=how,
                                   name="fk").group_by(lambda k, v: (v, 1)).count(name="per-customer")
        return b.build()

    assert compaction_plan(topo()) == {"orders": "last real changes per key (foreign-key join)",
                                       "customers": "last real changes per key (foreign-key join)"}
    assert compaction_plan(topo("left")) == {"customers": "last real changes per key (foreign-key join)"}
    assert compaction_plan(topo(between="filter")) == {"customers": "last real changes per key (foreign-key join)"}
    assert compaction_plan(topo(between="map_values")) == {
        "customers": "last real changes per key (foreign-key join)"}
    # under --emit-outputs the aggregation's sink is past the transparent join: both reduced
    # while its topic is empty, neither side's other sinks considered past the join
    b = StreamsBuilder()
    orders, customers = b.table("orders", store_name="orders"), b.table("customers", store_name="cust")
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: c["name"], name="fk") \
        .group_by(lambda k, v: (v, 1)).count(name="per-customer").to_stream().to("counts")
    assert sorted(compaction_plan(b.build(), emit_outputs=True)) == ["customers", "orders"]
    refusals = {}
    assert compaction_plan(b.build(), emit_outputs=True, held_outputs={"counts"}, refusals=refusals) == {
        "customers": "last real changes per key (foreign-key join)",
        "orders": "last real changes per key (foreign-key join)"}


def test_a_map_values_in_front_of_a_joins_left_side_refuses_the_reduction():
    """map_values skips an unchanged result, so the version store of a join behind it names the
    first record of a run of equal results: one the reduction may drop (v1, v2, v3 all mapped
    to m: the full replay's version is v1's position, the reduced one's v2's)."""
    b = StreamsBuilder()
    orders, customers = b.table("orders"), b.table("customers")
    orders.map_values(lambda v: v["c"]).join_on_foreign_key(customers, lambda v: v, lambda o, c: c, how="left") \
        .to_stream().to("out")
    assert sorted(compaction_plan(b.build())) == ["customers"]


def _counts(topo, records):
    with TopologyTestDriver(topo) as d:
        for i, (t, k, v) in enumerate(records):
            d.pipe_input(t, k, v, timestamp=i)
        store = d.get_store("per-customer")
        return {k: store.get(k) for k in "ABC" if store.get(k) is not None}


def test_a_partition_is_in_time_order_while_its_timestamps_never_go_backwards():
    from backfill.compaction import in_time_order

    assert in_time_order([1, 1, 2, 5]) and in_time_order([7], before=7)
    assert not in_time_order([1, 3, 2]) and not in_time_order([4, 5], before=6)


def test_a_user_processor_in_the_sources_sub_topology_refuses_the_reduction():
    """A user processor punctuates on the task's stream time, which every input record of the
    task moves (an inner join's left table is transparent, but its records would be dropped
    from under the processor's punctuations). The right table's responses reach that task too:
    refused as well (conservatively: per run they are the same records either way)."""
    from processor import Processor

    class Tick(Processor):
        def init(self, context):
            context.schedule(10, "stream", lambda ts: None)

        def process(self, record):
            pass

    def topo(process: bool):
        b = StreamsBuilder()
        orders, customers = b.table("orders", store_name="orders"), b.table("customers", store_name="cust")
        joined = orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: c["name"], name="fk") \
            .to_stream()
        (joined.process(Tick) if process else joined).to("out")
        return b.build()

    assert sorted(compaction_plan(topo(False))) == ["customers", "orders"]
    assert sorted(compaction_plan(topo(True))) == []


def test_a_user_processor_behind_a_subscription_topic_refuses_the_reduction():
    """Found in review: the left table's subscriptions reach the right table's sub-topology,
    where a user processor punctuates on the task's stream time; and a stream sink writing to
    a table sink's topic makes that topic no table under --emit-outputs."""
    from processor import Processor

    class Tick(Processor):
        def init(self, context):
            context.schedule(10, "stream", lambda ts: None)

        def process(self, record):
            pass

    b = StreamsBuilder()
    orders, customers = b.table("orders", store_name="orders"), b.table("customers", store_name="cust")
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: c["name"], name="fk").to_stream().to("out")
    b.stream("events").join(customers, lambda e, c: c).process(Tick)
    refusals: dict = {}
    assert compaction_plan(b.build(), refusals=refusals) == {}
    assert "punctuates on the task's stream time" in refusals["orders"]

    b = StreamsBuilder()
    t = b.table("t")
    t.to_stream().to("T")
    t.to_stream().select_key(lambda k, v: v["k"]).to("T")
    assert sorted(compaction_plan(b.build())) == ["t"]
    refusals = {}
    assert compaction_plan(b.build(), emit_outputs=True, refusals=refusals) == {}
    assert "T is a stream sink" in refusals["t"]
