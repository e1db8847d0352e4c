"""A global table whose value serde is a Schema Registry Avro serde, joined from a stream (issue
34, item 6), through the backfill: real local Spark, the real broker, and a registry reached over
HTTP by the executors. The driver (``tests/unit/test_global_table_registry.py``) and the worker
(``tests/integration/test_global_table_registry_e2e.py``) are tested with the client library's
in-memory ``mock://`` registry, which a backfill's executors (other processes) cannot see; here
the registry is ``tests/support/schema_registry_server.py``, a minimal in-test implementation
of the registry's REST API (no registry server installs on this machine), and every client is
confluent-kafka's real ``SchemaRegistryClient``.

- The table's topic (2 partitions) is written by upstream producers (confluent-kafka's
  ``AvroSerializer``) on ``customer`` v1, then on a compatible v2 (a field added with a default)
  registered under the same subject, with deletes; the orders (JSON, 3 partitions) after it,
  keyed by user, naming a customer (some never present).
- The topology names a registry URL in its code that nothing listens on; the backfill is given
  the server's URL the way a user gives it (``--schema-registry-url``: ``build_client_config(
  registry_url=...)`` -> ``backfill.run(client_config=...)``), which overrides the code's.
- ``backfill.run(..., emit_outputs=True)`` vs ``TopologyTestDriver`` over the same history (the
  table first, then the orders in timestamp order; its topology names the server's URL): every
  store of the task databases equals the driver's byte for byte; the stream sinks (inner and
  left join) hold exactly the driver's records per key in order; the aggregates' sinks their
  final table; nothing is dead-lettered. The executors fetched the writers' schemas by id from
  the server during the backfill (this process already held both in its client's cache)."""

import json
import random

import pytest

import backfill
from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.kafka.client_config import build_client_config
from processor.serde import Serdes
from processor.serde.registry import client_for
from processor.testing import TopologyTestDriver
from tests.backfill.helpers import contract_column_families
from tests.integration.helpers import produce
from tests.support.schema_registry_server import SchemaRegistryServer
from tests.unit.test_global_table_registry import CUSTOMER_V1, CUSTOMER_V2, serializers

T0 = 1_000_000
NOWHERE = "http://127.0.0.1:9"   # the code's registry URL: nothing listens there (overridden)


def topology(t: dict, registry: str):
    """``customers`` global table (Avro, registry) joined from ``orders`` (JSON ``{"c", "n"}``,
    keyed by user) by ``c``: the inner join into ``joined`` and into a store of each user's last
    three joined rows (``last-joined``), the left join into ``left`` and counted by region
    (``by-region``, also into ``counts``)."""
    b = StreamsBuilder()
    cust = b.global_table(t["customers"], key_serde=Serdes.string(),
                          value_serde=Serdes.avro("customer", registry=registry), name="customers")
    orders = b.stream(t["orders"])
    joined = orders.join(cust, lambda o, c: {"n": o["n"], "name": c["name"], "region": c["region"]},
                         key_selector=lambda k, v: v["c"])
    joined.to(t["joined"])
    joined.group_by_key().aggregate(lambda: [], lambda k, v, agg: (agg + [v])[-3:], name="last-joined") \
        .to_stream().to(t["last"])
    left = orders.left_join(cust, lambda o, c: {"n": o["n"], "c": o["c"], "region": c and c["region"]},
                            key_selector=lambda k, v: v["c"])
    left.to(t["left"])
    left.group_by(lambda k, v: str(v["region"])).count(name="by-region").to_stream().to(t["counts"])
    return b.build()


def history(seed: int, ser):
    """``(customers [(key, value bytes | None)], orders [(key, value bytes)])``: customer rows on
    v1 for the first half, then v2 (``vip``) for some of the keys, about 8% deletes; orders
    naming c00..c44 (the table's keys are c00..c39). The table at the end holds rows of both
    writer schemas."""
    rnd = random.Random(seed)
    customers = []
    for i in range(400):   # the v2 producer writes c00..c24 only: c25..c39 keep their v1 rows
        c = f"c{rnd.randrange(40 if i < 200 else 25):02d}"
        if rnd.random() < 0.08:
            customers.append((c.encode(), None))
            continue
        row = {"id": c, "name": f"n{rnd.randrange(50)}", "region": rnd.choice(["EU", "US", "APAC"])}
        customers.append((c.encode(), ser(CUSTOMER_V1, row) if i < 200
                          else ser(CUSTOMER_V2, {**row, "vip": rnd.random() < 0.5})))
    orders = [(f"u{rnd.randrange(30):02d}".encode(),
               json.dumps({"c": f"c{rnd.randrange(45):02d}", "n": i}, separators=(",", ":")).encode())
              for i in range(1500)]
    return customers, orders


