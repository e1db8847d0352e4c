"""A global table with a Schema Registry Avro value serde, joined from a stream (issue 34, item
6), on a real broker: the topology of ``tests/unit/test_global_table_registry.py`` run by a
``Worker`` in two phases (table rows written by upstream producers on v1 and a compatible v2 of
the schema, then orders on 3 partitions), restarted between them.

- Outputs: per key, exactly the test driver's sequence (the table fed first, as the worker
  bootstraps it to its end before processing; then each partition's orders).
- The global store: byte for byte the driver's.
The registry is the client library's in-memory one (``mock://``): the worker runs in this
process (as ``tests/integration/test_schema_registry.py``)."""

import json
import random
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Producer

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, produce
from tests.unit.test_global_table_registry import CUSTOMER_V1, CUSTOMER_V2, registry_global_join, serializers


def _customers(rnd, ser, n):
    out = []
    for _ in range(n):
        c = f"c{rnd.randrange(45):02d}"
        if rnd.random() < 0.08:
            out.append((c.encode(), None))
        else:
            row = {"id": c, "name": f"n{rnd.randrange(50)}", "region": rnd.choice(["EU", "US"])}
            out.append((c.encode(), ser(CUSTOMER_V2, {**row, "vip": True}) if rnd.random() < 0.5
                        else ser(CUSTOMER_V1, row)))
    return out


def test_a_registry_global_table_join_on_the_broker_equals_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"gtr-{n}-{unique}" for n in ("customers", "orders", "joined", "left")}
    registry = f"mock://gtr-{unique}"
    kafka.create_topics(kafka_bootstrap, {t["customers"]: 2, t["orders"]: 3, t["joined"]: 3, t["left"]: 3})
    ser = serializers(registry, t["customers"])
    rnd = random.Random(6)
    app = f"gtr-{unique}"
    want: dict = {o: defaultdict(list) for o in ("joined", "left")}
    table_so_far = []
    for phase in range(2):
        customers = _customers(rnd, ser, 150)
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        for k, v in customers:
            p.produce(t["customers"], key=k, value=v, timestamp=1_000_000 + phase * 10_000)
        assert p.flush(30) == 0
        table_so_far += [(k, v, 1_000_000 + phase * 10_000) for k, v in customers]
        orders = [(f"o{phase}-{i:04d}".encode(), json.dumps({"c": f"c{rnd.randrange(50):02d}", "n": i}).encode())
                  for i in range(600)]
        produce(kafka_bootstrap, t["orders"], orders, timestamp0=2_000_000 + phase * 10_000)
        w = Worker(registry_global_join(t, registry), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
                   consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        assert w.records_processed == 600
        msgs = [m for m in kafka.read_topic(kafka_bootstrap, t["orders"]) if m.key().startswith(f"o{phase}-".encode())]
        for part in range(3):
            with TopologyTestDriver(registry_global_join(t, registry), application_id=app) as d:
                for k, v, ts in table_so_far:
                    d.pipe_raw(t["customers"], k, v, timestamp=ts)
                for m in (m for m in msgs if m.partition() == part):
                    d.pipe_raw(t["orders"], m.key(), m.value(), m.timestamp()[1])
                for o in want:
                    for r in d.read_output(t[o], Serdes.bytes(), Serdes.bytes()):
                        want[o][r.key].append((r.value, r.timestamp))
                driver_store = dict(d.global_stores["customers"].items())
                assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []
    for o in want:
        assert by_key(kafka.read_topic(kafka_bootstrap, t[o])) == want[o], o
    db = RocksDBDatabase(Path(tmp_path) / app / "global")
    try:
        got_store = dict(db.store("customers").items())
    finally:
        db.close()
    assert got_store == driver_store and len(got_store) > 30
    joined = [json.loads(v) for seq in want["joined"].values() for v, _ in seq]
    left = [json.loads(v) for seq in want["left"].values() for v, _ in seq]
    assert len(left) == 1200 and 600 < len(joined) < 1200
