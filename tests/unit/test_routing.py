"""Routing by each source's partitioner (docs/semantics.md "Partitioning"): the Task's check of every
consumed key of a checked topic, the foreign-key subscription sink's partition choice, and a
table read through ``repartition=True`` (differential against the same topology without it)."""

import pytest

from processor import StreamsBuilder
from processor.engine.partitioners import CONSISTENT, FNV1A, MURMUR2
from processor.engine.routing import PartitionerChoice, PartitioningError, Routing
from processor.engine.task import Task
from processor.serde import Serdes
from processor.state.memory import MemoryStores
from processor.testing import TopologyTestDriver


class ListCollector:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, timestamp, headers, partition=None):
        self.sent.append((topic, key, partition))


def _fk_topology(repartition=False):
    b = StreamsBuilder()
    orders = b.table("orders", repartition=repartition)
    customers = b.table("customers")
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda o, c: {"o": o["n"], "c": c and c["r"]},
                               how="left").to_stream().to("out")
    return b.build().for_application("app")


def _task(topology, topic, routing, collector=None):
    sub = topology.subtopology_of_topic()[topic]
    return Task(topology, sub, 1, MemoryStores(), collector or ListCollector(), lambda: 0,
                on_error="fail", routing=routing)


def _key_in_other_partition(p, n, partition):
    for i in range(1000):
        k = f"k{i}".encode()
        if p.partition(k, n) != partition:
            return k
    raise AssertionError("no key found")


def test_a_key_its_partitioner_puts_elsewhere_stops_before_anything_is_applied():
    topo = _fk_topology()
    choice = PartitionerChoice("customers", CONSISTENT, "detected from 800 sampled keys")
    task = _task(topo, "customers", Routing({"customers": choice}, {"customers": 4}))
    good = next(f"c{i}".encode() for i in range(100) if CONSISTENT.partition(f"c{i}".encode(), 4) == 1)
    task.process("customers", 1, 0, 5, good, b'{"r":"x"}')
    bad = _key_in_other_partition(CONSISTENT, 4, 1)
    with pytest.raises(PartitioningError) as err:
        task.process("customers", 1, 7, 6, bad, b'{"r":"y"}')
    assert err.value.exit_code == 2
    msg = str(err.value)
    assert f"key {bad!r} at customers[1]@7 is in partition 1" in msg
    assert f"partitioner consistent (detected from 800 sampled keys) puts it in partition " \
           f"{CONSISTENT.partition(bad, 4)}" in msg
    store = task.stores.store(topo.source_node("customers").stores[0])
    assert [k for k, _ in store.items()] == [good]            # the bad record changed nothing
    assert task.positions == {("customers", 1): 1}


def test_unchecked_topics_and_null_keys_pass():
    topo = _fk_topology()
    choice = PartitionerChoice("customers", MURMUR2, "one partition", checked=False)
    task = _task(topo, "customers", Routing({"customers": choice}, {"customers": 4}))
    task.process("customers", 1, 0, 5, _key_in_other_partition(MURMUR2, 4, 1), b'{"r":"x"}')
    assert task.processed == 1


@pytest.mark.parametrize("right", [MURMUR2, CONSISTENT, FNV1A], ids=lambda p: p.name)
def test_subscriptions_go_to_the_right_tables_partition_under_its_partitioner(right):
    topo = _fk_topology()
    sub_topic = [t for t in topo.internal_topics() if t.endswith("subscription-registration-topic")][0]
    out = ListCollector()
    routing = Routing({"customers": PartitionerChoice("customers", right, "declared"),
                       "orders": PartitionerChoice("orders", MURMUR2, "declared", checked=False)},
                      {"customers": 5, "orders": 3, sub_topic: 5})
    task = _task(topo, "orders", routing, out)
    fks = [f"cust-{i}" for i in range(40)]
    for i, fk in enumerate(fks):
        task.process("orders", 1, i, 10 + i, f"o{i}".encode(), f'{{"c":"{fk}","n":{i}}}'.encode())
    subs = [(k, p) for t, k, p in out.sent if t == sub_topic]
    assert subs == [(fk.encode(), right.partition(fk.encode(), 5)) for fk in fks]
    # the three families disagree on these keys, so the choice is visible
    assert len({tuple(p.partition(fk.encode(), 5) for fk in fks) for p in (MURMUR2, CONSISTENT, FNV1A)}) == 3