def _driver(topo, t, customers, orders, app, outputs):
    """The driver over the table, then the orders in timestamp order: (stores {name: sorted
    [(key, value)]}, {output topic: [(key, value, timestamp)]}, dead-letter records)."""
    raw = Serdes.bytes()
    with TopologyTestDriver(topo, application_id=app) as d:
        for i, (k, v) in enumerate(customers):
            d.pipe_raw(t["customers"], k, v, timestamp=T0 + i)
        for i, (k, v) in enumerate(orders):
            d.pipe_raw(t["orders"], k, v, timestamp=T0 + len(customers) + i)
        d.flush()
        stores: dict = {}
        for task in d.tasks:
            for spec in task.store_specs:
                if spec.name != "_bookkeeping":
                    stores.setdefault(spec.name, {}).update(task.stores.store(spec.name).items())
        outs = {o: [(r.key, r.value, r.timestamp) for r in d.read_output(o, raw, raw)] for o in outputs}
        dead = d.read_output(d.dlq_topic, raw, raw)
    return {n: sorted(v.items()) for n, v in stores.items()}, outs, dead


def _backfilled_stores(state_dir, app) -> dict:
    out: dict = {}
    for cfs in contract_column_families(state_dir, app).values():
        for cf, items in cfs.items():
            if cf != "_bookkeeping":   # per task (3 partitions here): not the one-task driver's
                out.setdefault(cf, {}).update(items)
    return {n: sorted(v.items()) for n, v in out.items()}


def _per_key(records) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


def _last_per_key(records) -> list:
    last = {r[0]: r for r in records}
    return [last[k] for k in sorted(last) if last[k][1] is not None]


@pytest.fixture(scope="module")
def registry():
    with SchemaRegistryServer() as server:
        yield server


@pytest.mark.integration
def test_backfill_of_a_registry_global_table_join_equals_the_driver(registry, kafka_bootstrap, spark, tmp_path,
                                                                    unique, report):
    t = {n: f"bgr-{n}-{unique}" for n in ("customers", "orders", "joined", "left", "last", "counts")}
    kafka.create_topics(kafka_bootstrap, {t["customers"]: 2, **{t[n]: 3 for n in t if n != "customers"}})
    ser = serializers(registry.url, t["customers"])   # upstream producers, over HTTP
    customers, orders = history(5, ser)
    subject = f"{t['customers']}-value"
    assert client_for({"url": registry.url}).get_versions(subject) == [1, 2]
    produce(kafka_bootstrap, t["customers"], customers, timestamp0=T0)
    produce(kafka_bootstrap, t["orders"], orders, timestamp0=T0 + len(customers))
    # this process's client holds both writer schemas: any fetch by id during the backfill is an
    # executor's
    ids = sorted({int.from_bytes(v[1:5], "big") for _, v in customers if v is not None})
    assert len(ids) == 2
    for sid in ids:
        client_for({"url": registry.url}).get_schema(sid, subject)
    seen = len(registry.requests)

    app = f"bgr-{unique}"
    config = build_client_config(registry_url=registry.url)   # as `--schema-registry-url URL`
    rep = backfill.run(topology(t, NOWHERE), bootstrap_servers=kafka_bootstrap, application_id=app,
                       state_dir=tmp_path, spark=spark, emit_outputs=True, client_config=config)
    during = registry.requests[seen:]
    assert rep.rows_read == len(orders) and rep.global_records == len(customers)
    assert {p for m, p in during if m == "GET" and p.startswith("/schemas/ids/")} == \
        {f"/schemas/ids/{sid}" for sid in ids}, during

    outputs = [t["joined"], t["left"], t["last"], t["counts"]]
    want_stores, want_out, dead = _driver(topology(t, registry.url), t, customers, orders, app, outputs)
    assert dead == []
    got_stores = _backfilled_stores(tmp_path, app)
    assert sorted(got_stores) == sorted(want_stores)
    assert {"by-region", "last-joined", "by-region.emitted", "last-joined.emitted"} <= set(want_stores)
    for name in want_stores:
        assert [k for k, _ in got_stores[name]] == [k for k, _ in want_stores[name]], name
        assert got_stores[name] == want_stores[name], name

    got_out = {o: [(m.key(), m.value(), m.timestamp()[1]) for m in kafka.read_topic(kafka_bootstrap, o)]
               for o in outputs}
    for o in (t["joined"], t["left"]):   # stream sinks: every record, in order per key
        assert len(got_out[o]) == len(want_out[o]), o
        assert _per_key(got_out[o]) == _per_key(want_out[o]), o
    for o in (t["last"], t["counts"]):   # aggregates' sinks: their final table
        assert sorted(got_out[o]) == _last_per_key(want_out[o]), o
    dlq = f"{app}-dlq"
    assert dlq not in kafka.topic_partitions(kafka_bootstrap) or kafka.read_topic(kafka_bootstrap, dlq) == []

    joined = [json.loads(v) for _, v, _ in want_out[t["joined"]]]
    left = [json.loads(v) for _, v, _ in want_out[t["left"]]]
    assert len(left) == len(orders) and 600 < len(joined) < len(orders)
    assert any(v["region"] is None for v in left)
    assert all(set(row) == {"n", "name", "region"} for row in joined)   # read into the reader schema (v1)
    report(f"{len(customers)} table records (v1 then v2, deletes), {len(orders)} orders: joined {len(joined)}, "
           f"left {len(left)}, stores {{{', '.join(f'{n}: {len(v)}' for n, v in sorted(got_stores.items()))}}}; "
           f"registry requests during the backfill: {len(during)}")
