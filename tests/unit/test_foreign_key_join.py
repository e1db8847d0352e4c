"""Foreign-key table join (KIP-213) in the test driver: exact output sequences, with timestamps.

The driver is synchronous (subscription and response records are fed back before
``pipe_input`` returns), so after every input record the join's output must be exactly the
difference between the from-scratch join of the two tables before and after that record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder, provenance
from processor.serde import Serdes
from processor.serde import subscription as wire
from processor.testing import TopologyTestDriver


def joiner(order, customer):
    return {"o": order["n"], "c": None if customer is None else customer["name"]}


def build(how="inner", fk=lambda v: v.get("c")):
    b = StreamsBuilder()
    orders = b.table("orders")
    customers = b.table("customers")
    orders.join_on_foreign_key(customers, fk, joiner, how=how, name="oc").to_stream().to("out")
    return b.build()


def out(d):
    return [(r.key, r.value, r.timestamp) for r in d.read_output("out")]


def j(n, c):
    return {"o": n, "c": c}


def test_right_before_left_and_left_before_right():
    for how in ("inner", "left"):
        with TopologyTestDriver(build(how)) as d:
            d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=10)
            assert out(d) == []
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=5)   # right first
            assert out(d) == [("o1", j(1, "ann"), 10)]                    # max(left, right)
            d.pipe_input("orders", "o2", {"n": 2, "c": "c2"}, timestamp=20)  # left first
            assert out(d) == ([] if how == "inner" else [("o2", j(2, None), 20)])
            d.pipe_input("customers", "c2", {"name": "bob"}, timestamp=30)
            assert out(d) == [("o2", j(2, "bob"), 30)]                    # the right record's


def test_right_update_fans_out_in_primary_key_byte_order():
    with TopologyTestDriver(build()) as d:
        d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
        for pk in ("o3", "o10", "o1", "o2"):
            d.pipe_input("orders", pk, {"n": int(pk[1:]), "c": "c1"}, timestamp=2)
        d.pipe_input("orders", "x", {"n": 0, "c": "c9"}, timestamp=2)   # another fk: untouched
        out(d)
        d.pipe_input("customers", "c1", {"name": "bea"}, timestamp=50)
        assert out(d) == [("o1", j(1, "bea"), 50), ("o10", j(10, "bea"), 50),
                          ("o2", j(2, "bea"), 50), ("o3", j(3, "bea"), 50)]
        # an update that changes no result is not forwarded
        d.pipe_input("customers", "c1", {"name": "bea", "extra": 1}, timestamp=60)
        assert out(d) == []
        assert d.metrics()["KTABLE-FK-JOIN-RESPOND-0000000007"]["responses_sent"] == 8


def test_right_delete_and_left_delete():
    for how in ("inner", "left"):
        with TopologyTestDriver(build(how)) as d:
            d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=2)
            d.pipe_input("orders", "o2", {"n": 2, "c": "c1"}, timestamp=3)
            out(d)
            d.pipe_input("customers", "c1", None, timestamp=40)
            if how == "inner":
                assert out(d) == [("o1", None, 40), ("o2", None, 40)]
            else:
                assert out(d) == [("o1", j(1, None), 40), ("o2", j(2, None), 40)]
            d.pipe_input("customers", "c1", None, timestamp=41)     # deleting it again: nothing
            assert out(d) == []
            d.pipe_input("orders", "o1", None, timestamp=50)
            assert out(d) == ([] if how == "inner" else [("o1", None, 50)])
            d.pipe_input("orders", "o1", None, timestamp=51)
            assert out(d) == []


def test_foreign_key_change_between_existing_and_missing_keys():
    with TopologyTestDriver(build("inner")) as d:
        d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
        d.pipe_input("customers", "c2", {"name": "bob"}, timestamp=2)
        d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=10)
        assert out(d) == [("o1", j(1, "ann"), 10)]
        d.pipe_input("orders", "o1", {"n": 1, "c": "c2"}, timestamp=11)   # existing -> existing
        assert out(d) == [("o1", j(1, "bob"), 11)]
        d.pipe_input("orders", "o1", {"n": 1, "c": "c9"}, timestamp=12)   # existing -> missing
        assert out(d) == [("o1", None, 12)]
        d.pipe_input("orders", "o1", {"n": 1, "c": "c8"}, timestamp=13)   # missing -> missing
        assert out(d) == []
        d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=14)   # missing -> existing
        assert out(d) == [("o1", j(1, "ann"), 14)]
        # the old foreign keys' updates no longer reach o1
        d.pipe_input("customers", "c2", {"name": "bo"}, timestamp=15)
        d.pipe_input("customers", "c9", {"name": "zed"}, timestamp=16)
        assert out(d) == []
        sub = d.get_store("oc-subscription-store")
        assert len(sub) == 1
    with TopologyTestDriver(build("left")) as d:
        d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
        d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=10)
        d.pipe_input("orders", "o1", {"n": 1, "c": "c9"}, timestamp=12)
        d.pipe_input("orders", "o1", {"n": 1, "c": "c8"}, timestamp=13)
        d.pipe_input("orders", "o1", {"n": 2, "c": "c8"}, timestamp=14)
        assert out(d) == [("o1", j(1, "ann"), 10), ("o1", j(1, None), 12), ("o1", j(2, None), 14)]


def test_foreign_key_to_and_from_none():
    for how in ("inner", "left"):
        with TopologyTestDriver(build(how)) as d:
            d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
            d.pipe_input("orders", "o1", {"n": 1}, timestamp=5)                  # no fk
            assert out(d) == ([] if how == "inner" else [("o1", j(1, None), 5)])
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=6)      # None -> c1
            assert out(d) == [("o1", j(1, "ann"), 6)]
            d.pipe_input("orders", "o1", {"n": 1, "c": None}, timestamp=7)      # c1 -> None
            assert out(d) == ([("o1", None, 7)] if how == "inner" else [("o1", j(1, None), 7)])
            d.pipe_input("customers", "c1", {"name": "bo"}, timestamp=8)        # unsubscribed
            assert out(d) == []
            m = d.metrics()["KTABLE-FK-JOIN-SUBSCRIPTION-SEND-0000000003"]
            assert (m["subscriptions_sent"], m["unsubscriptions_sent"], m["resolved_locally"]) == (1, 1, 2)


def test_delete_of_a_never_joined_row_forwards_nothing():
    for how in ("inner", "left"):
        with TopologyTestDriver(build(how)) as d:
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=5)
            got = out(d)
            d.pipe_input("orders", "o1", None, timestamp=6)
            if how == "inner":
                assert got == [] and out(d) == []
            else:
                assert got == [("o1", j(1, None), 5)] and out(d) == [("o1", None, 6)]
            d.pipe_input("orders", "o2", None, timestamp=7)   # never existed at all
            assert out(d) == []


def test_fk_extractor_may_take_key_and_value():
    with TopologyTestDriver(build("inner", fk=lambda k, v: "c" + k[1:])) as d:
        d.pipe_input("customers", "c7", {"name": "gus"}, timestamp=1)
        d.pipe_input("orders", "o7", {"n": 7}, timestamp=2)
        assert out(d) == [("o7", j(7, "gus"), 2)]


class HoldingDriver(TopologyTestDriver):
    """A driver that can hold back records of one topic and release them later, in any order:
    the broker's freedom to schedule partitions, made explicit."""

    held_topic = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.held = []

    def _deliver(self, topic, key, value, ts, headers):
        if topic == self.held_topic:
            self.held.append((topic, key, value, ts, headers))
            return
        super()._deliver(topic, key, value, ts, headers)

    def release(self, index):
        self.held_topic, topic = None, self.held_topic
        rec = self.held.pop(index)
        super()._deliver(*rec)
        self._drain()
        self.held_topic = topic


