"""Backfill end to end on a real local Spark and the real broker: history -> ``backfill.run`` ->
more records -> the worker continues. Differential: every non-``__`` column family of the
backfilled task databases equals, byte for byte, the stores the test driver builds from the same
history; after the hand-off the worker's stores and outputs equal the driver's over the whole
history, and a stream count per key proves no record was processed twice or skipped."""

import json
import random

import pytest

import backfill
from processor import StreamsBuilder
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import produce

PARTS = 3


def make_topology(orders="bf-orders", clicks="bf-clicks", shipments="bf-shipments", reuse_source_topics=False):
    b = StreamsBuilder()
    o = b.table(orders, store_name="orders")
    big = o.filter(lambda k, v: v["amount"] > 50).map_values(lambda v: {"a": v["amount"]})
    big.to_stream().to(f"{orders}-big")
    s = b.table(shipments, store_name="shipments")
    (o.join(s, lambda a, sh: {"amount": a["amount"], "ship": sh["s"]}, name="order-shipment")
     .to_stream().to(f"{orders}-joined"))
    counts = b.stream(clicks).group_by_key().count(name="clicks-per-user")
    counts.to_stream().to(f"{clicks}-counts")
    return b.build(reuse_source_topics=reuse_source_topics)


def history(n, seed, t0=1_000_000):
    rnd = random.Random(seed)
    recs = []
    for i in range(n):
        r = rnd.random()
        if r < 0.45:
            v = None if rnd.random() < 0.1 else json.dumps({"amount": rnd.randrange(100)}).encode()
            recs.append(("orders", f"o{rnd.randrange(150)}".encode(), v))
        elif r < 0.65:
            recs.append(("shipments", f"o{rnd.randrange(150)}".encode(), json.dumps({"s": i}).encode()))
        else:
            recs.append(("clicks", f"u{rnd.randrange(40)}".encode(), json.dumps({"i": i}).encode()))
    return recs


def _produce_all(bootstrap, topics, recs, t0):
    for kind in ("orders", "shipments", "clicks"):
        sel = [(k, v) for i, (t, k, v) in enumerate(recs) if t == kind]
        ts = [t0 + i for i, (t, _, _) in enumerate(recs) if t == kind]
        produce(bootstrap, topics[kind], sel, timestamps=ts)


def _driver_stores(topology, topics, recs, t0):
    with TopologyTestDriver(topology, application_id="drv") as d:
        for i, (kind, k, v) in enumerate(recs):
            d.pipe_raw(topics[kind], k, v, timestamp=t0 + i)
        d.flush()
        out = {}
        for name in topology.stores:
            owners = [t for t in d.tasks if any(s.name == name for s in t.store_specs)]
            out[name] = dict(sorted((k, v) for t in owners for k, v in t.stores.store(name).items()))
        return out


def _state_stores(state_dir, app, names):
    out = {n: {} for n in names}
    for task_dir in sorted((state_dir / app).glob("task-*")):
        db = RocksDBDatabase(task_dir)
        try:
            for n in names:
                if n in db.column_families():
                    out[n].update(db.store(n).items())
        finally:
            db.close()
    return {n: dict(sorted(v.items())) for n, v in out.items()}


@pytest.mark.integration
def test_backfill_then_worker_continues_at_the_snapshot(kafka_bootstrap, spark, tmp_path, unique, report):
    topics = {"orders": f"bf-orders-{unique}", "shipments": f"bf-ship-{unique}", "clicks": f"bf-clicks-{unique}"}
    topo = make_topology(topics["orders"], topics["clicks"], topics["shipments"])
    outs = topo.sink_topics(internal=False)
    kafka.create_topics(kafka_bootstrap, {**{t: PARTS for t in topics.values()}, **{t: PARTS for t in outs}})
    app = f"bf-app-{unique}"
    t0 = 1_000_000
    first = history(3000, seed=11)
    _produce_all(kafka_bootstrap, topics, first, t0)

    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app,
                       state_dir=tmp_path, spark=spark)
    for line in rep.lines():
        report(line)
    assert rep.rows_read == len(first)
    assert sum(e for (_, _), (_, e) in rep.snapshot.items()) == len(first)
    assert rep.tasks == 2 * PARTS   # sub-topology 0 (orders + shipments), 1 (clicks)

    # differential: every contract column family equals the driver's stores after the same history
    expected = _driver_stores(topo, topics, first, t0)
    got = _state_stores(tmp_path, app, list(topo.stores))
    for name in topo.stores:
        assert not name.startswith("__")
        assert list(got[name].items()) == list(expected[name].items()), name
    assert len(got["clicks-per-user"]) == 40 and len(got["orders"]) > 100

    # a second backfill over the same state is refused (exit 2), nothing touched
    with pytest.raises(ConfigError) as err:
        backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path, spark=spark)
    assert err.value.exit_code == 2 and "already holds state" in str(err.value)

    # hand-off: more records, then the worker runs from the snapshot
    second = history(1500, seed=12)
    _produce_all(kafka_bootstrap, topics, second, t0 + len(first))
    w = Worker(topo, kafka_bootstrap, app, tmp_path, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == len(second)            # nothing below the snapshot again
    everything = first + second
    expected = _driver_stores(topo, topics, everything, t0)
    got = _state_stores(tmp_path, app, list(topo.stores))
    for name in topo.stores:
        assert list(got[name].items()) == list(expected[name].items()), name
    # the stream count per user equals the number of clicks: no gap, no duplicate at the hand-off
    n_clicks = {}
    for kind, k, _ in everything:
        if kind == "clicks":
            n_clicks[k] = n_clicks.get(k, 0) + 1
    counted = {k: json.loads(v[8:]) for k, v in got["clicks-per-user"].items()}
    assert counted == n_clicks
    # without --emit-outputs the backfill wrote no output: the sinks hold only the worker's records
    sink = kafka.read_topic(kafka_bootstrap, f"{topics['clicks']}-counts")
    assert len(sink) == len([1 for kind, _, _ in second if kind == "clicks"])
    assert sorted(json.loads(m.value()) for m in sink)[-1] == max(n_clicks.values())
    report(f"hand-off: worker processed {w.records_processed} records after the snapshot")


@pytest.mark.integration
def test_backfill_refuses_missing_topics_and_archives(kafka_bootstrap, spark, tmp_path, unique):
    with pytest.raises(ConfigError) as err:
        backfill.run(make_topology(f"nope-{unique}", f"nope2-{unique}", f"nope3-{unique}"),
                     bootstrap_servers=kafka_bootstrap, application_id=f"a-{unique}", state_dir=tmp_path, spark=spark)
    assert f"nope-{unique}" in str(err.value) and err.value.exit_code == 2
    topics = [f"ok-{unique}", f"ok2-{unique}", f"ok3-{unique}"]
    kafka.create_topics(kafka_bootstrap, {t: 1 for t in topics})
    with pytest.raises(ConfigError) as err:
        backfill.run(make_topology(*topics), bootstrap_servers=kafka_bootstrap, application_id=f"a-{unique}",
                     state_dir=tmp_path, spark=spark, archives={topics[0]: str(tmp_path / "no-such-archive")})
    assert "no-such-archive" in str(err.value) and err.value.exit_code == 2
    assert not any(tmp_path.iterdir())
