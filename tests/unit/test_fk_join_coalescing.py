"""Foreign-key join records held until the commit (``processor/engine/fk_join_coalescing.py``).

First the coalescer alone, over a list collector: exact sequences of what it sends. Then the
join through Tasks that commit every N records (``UnitDriver``), with and without coalescing on
the same input: the result table equals the from-scratch join in both, the stores the join
keeps (version store, subscription store) end byte for byte the same, and the coalescing run
never sends more internal records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder, provenance
from processor.engine.fk_join_coalescing import RESPONSES, SUBSCRIPTIONS, ForeignKeyJoinRecordCoalescer
from processor.engine.task import Task
from processor.serde import subscription as wire
from processor.state.memory import MemoryStores
from processor.testing import TopologyTestDriver, _MemoryCollector
from tests.integration.helpers import final_table_values

SUB, RESP, OTHER = "app-j-subscription-registration-topic", "app-j-subscription-response-topic", "out"


class ListCollector:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, timestamp, headers, partition=None):
        self.sent.append((topic, key, value, timestamp, headers, partition))


def sub(fk, pk, instruction=wire.SUBSCRIBE_AND_RESPOND, ts=0, part=0):
    return (SUB, fk, wire.encode_subscription(instruction, 3, pk), ts, [(provenance.HEADER, b"v%d" % ts)], part)


def resp(pk, echo, value, ts=0, part=1):
    return (RESP, pk, wire.encode_response(b"c", value), ts, [(wire.ECHO_HEADER, echo)], part)


def coalescer(max_held=1000):
    c = ListCollector()
    return ForeignKeyJoinRecordCoalescer({SUB: SUBSCRIPTIONS, RESP: RESPONSES}, c, max_held), c


def test_a_later_subscription_of_the_same_pair_replaces_the_held_one():
    co, c = coalescer()
    a1, b1, a2 = sub(b"c1", b"o1", ts=1), sub(b"c1", b"o2", ts=2), sub(b"c1", b"o1", ts=3)
    moved = sub(b"c2", b"o1", ts=4)                 # another foreign key: another pair
    unsub = sub(b"c1", b"o2", wire.UNSUBSCRIBE, ts=5)
    other_part = sub(b"c1", b"o1", ts=6, part=1)    # another partition: another pair
    for r in (a1, b1, a2, moved, unsub, other_part):
        co.send(*r)
    assert c.sent == []                              # held until the commit
    co.flush()
    # each pair's last record, in the order of those last sends
    assert c.sent == [a2, moved, unsub, other_part]
    assert co.coalesced == {SUB: 2, RESP: 0} and co.held == {}
    co.flush()
    assert len(c.sent) == 4


def test_a_later_response_to_the_same_subscription_replaces_the_held_one():
    co, c = coalescer()
    r1, r2 = resp(b"o1", b"e1", b"ann", ts=1), resp(b"o1", b"e2", b"ann", ts=2)   # two left versions
    r3, r4 = resp(b"o1", b"e1", b"bob", ts=3), resp(b"o2", b"e1", b"bob", ts=4)
    for r in (r1, r2, r3, r4):
        co.send(*r)
    co.flush()
    assert c.sent == [r2, r3, r4]
    assert co.coalesced == {SUB: 0, RESP: 1}


def test_other_topics_pass_at_once_and_records_it_cannot_read_flush_first():
    co, c = coalescer()
    a = sub(b"c1", b"o1")
    co.send(*a)
    out = (OTHER, b"k", b"v", 1, None, None)
    co.send(*out)
    assert c.sent == [out]
    bad = (SUB, b"c1", b"\x09garbage", 2, None, 0)   # not a subscription this build writes
    co.send(*bad)
    assert c.sent == [out, a, bad]                   # the held one first: order kept
    no_echo = (RESP, b"o1", b"x", 3, [], 1)
    co.send(*no_echo)
    assert c.sent[-1] == no_echo and co.held == {}


def test_max_held_sends_everything_held():
    co, c = coalescer(max_held=3)
    recs = [sub(b"c1", b"o%d" % i) for i in range(4)]
    for r in recs[:2]:
        co.send(*r)
    assert c.sent == []
    co.send(*recs[2])
    assert c.sent == recs[:3]
    co.send(*recs[3])
    assert c.sent == recs[:3] and list(co.held.values()) == [recs[3]]


def test_supersede_a_list_keeps_each_pairs_last_record_in_place():
    co, _ = coalescer()
    a1, out, b1, a2, r1, r2 = (sub(b"c1", b"o1", ts=1), (OTHER, b"k", b"v", 1, None, None), sub(b"c1", b"o2", ts=2),
                               sub(b"c1", b"o1", wire.UNSUBSCRIBE, ts=3), resp(b"o1", b"e", b"x"),
                               resp(b"o1", b"e", b"y"))
    assert co.supersede([a1, out, b1, a2, r1, r2]) == [out, b1, a2, r2]
    assert co.coalesced == {SUB: 1, RESP: 1}
    same = [a1, b1]
    assert co.supersede(same) is same


# -- the join through tasks that commit every N records ---------------------------------------
def joiner(order, customer):
    return {"o": order["n"], "c": None if customer is None else customer["name"]}


def build(how):
    b = StreamsBuilder()
    b.table("orders").join_on_foreign_key(b.table("customers"), lambda v: v.get("c"), joiner, how=how,
                                          name="oc").to_stream().to("out")
    return b.build()


class UnitDriver(TopologyTestDriver):
    """The test driver's tasks (with or without coalescing), each committing after ``every``
    records it processed and whenever no record is left to process (as the worker does at its
    commit interval and when drained)."""

    def __init__(self, topology, every: int, coalesce: bool):
        super().__init__(topology)
        collector = _MemoryCollector(self)
        self.tasks = [Task(self.topology, sub, 0, MemoryStores(), collector, lambda: self.wall_clock_ms,
                           on_error="dlq", dlq_topic=self.dlq_topic, coalesce_fk_records=coalesce)
                      for sub in range(len(self.topology.subtopologies))]
        self.every = every
        self.uncommitted = [0] * len(self.tasks)
        self.internal_sent = 0

    def _deliver(self, topic, key, value, ts, headers):
        if "-subscription-" in topic:
            self.internal_sent += 1
        super()._deliver(topic, key, value, ts, headers)

    def _drain(self):
        while True:
            while self._queue:
                topic, kb, vb, ts, headers = self._queue.popleft()
                offset = self._offsets[topic]
                self._offsets[topic] += 1
                i = self._sub_of_topic[topic]
                self.tasks[i].process(topic, 0, offset, ts, kb, vb, headers)
                self.uncommitted[i] += 1
                if self.uncommitted[i] >= self.every:
                    self.uncommitted[i] = 0
                    self.tasks[i].commit()
            if not any(self.uncommitted):
                return
            for i, task in enumerate(self.tasks):   # drained: commit (held records go out)
                if self.uncommitted[i]:
                    self.uncommitted[i] = 0
                    task.commit()

    def pipe_all(self, records):
        """Queue every input record, then process (internal records join the queue behind them)."""
        for topic, key, value, ts in records:
            node = self.topology.source_node(topic)
            self._queue.append((topic, node.attrs.key_serde.serialize(key), node.attrs.value_serde.serialize(value),
                                ts, None))
        self._drain()

    def raw_store(self, name):
        return sorted(kv for t in self.tasks for spec in t.store_specs if spec.name == name
                      for kv in t.stores.store(name).items())


def from_scratch(left, right, how):
    res = {}
    for pk, lv in left.items():
        fk = lv.get("c")
        r = right.get(fk) if fk is not None else None
        if r is not None:
            res[pk] = joiner(lv, r)
        elif how == "left":
            res[pk] = joiner(lv, None)
    return res


ops = st.lists(st.tuples(
    st.sampled_from(["orders", "orders", "customers"]),
    st.sampled_from(["k0", "k1", "k2", "k3"]),
    st.one_of(st.none(), st.tuples(st.sampled_from([None, "k0", "k1", "k2", "k5"]), st.integers(0, 2)))),
    max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=ops, how=st.sampled_from(["inner", "left"]), every=st.integers(1, 30))
def test_coalescing_ends_in_the_same_join_and_stores_and_never_sends_more(ops, how, every):
    records, left, right = [], {}, {}
    for i, (topic, key, val) in enumerate(ops):
        if topic == "orders":
            value = None if val is None else ({"n": val[1]} if val[0] is None else {"n": val[1], "c": val[0]})
            table = left
        else:
            value = None if val is None else {"name": f"n{val[1]}"}
            table = right
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
        records.append((topic, key, value, i))
    runs = {}
    for coalesce in (False, True):
        with UnitDriver(build(how), every, coalesce) as d:
            d.pipe_all(records)
            runs[coalesce] = (final_table_values(d.read_output("out")), d.raw_store("oc-version-store"),
                              d.raw_store("oc-subscription-store"), d.get_store("oc").items(), d.internal_sent)
    want = from_scratch(left, right, how)
    for coalesce, (table, _versions, _subscriptions, result, _sent) in runs.items():
        assert table == want, coalesce
        assert dict(result) == want, coalesce
    assert runs[True][1:3] == runs[False][1:3]       # version and subscription stores, byte for byte
    assert runs[True][4] <= runs[False][4]
    if every == 1:
        assert runs[True][4] == runs[False][4]       # a commit per record: nothing to replace


def test_a_key_updated_within_one_unit_costs_one_round_trip():
    records = [("customers", "c1", {"name": "ann"}, 0)]
    records += [("orders", "o1", {"n": i, "c": "c1"}, 1 + i) for i in range(5)]
    records += [("orders", "o2", {"n": 9, "c": "c1"}, 9)]
    for coalesce, subscriptions in ((False, 6), (True, 2)):
        with UnitDriver(build("inner"), 100, coalesce) as d:
            d.pipe_all(records)
            assert [(r.key, r.value) for r in d.read_output("out")] == [("o1", {"o": 4, "c": "ann"}),
                                                                        ("o2", {"o": 9, "c": "ann"})]
            stale = d.metrics()["KTABLE-FK-JOIN-RESOLVE-0000000010"]["stale_responses_dropped"]
            sink = d.metrics()["KTABLE-SINK-0000000004"]
            assert (sink["records_out"] - sink.get("records_coalesced", 0), stale) == \
                (subscriptions, 4 if not coalesce else 0)
    # a right row updated 3 times with 2 subscribers: 2 responses instead of 6
    records = [("customers", "c1", {"name": "ann"}, 0), ("orders", "o1", {"n": 1, "c": "c1"}, 1),
               ("orders", "o2", {"n": 2, "c": "c1"}, 2)]
    for coalesce, responses, out in ((False, 6, ["bob", "bob", "cy", "cy", "dee", "dee"]), (True, 2, ["dee", "dee"])):
        with UnitDriver(build("inner"), 100, coalesce) as d:
            d.pipe_all(records)
            d.read_output("out")
            before = d.internal_sent
            d.pipe_all([("customers", "c1", {"name": n}, 10 + i) for i, n in enumerate(("bob", "cy", "dee"))])
            assert [r.value["c"] for r in d.read_output("out")] == out
            assert d.internal_sent - before == responses
            sink = d.metrics()["KTABLE-SINK-0000000008"]
            assert sink["records_out"] - sink.get("records_coalesced", 0) == 2 + responses