def test_a_stale_response_after_a_newer_left_version_is_dropped_and_counted():
    with HoldingDriver(build("inner")) as d:
        d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
        d.pipe_input("customers", "c2", {"name": "bob"}, timestamp=2)
        d.held_topic = "test-app-oc-subscription-response-topic"
        d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=10)   # version 1
        d.pipe_input("orders", "o1", {"n": 1, "c": "c2"}, timestamp=11)   # version 2
        assert len(d.held) == 2 and out(d) == []
        # each response echoes the version it answers: the provenance of the left record
        echoes = [provenance.decode(dict(h)[wire.ECHO_HEADER]) for _, _, _, _, h in d.held]
        assert [(e.topic, e.offset) for e in echoes] == [("orders", 0), ("orders", 1)]
        assert [wire.decode_response(v).fk for _, _, v, _, _ in d.held] == [b"c1", b"c2"]
        d.release(0)   # the answer to version 1 arrives after version 2 was processed: stale
        assert out(d) == []
        d.release(0)
        assert out(d) == [("o1", j(1, "bob"), 11)]
        m = d.metrics()
        assert m["KTABLE-FK-JOIN-RESOLVE-0000000010"]["stale_responses_dropped"] == 1
        assert sum(t.duplicates_dropped for t in d.tasks) == 0
        assert d.get_store("oc").get("o1") == j(1, "bob")


def test_a_stale_response_after_the_left_row_was_deleted_is_dropped():
    with HoldingDriver(build("left")) as d:
        d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
        d.held_topic = "test-app-oc-subscription-response-topic"
        d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=10)
        d.pipe_input("orders", "o1", None, timestamp=11)
        assert out(d) == []               # nothing was ever forwarded for o1: no tombstone
        d.release(0)
        assert out(d) == []
        assert d.metrics()["KTABLE-FK-JOIN-RESOLVE-0000000010"]["stale_responses_dropped"] == 1


