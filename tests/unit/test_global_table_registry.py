"""A global table whose value serde is a Schema Registry Avro serde, joined from a stream (issue
34, item 6): the join reads the table with the serde the topology bound to the table's topic
(before, it captured the unbound serde: fatal ``... is bound to no topic``). In the test driver
against a plain-Python model; an upstream producer moving the table's topic to a compatible v2
(a field added with a default) is read into the reader schema. The same topology runs on the
broker in ``tests/integration/test_global_table_registry_e2e.py``. The registry is the client
library's in-memory one (``mock://``), shared by this process."""

import json
import random

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor import StreamsBuilder
from processor.serde import SCHEMAS_DIR, Serdes
from processor.serde.registry import client_for
from processor.testing import TopologyTestDriver

CUSTOMER_V1 = json.loads((SCHEMAS_DIR / "customer.avsc").read_text())
CUSTOMER_V2 = {**CUSTOMER_V1, "fields": CUSTOMER_V1["fields"] + [{"name": "vip", "type": "boolean", "default": False}]}


def registry_global_join(t: dict, registry: str):
    """``customers`` global table (Avro, registry), ``orders`` stream (JSON ``{"c", "n"}``)
    joined by ``c``: inner into ``joined``, left into ``left``."""
    b = StreamsBuilder()
    cust = b.global_table(t["customers"], key_serde=Serdes.string(),
                          value_serde=Serdes.avro("customer", registry=registry), name="customers")
    orders = b.stream(t["orders"])
    orders.join(cust, lambda o, c: {"n": o["n"], "name": c["name"], "region": c["region"]},
                key_selector=lambda k, v: v["c"]).to(t["joined"])
    orders.left_join(cust, lambda o, c: {"n": o["n"], "region": c and c["region"]},
                     key_selector=lambda k, v: v["c"]).to(t["left"])
    return b.build()


TOPICS = {n: n for n in ("customers", "orders", "joined", "left")}


def history(seed: int, n: int = 300, customers: int = 6):
    """``[(topic name, key, value, timestamp, writer schema)]``: customer rows (v1 or v2 writers,
    deletes), orders naming a customer (some never present)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        c = f"c{rnd.randrange(customers + 2)}"
        if rnd.random() < 0.3:
            if rnd.random() < 0.1:
                out.append(("customers", c, None, 1000 + i, None))
            else:
                v2 = rnd.random() < 0.5
                row = {"id": c, "name": f"n{rnd.randrange(50)}", "region": rnd.choice(["EU", "US"])}
                out.append(("customers", c, {**row, "vip": True} if v2 else row, 1000 + i,
                            CUSTOMER_V2 if v2 else CUSTOMER_V1))
        else:
            out.append(("orders", f"o{i}", {"c": c, "n": i}, 1000 + i, None))
    return out


def model(records):
    table, joined, left = {}, [], []
    for name, k, v, ts, _ in records:
        if name == "customers":
            if v is None:
                table.pop(k, None)
            else:
                table[k] = {f: v[f] for f in ("id", "name", "region")}   # read into the reader schema
        else:
            row = table.get(v["c"])
            if row is not None:
                joined.append((k, {"n": v["n"], "name": row["name"], "region": row["region"]}, ts))
            left.append((k, {"n": v["n"], "region": row and row["region"]}, ts))
    return {"joined": joined, "left": left}, table


def serializers(registry: str, topic: str):
    client = client_for({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    sers = {id(s): AvroSerializer(client, json.dumps(s)) for s in (CUSTOMER_V1, CUSTOMER_V2)}
    return lambda schema, value: sers[id(schema)](value, ctx)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_stream_joins_a_registry_global_table_as_the_model(seed):
    registry = f"mock://global-registry-{seed}"
    recs = history(seed)
    want, table = model(recs)
    ser = serializers(registry, "customers")
    with TopologyTestDriver(registry_global_join(TOPICS, registry)) as d:
        for name, k, v, ts, schema in recs:
            if name == "customers":   # written by an upstream producer with its own writer schema
                d.pipe_raw("customers", k.encode(), None if v is None else ser(schema, v), timestamp=ts)
            else:
                d.pipe_input("orders", k, v, timestamp=ts)
        got = {n: [(r.key, r.value, r.timestamp) for r in d.read_output(n)] for n in want}
        store = d.get_store("customers")
        assert {k: store.get(k) for k in table} == table
        dead = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
    assert got == want
    assert dead == []
    assert len(want["joined"]) > 20 and any(v["region"] is None for _, v, _ in want["left"])


def test_the_join_reads_rows_written_with_the_topologys_own_serde():
    registry = "mock://global-registry-own"
    with TopologyTestDriver(registry_global_join(TOPICS, registry)) as d:
        d.pipe_input("customers", "c1", {"id": "c1", "name": "Ann", "region": "EU"}, timestamp=1)
        d.pipe_input("orders", "o1", {"c": "c1", "n": 1}, timestamp=2)
        d.pipe_input("orders", "o2", {"c": "c9", "n": 2}, timestamp=3)
        assert [(r.key, r.value) for r in d.read_output("joined")] == [("o1", {"n": 1, "name": "Ann", "region": "EU"})]
        assert [(r.key, r.value) for r in d.read_output("left")] == [("o1", {"n": 1, "region": "EU"}),
                                                                    ("o2", {"n": 2, "region": None})]