def _run(topology, records):
    with TopologyTestDriver(topology) as d:
        for i, (topic, k, v) in enumerate(records):
            if k is None:
                d.pipe_raw(topic, None, b'{"c":"c1","n":0}', timestamp=100 + i)
            else:
                d.pipe_input(topic, k, v, timestamp=100 + i)
        return d.read_output("out"), d.read_output("test-app-dlq", Serdes.bytes(), Serdes.bytes())


def test_repartitioned_table_joins_like_the_direct_one():
    records = [("customers", "c1", {"r": "north"}), ("orders", "o1", {"c": "c1", "n": 1}),
               ("orders", "o2", {"c": "c2", "n": 2}), ("customers", "c2", {"r": "south"}),
               ("orders", None, None), ("orders", "o1", {"c": "c2", "n": 3}), ("orders", "o2", None),
               ("customers", "c2", None)]
    direct, direct_dlq = _run(_fk_topology(False), records)
    via, via_dlq = _run(_fk_topology(True), records)
    assert [(r.key, r.value, r.timestamp) for r in via] == [(r.key, r.value, r.timestamp) for r in direct]
    assert [(r.key, r.value, r.timestamp) for r in direct] == [
        ("o1", {"c": "north", "o": 1}, 101), ("o2", {"c": None, "o": 2}, 102), ("o2", {"c": "south", "o": 2}, 103),
        ("o1", {"c": "south", "o": 3}, 105), ("o2", None, 106), ("o1", {"c": None, "o": 3}, 107)]
    # the keyless record is dead-lettered at the user's topic in both, naming the step
    assert [dict(r.headers)["__streams.errors.topic"] for r in via_dlq] == [b"orders"]
    assert dict(via_dlq[0].headers)["processor.errors.step"].startswith(b"KTABLE-REQUIRE-KEY")
    assert [r.value for r in direct_dlq] == [r.value for r in via_dlq] == [b'{"c":"c1","n":0}']


def test_describe_shows_partitioning():
    topo = _fk_topology(True)
    text = topo.describe()
    assert "(partitioner: murmur2 (internal topic))" in text
    assert "(partitioner: determined from the data at start, then checked as consumed)" in text
    assert "subscription-registration-topic: routed by the partitioner of customers" in text
    decided = topo.with_partitioning({"customers": PartitionerChoice("customers", CONSISTENT, "declared")})
    assert "(partitioner: consistent (declared; checked as consumed))" in decided.describe()


def test_repartitioned_stream_joins_like_the_direct_one():
    def topo(repartition):
        b = StreamsBuilder()
        tab = b.table("t")
        b.stream("s", repartition=repartition).join(tab, lambda s, t: [s, t]).to("out")
        return b.build()

    def run(t):
        with TopologyTestDriver(t) as d:
            d.pipe_input("t", "k1", 1, timestamp=1)
            d.pipe_input("s", "k1", "a", timestamp=2)
            d.pipe_input("s", "k2", "b", timestamp=3)
            d.pipe_input("t", "k2", 2, timestamp=4)
            d.pipe_input("s", "k2", "c", timestamp=5)
            return [(r.key, r.value, r.timestamp) for r in d.read_output("out")]

    assert run(topo(True)) == run(topo(False)) == [("k1", ["a", 1], 2), ("k2", ["c", 2], 5)]
    # the stream side is now the murmur2 repartition topic: only "t" is checked against it
    (_, left, right), = topo(True).copartition_constraints()
    assert len(left) == 1 and left[0].endswith("-repartition") and right == ["t"]
    assert topo(True).partitioning_relevant_topics() == ["t"]
