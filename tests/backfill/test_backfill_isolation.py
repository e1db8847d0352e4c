"""The backfill reads history at the isolation level of the worker that continues (as the worker
does: ``read_committed`` under ``exactly_once``, ``read_uncommitted`` otherwise, a consumer-config
``isolation.level`` over both). Under ``exactly_once`` its snapshot ends below an open transaction
and the worker processes that transaction's records once it commits; at least once they are in
the snapshot. Differential: the exactly-once backfill plus the worker's hand-off ends with the
same stores, byte for byte, as the at-least-once backfill that read everything at once, and both
equal the test driver's."""

import pytest
from confluent_kafka import Producer

import backfill
from processor import StreamsBuilder
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.testing import TopologyTestDriver
from tests.backfill.test_backfill_handoff import _state_stores
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import produce


def _topology(topic):
    b = StreamsBuilder()
    b.stream(topic).group_by_key().count(name="counts").to_stream().to(f"{topic}-counts")
    return b.build()


def _driver_counts(topo, topic, recs):
    with TopologyTestDriver(topo, application_id="drv") as d:
        for k, v, ts in recs:
            d.pipe_raw(topic, k, v, timestamp=ts)
        d.flush()
        return dict(sorted(kv for t in d.tasks if any(s.name == "counts" for s in t.store_specs)
                           for kv in t.stores.store("counts").items()))


@pytest.mark.integration
def test_exactly_once_backfill_stops_below_an_open_transaction(kafka_bootstrap, spark, tmp_path, unique, report):
    topic = f"iso-{unique}"
    kafka.create_topics(kafka_bootstrap, {topic: 1, f"{topic}-counts": 1})
    topo = _topology(topic)
    before = [(f"u{i % 3}".encode(), b'{"i": %d}' % i, 1_000_000 + i) for i in range(6)]
    opened = [(b"u0", b'{"i": 100}', 2_000_000), (b"u1", b'{"i": 101}', 2_000_001), (b"u9", b'{"i": 102}', 2_000_002)]
    after = [(b"u1", b'{"i": 200}', 3_000_000), (b"u2", b'{"i": 201}', 3_000_001)]
    produce(kafka_bootstrap, topic, [(k, v) for k, v, _ in before], timestamps=[t for *_, t in before])
    # (open across three backfills: a timeout well above what they take on a loaded machine)
    tx = Producer({**kafka.producer_defaults(kafka_bootstrap), "transactional.id": f"iso-tx-{unique}",
                   "transaction.timeout.ms": 300000})
    tx.init_transactions()
    tx.begin_transaction()
    for k, v, ts in opened:
        tx.produce(topic, v, k, partition=0, timestamp=ts)
    tx.flush()
    produce(kafka_bootstrap, topic, [(k, v) for k, v, _ in after], timestamps=[t for *_, t in after])
    runs = {}
    try:
        for name, kwargs in (("exactly_once", {"processing_guarantee": "exactly_once"}),
                             ("at_least_once", {}),
                             ("exactly_once, read_uncommitted given",
                              {"processing_guarantee": "exactly_once",
                               "consumer_config": {"isolation.level": "read_uncommitted"}})):
            app = f"iso-{len(runs)}-{unique}"
            runs[name] = (app, backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app,
                                            state_dir=tmp_path / app, spark=spark, **kwargs))
        with pytest.raises(ConfigError, match="processing_guarantee must be one of"):
            backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=f"iso-x-{unique}",
                         state_dir=tmp_path / "x", spark=spark, processing_guarantee="exactly-once")
    finally:
        tx.commit_transaction()
    for name, (_app, rep) in runs.items():
        report(f"{name}: snapshot {rep.snapshot}, {rep.rows_read} rows read")
    eos_app, eos = runs["exactly_once"]
    # the open transaction starts at offset 6: a read_committed reader's view ends there
    assert (eos.snapshot, eos.rows_read) == ({(topic, 0): (0, 6)}, 6)
    for name in ("at_least_once", "exactly_once, read_uncommitted given"):
        assert (runs[name][1].snapshot, runs[name][1].rows_read) == ({(topic, 0): (0, 11)}, 11), name

    def stores(app):
        return _state_stores(tmp_path / app, app, ["counts"])["counts"]

    everything = before + opened + after     # offset order
    assert list(stores(eos_app).items()) == list(_driver_counts(topo, topic, before).items())
    alo_counts = stores(runs["at_least_once"][0])
    assert list(alo_counts.items()) == list(_driver_counts(topo, topic, everything).items())

    # hand-off: the worker continues at the exactly-once snapshot and processes the rest, once
    w = Worker(topo, kafka_bootstrap, eos_app, tmp_path / eos_app, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == len(opened) + len(after)
    assert list(stores(eos_app).items()) == list(alo_counts.items())
    report(f"hand-off: the worker processed {w.records_processed} records after the exactly-once snapshot; "
           f"its {len(alo_counts)} counts equal the at-least-once backfill's byte for byte")
