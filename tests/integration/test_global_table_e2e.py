"""Global tables (issue 29) on a real broker.

- A ``Worker`` bootstraps the whole global table (2 partitions) before it processes any order
  (3 partitions, partitioned unlike the table: no co-partitioning needed), so every order joins
  the table at its topic's end, exactly as the test driver fed the table first; restarted after
  more table updates and orders, it reads only what came since (its checkpoint) and the new
  orders join the updated rows.
- ``GlobalTables.poll`` keeps the store current while running: updates produced after the
  bootstrap are applied, and its checkpoint survives a reopen."""

import json
import random
import time
from collections import defaultdict

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.global_tables import GlobalTables
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, produce


def topology_for(t):
    b = StreamsBuilder()
    products = b.global_table(t["products"], name="products")
    b.stream(t["orders"]).left_join(products, lambda o, p: {"qty": o["qty"], "price": p and p["price"]},
                                    key_selector=lambda k, o: o["product"]).to(t["out"])
    return b.build()


def _js(v):
    return json.dumps(v).encode()


def _batch(rnd, n_products, n_orders, base):
    products = [(f"p{rnd.randrange(40):02d}".encode(), _js({"price": rnd.randrange(1000)}))
                for _ in range(n_products)]
    orders = [(f"o{base + i:05d}".encode(), _js({"product": f"p{rnd.randrange(45):02d}", "qty": rnd.randrange(9)}))
              for i in range(n_orders)]
    return products, orders


def test_global_table_join_on_the_broker_equals_the_driver_across_a_restart(kafka_bootstrap, unique, tmp_path):
    t = {n: f"gt-{n}-{unique}" for n in ("products", "orders", "out")}
    kafka.create_topics(kafka_bootstrap, {t["products"]: 2, t["orders"]: 3, t["out"]: 3})
    rnd = random.Random(17)
    app = f"gt-{unique}"
    want: dict = defaultdict(list)
    table_so_far = []
    for phase in range(2):
        products, orders = _batch(rnd, 300, 1500, phase * 1500)
        produce(kafka_bootstrap, t["products"], products, timestamp0=1_000_000 + phase * 10_000)
        table_so_far += products
        produce(kafka_bootstrap, t["orders"], orders, timestamp0=2_000_000 + phase * 10_000)
        w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
                   consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        # the driver: the table as the worker bootstrapped it, then this phase's orders per partition
        all_orders = [m for m in kafka.read_topic(kafka_bootstrap, t["orders"])
                      if m.key().decode() >= f"o{phase * 1500:05d}"]
        for part in range(3):
            with TopologyTestDriver(topology_for(t), application_id=app) as d:
                for i, (k, v) in enumerate(table_so_far):
                    d.pipe_raw(t["products"], k, v, timestamp=i)
                for m in (m for m in all_orders if m.partition() == part):
                    d.pipe_raw(t["orders"], m.key(), m.value(), m.timestamp()[1])
                for r in d.read_output(t["out"], Serdes.bytes(), Serdes.bytes()):
                    want[r.key].append((r.value, r.timestamp))
    got = by_key(kafka.read_topic(kafka_bootstrap, t["out"]))
    assert got == dict(want)
    assert len(got) == 3000
    prices = [json.loads(v)["price"] for seq in got.values() for v, _ in seq]
    assert sum(p is None for p in prices) > 50 and sum(p is not None for p in prices) > 2000


def test_global_tables_poll_keeps_the_store_current_and_checkpoints(kafka_bootstrap, unique, tmp_path):
    t = {n: f"gtp-{n}-{unique}" for n in ("products", "orders", "out")}
    kafka.create_topics(kafka_bootstrap, {t["products"]: 2, t["orders"]: 1, t["out"]: 1})
    produce(kafka_bootstrap, t["products"], [(b"p1", _js({"price": 1})), (b"p2", _js({"price": 2}))])
    topo = topology_for(t).for_application("gtp")
    g = GlobalTables(topo, kafka_bootstrap, {}, tmp_path / "global")
    try:
        g.bootstrap()
        store = g.stores["products"]
        assert sorted(k for k, _ in store.items()) == [b"p1", b"p2"]
        produce(kafka_bootstrap, t["products"], [(b"p1", _js({"price": 10})), (b"p3", _js({"price": 3})),
                                                 (b"p2", None)])
        deadline = time.monotonic() + 30
        while g.records_applied < 5 and time.monotonic() < deadline:
            g.poll()
            time.sleep(0.05)
        assert g.records_applied == 5
        assert {k: json.loads(v[8:]) for k, v in store.items()} == {b"p1": {"price": 10}, b"p3": {"price": 3}}
        g.commit()
    finally:
        g.close()
    again = GlobalTables(topo, kafka_bootstrap, {}, tmp_path / "global")
    try:
        again.bootstrap()
        assert again.records_applied == 0   # nothing new since the checkpoint
        assert sorted(k for k, _ in again.stores["products"].items()) == [b"p1", b"p3"]
    finally:
        again.close()


def test_a_global_store_is_queryable_while_running_and_dumped_after(kafka_bootstrap, unique, tmp_path):
    """Kafka Streams lets a global store be queried; here ``worker.store(name)`` (and so
    ``/stores``) answers any key from the global table every worker holds, and ``processor state
    dump`` prints its entries as task ``global``."""
    import io
    import threading

    from processor.runtime import state_inspect

    t = {n: f"gtq-{n}-{unique}" for n in ("products", "orders", "out")}
    kafka.create_topics(kafka_bootstrap, {t["products"]: 2, t["orders"]: 1, t["out"]: 1})
    produce(kafka_bootstrap, t["products"], [(f"p{i}".encode(), _js({"price": i})) for i in range(6)] +
            [(b"p2", None), (b"p3", _js({"price": 33}))], timestamp0=5000)
    app = f"gtq-{unique}"
    topo = topology_for(t)
    w = Worker(topo, kafka_bootstrap, app, tmp_path, commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
    th = threading.Thread(target=w.run, kwargs={"install_signal_handlers": False}, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 60
        while not w.ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.ready()
        view = w.store("products")
        assert [view.get(f"p{i}") for i in range(7)] == [{"price": 0}, {"price": 1}, None, {"price": 33},
                                                          {"price": 4}, {"price": 5}, None]
        assert view.entry("p3") == {"key": "p3", "value": {"price": 33}, "timestamp": 5007, "partition": None,
                                    "task": "global"}
        assert [e["key"] for e in view.prefix("p")] == ["p0", "p1", "p3", "p4", "p5"]
    finally:
        w.stop()
        th.join(60)
    assert not th.is_alive()
    out = io.StringIO()
    assert state_inspect.dump(topo, app, tmp_path, store="products", out=out) == 5
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["task"], x["store"], x["key"], x["value"]) for x in lines] == [
        ("global", "products", f"p{i}", {"price": 33 if i == 3 else i}) for i in (0, 1, 3, 4, 5)]