# -- the oracle: the from-scratch join, before and after each record ---------------------------
def from_scratch(left, right, how):
    """{pk: (value, ts)} of the join of {pk: (value, ts)} and {fk: (value, ts)}."""
    res = {}
    for pk, (lv, _lts) in left.items():
        fk = lv.get("c")
        r = right.get(fk) if fk is not None else None
        if r is not None:
            res[pk] = joiner(lv, r[0])
        elif how == "left":
            res[pk] = joiner(lv, None)
    return res


def expected_changes(before, after, ts):
    """The forwarded records for one input record: changed keys in key byte order."""
    keys = sorted(set(before) | set(after), key=lambda k: k.encode())
    return [(k, after.get(k), ts(k)) for k in keys if before.get(k) != after.get(k)]


ops = st.lists(st.tuples(
    st.sampled_from(["orders", "customers"]),
    st.sampled_from(["k0", "k1", "k2", "k3", "k4"]),
    st.one_of(st.none(), st.tuples(st.sampled_from([None, "k0", "k1", "k2", "k5"]), st.integers(0, 2))),
    st.integers(0, 100)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=ops, how=st.sampled_from(["inner", "left"]))
def test_every_step_forwards_exactly_the_change_of_the_from_scratch_join(ops, how):
    left, right = {}, {}   # key -> (value, ts of the last real change)
    with TopologyTestDriver(build(how)) as d:
        for topic, key, val, ts in ops:
            if topic == "orders":
                value = None if val is None else ({"n": val[1]} if val[0] is None else {"n": val[1], "c": val[0]})
            else:
                value = None if val is None else {"name": f"n{val[1]}"}
            table = left if topic == "orders" else right
            before = from_scratch(left, right, how)
            if value is None:
                table.pop(key, None)
            elif table.get(key, (None,))[0] != value:
                table[key] = (value, ts)
            after = from_scratch(left, right, how)
            if topic == "orders":
                def out_ts(pk, ts=ts, after=after):
                    lv = left.get(pk)
                    fk = lv[0].get("c") if lv else None
                    r = right.get(fk) if fk is not None else None
                    return ts if r is None or after.get(pk) is None else max(ts, r[1])
            else:
                def out_ts(pk, ts=ts):
                    return ts
            d.pipe_input(topic, key, value, timestamp=ts)
            assert out(d) == expected_changes(before, after, out_ts)
        assert sorted(d.get_store("oc").items()) == sorted(from_scratch(left, right, how).items())
        assert d.metrics()["KTABLE-FK-JOIN-RESOLVE-0000000010"]["stale_responses_dropped"] == 0


def test_the_result_sink_writes_the_stored_bytes_and_a_table_consumer_still_gets_old_values():
    """The join's sink (through to_stream) writes the result store's bytes instead of serializing
    again; a filter on the result table still sees old values: a result that stops passing
    forwards a tombstone, which needs the old side."""
    def build_with(after):
        b = StreamsBuilder()
        res = b.table("orders").join_on_foreign_key(b.table("customers"), lambda v: v.get("c"), joiner, name="oc")
        after(res).to("out")
        return b.build()

    plain = build_with(lambda r: r.to_stream())
    filtered = build_with(lambda r: r.filter(lambda k, v: v["c"] != "bob").to_stream())
    mapped = build_with(lambda r: r.to_stream().map_values(lambda v: dict(v, m=1)))
    marks = [next(n for n in t.nodes if n.sink_topic == "out").attrs.passthrough for t in (plain, filtered, mapped)]
    assert marks == [True, True, False]
    for topo, want in ((plain, [("o1", j(1, "ann")), ("o1", j(1, "bob"))]),
                       (filtered, [("o1", j(1, "ann")), ("o1", None)]),
                       (mapped, [("o1", dict(j(1, "ann"), m=1)), ("o1", dict(j(1, "bob"), m=1))])):
        with TopologyTestDriver(topo) as d:
            d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=2)
            d.pipe_input("customers", "c1", {"name": "bob"}, timestamp=3)
            assert [(r.key, r.value) for r in d.read_output("out")] == want
        with TopologyTestDriver(topo) as d:   # the bytes: the store's, canonical JSON
            d.pipe_input("customers", "c1", {"name": "ann"}, timestamp=1)
            d.pipe_input("orders", "o1", {"n": 1, "c": "c1"}, timestamp=2)
            raw = d.read_output("out", key_serde=Serdes.string(), value_serde=Serdes.bytes())
            assert [r.value for r in raw] == [Serdes.json().serialize(want[0][1])]
