"""Global tables (issue 29) in the test driver against a plain-Python model of Kafka Streams'
semantics: ``KStream.join(global_table, joiner, key_selector=fn)`` looks up ``fn(key, value)``
in the whole table as it is when the record is processed (no repartition, no co-partitioning);
``left_join`` also forwards ``joiner(value, None)``."""

import random

import pytest

from processor import StreamsBuilder
from processor.errors import TopologyError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def topology():
    b = StreamsBuilder()
    products = b.global_table("products", name="products")
    orders = b.stream("orders")
    orders.join(products, lambda o, p: {"qty": o["qty"], "price": p["price"]},
                key_selector=lambda k, o: o["product"]).to("priced")
    orders.left_join(products, lambda o, p: [o["qty"], p and p["price"]],
                     key_selector=lambda k, o: o["product"]).to("priced-left")
    return b.build()


def test_a_stream_joins_the_global_table_as_it_is_when_each_record_is_processed():
    rnd = random.Random(2)
    events = []
    for i in range(600):
        if rnd.random() < 0.3:
            p = f"p{rnd.randrange(12)}"
            events.append(("products", p, None if rnd.random() < 0.1 else {"price": rnd.randrange(100)}))
        else:
            events.append(("orders", f"o{i}", {"product": f"p{rnd.randrange(14)}", "qty": rnd.randrange(5)}))
    table: dict = {}
    want_inner, want_left = [], []
    for i, (topic, k, v) in enumerate(events):
        if topic == "products":
            if v is None:
                table.pop(k, None)
            else:
                table[k] = v
            continue
        row = table.get(v["product"])
        if row is not None:
            want_inner.append((k, {"qty": v["qty"], "price": row["price"]}, i))
        want_left.append((k, [v["qty"], row and row["price"]], i))
    with TopologyTestDriver(topology()) as d:
        for i, (topic, k, v) in enumerate(events):
            d.pipe_input(topic, k, v, timestamp=i)
        assert [(r.key, r.value, r.timestamp) for r in d.read_output("priced")] == want_inner
        assert [(r.key, r.value, r.timestamp) for r in d.read_output("priced-left")] == want_left
        # the global store reads like any other (Kafka Streams' getKeyValueStore)
        store = d.get_store("products")
        assert [store.get(f"p{i}") for i in range(14)] == [table.get(f"p{i}") for i in range(14)]
    assert len(want_inner) > 100 and sum(1 for _, v, _ in want_left if v[1] is None) > 20
    desc = topology().describe()
    assert "Global stores:\n    products (topic: products;" in desc
    assert "-repartition" not in desc


def test_global_tables_are_declared_checked():
    b = StreamsBuilder()
    g = b.global_table("t")
    with pytest.raises(TopologyError, match="key_selector"):
        b.stream("s").join(g, lambda a, c: a)
    with pytest.raises(TopologyError, match="inner or left"):
        b.stream("s2").outer_join(g, lambda a, c: a)
    with pytest.raises(TopologyError, match="read twice"):
        b.global_table("t")


def test_poison_records_of_the_global_topic_are_skipped():
    with TopologyTestDriver(topology()) as d:
        d.pipe_raw("products", b"p1", b"{not json", timestamp=1)
        d.pipe_raw("products", None, b'{"price": 3}', timestamp=2)
        d.pipe_input("products", "p2", {"price": 7}, timestamp=3)
        d.pipe_input("orders", "o1", {"product": "p1", "qty": 1}, timestamp=4)
        d.pipe_input("orders", "o2", {"product": "p2", "qty": 2}, timestamp=5)
        assert [(r.key, r.value) for r in d.read_output("priced")] == [("o2", {"qty": 2, "price": 7})]
        assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []
